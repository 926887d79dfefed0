"""The original bytes of a source's document (issue 49), for the service's view of a PDF.

A document read from a folder has its file; one read from a Git repository or a bucket has
none on this machine, and its link may open nothing here (a local repository, an unknown Git
host, a private object). :func:`read_original` reads it again where the index's run read it:
a Git file at the commit it was indexed at, from the source's cache in the working folder
(``<RAG_WORK_DIR>/sources/<name>/repo.git``, no network); an object from its bucket, with the
object store's own variables (as the run read it). The caller has checked that the caller may
see the document.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag_assets.lib.ingest.sources import Item, SourceError

GIT_TIMEOUT_S = 30.0
"""Longest a ``git cat-file`` of one file may take."""


def read_original(
    document_id: str, doc: Mapping[str, Any], work_dir: str | Path, env: Mapping[str, str] | None
) -> bytes | None:
    """The bytes of ``doc`` (a published document's record) as its source holds them, or None
    (not a Git or bucket document, its cache or object gone, the store refusing)."""
    try:
        meta = json.loads(doc.get("metadata_json") or "{}")
    except ValueError:
        meta = {}
    source = (meta.get("source") or [""])[0]
    commit = (meta.get("commit") or [""])[0]
    key = document_id.partition("/")[2]
    if source and commit and key:
        from rag_assets.lib.ingest.sources.git import REPO_DIR

        return _git_file(Path(work_dir) / "sources" / source / REPO_DIR, commit, key)
    from rag_assets.lib.ingest.sources.objects import view_object

    found = view_object(str(doc.get("path") or ""), dict(env) if env is not None else None)
    if found is None:
        return None
    try:
        return found[0].read(Item(found[1], ""))
    except SourceError:
        return None


def _git_file(cache: Path, commit: str, key: str) -> bytes | None:
    if not (cache / "HEAD").is_file() or commit.startswith("-"):
        return None
    from rag_assets.lib.ingest.sources.git import _ENV

    env = {**os.environ, **_ENV}
    try:
        proc = subprocess.run(
            ["git", "--git-dir", str(cache), "cat-file", "blob", f"{commit}:{key}"],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bytes(proc.stdout) if proc.returncode == 0 else None
