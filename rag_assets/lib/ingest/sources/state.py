"""The sources' state (issue 41): when each source was last observed well, since when it is
stale and why, and a Git source's last commit. Read by ``status`` without the extractors'
imports.

It lives where the index's other artefacts do (issue 42): ``<RAG_WORK_DIR>/sources/state.json``
for a local index, ``<index>/_rag_work/sources/state.json`` in the bucket for an object-store
one, so a run on another machine, or on an emptied working folder, carries it on. What the
sources keep on a machine's disk besides (a Git clone, a website's fetched pages, the run's
listing) is a cache: without it a run fetches again and publishes the same table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

STATE_FILE = "sources/state.json"


class Keep(Protocol):
    """Where the state is kept: ``rag_assets.lib.index.artefacts.Artefacts`` (the index's
    artefacts, local or in the bucket) or :class:`Folder`."""

    def read(self, name: str) -> bytes | None: ...

    def write(self, name: str, data: bytes) -> str: ...


class Folder:
    """The state in a local folder (a notebook's, the benchmarks')."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def read(self, name: str) -> bytes | None:
        try:
            return (self.folder / name).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> str:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return str(path)


def keep_of(where: Keep | str | Path) -> Keep:
    """``where`` as a :class:`Keep` (a folder's path becomes a :class:`Folder`)."""
    return Folder(where) if isinstance(where, (str, Path)) else where


def load_state(where: Keep | str | Path) -> dict[str, dict[str, Any]]:
    """Each source's entry; empty when there is none or it cannot be read (a source is then
    listed in full, as on its first run)."""
    try:
        data = keep_of(where).read(STATE_FILE)
        return {} if data is None else dict(json.loads(data))
    except (OSError, ValueError):
        return {}


def save_state(
    where: Keep | str | Path, state: dict[str, dict[str, Any]], names: Sequence[str]
) -> None:
    kept = {n: state[n] for n in names if n in state}
    keep_of(where).write(STATE_FILE, json.dumps(kept, indent=1, sort_keys=True).encode())


def source_lines(where: Keep | str | Path) -> list[str]:
    """What ``status`` shows per source: ok since when, or stale since when and why."""
    out = []
    for name, e in sorted(load_state(where).items()):
        shown = f"{e.get('kind', '?')} {e.get('location', '')}"
        if e.get("stale_since"):
            out.append(f"source {name} ({shown}): STALE since {e['stale_since']} (last good "
                       f"{e.get('last_good') or 'never'}): {e.get('error', '')}")  # fmt: skip
        else:
            extra = f", commit {e['commit'][:12]}" if e.get("commit") else ""
            held = (f", {e['withheld']} deletions withheld: confirm with "
                    f"RAG_SOURCE_CONFIRM_DELETE={name} rag-assets index"
                    if e.get("withheld") else "")  # fmt: skip
            out.append(
                f"source {name} ({shown}): ok, last observed {e.get('last_good', '?')}{extra}{held}"
            )
    return out
