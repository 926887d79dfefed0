"""``rag-assets bench --first-answer``: how long a new index makes its users wait (issue 51).

For each folder (by default the one given, and its first 20 files), a fresh ``rag-assets index``
process on a fresh index, as a user runs it: the time from its start to the first publish (the
line "you can ask now" when adapting the encoder follows it, else the end of the command) and
to its end, when the adapted model's table is published (``adapted_publish_s``; None when no
adapted table was published, the summary's "adapted encoder:" line saying why).
Nothing is shared between cases: each has its own index, working folder and Dagster instance,
under a temporary folder removed afterwards. The environment is the caller's (``RAG_ADAPT``,
``RAG_ADAPT_STEPS``, ``RAG_DEVICE`` … apply), less ``RAG_INDEX_URI``, ``RAG_WORK_DIR``,
``RAG_DOCUMENTS_DIR`` and ``DAGSTER_HOME``, which each case sets.

Absolute seconds move with the machine's load: run it on a quiet machine, and compare the two
times of one case with each other (docs/measurements.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ASK_NOW = "you can ask now"
DEFAULT_FILES = 20
"""The small case: the first 20 files (by name) of the folder, as a team's first try would be."""


def run_first_answer_bench(
    documents: Path, files: list[int] | None = None, *, timeout_s: float = 7200.0
) -> tuple[dict[str, Any], str]:
    """Time ``rag-assets index`` on ``documents`` and on its first N files for each N of
    ``files`` (default 20); returns (JSON, text)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="rag-first-answer-") as tmp:
        for i, (label, subset) in enumerate(cases(documents, files)):
            root = Path(tmp) / f"case{i}"
            folder = documents if subset is None else _copy(documents, subset, root / "documents")
            row = time_index(folder, root, timeout_s=timeout_s)
            rows.append({"case": label, "files": _count(documents, subset), **row})
    out = {"bench": "first-answer", "rows": rows}
    return out, _text(rows)


def cases(documents: Path, files: list[int] | None = None) -> list[tuple[str, list[Path] | None]]:
    """(label, files relative to ``documents``, or None for the whole folder) of each case: the
    folder, then its first N files by name for each N of ``files`` (default 20) under its size."""
    all_files = _files(documents)
    counts = files if files is not None else [DEFAULT_FILES]
    n_all = len(all_files)
    out: list[tuple[str, list[Path] | None]] = [(f"{documents} (all {n_all} files)", None)]
    out += [(f"{documents} (first {n} files)", all_files[:n]) for n in counts if n < n_all]
    return out


def _files(documents: Path) -> list[Path]:
    from rag_assets.lib.ingest.extract import list_files

    return [Path(doc_id) for doc_id, _ in list_files(documents)]  # relative, by id


def _count(documents: Path, subset: list[Path] | None) -> int:
    return len(subset) if subset is not None else len(_files(documents))


def _copy(documents: Path, subset: list[Path], dest: Path) -> Path:
    for rel in subset:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(documents / rel, dest / rel)
    return dest


def time_index(folder: Path, root: Path, *, timeout_s: float = 7200.0) -> dict[str, Any]:
    """One fresh ``rag-assets index`` of ``folder`` into ``root/index``: seconds to the first
    publish and to the end, the exit status, the index's versions and what the summary says of
    the adapted encoder."""
    env = {k: v for k, v in os.environ.items() if k not in _CASE_VARS}
    env |= {"RAG_INDEX_URI": str(root / "index"), "RAG_DOCUMENTS_DIR": str(folder)}
    root.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_assets.cli", "index"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first: list[float] = []
    err_lines: list[str] = []

    def follow() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line.rstrip("\n"))
            if ASK_NOW in line and not first:
                first.append(time.monotonic() - start)

    reader = threading.Thread(target=follow, daemon=True)  # stderr, line by line, as it comes
    reader.start()
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        out = proc.stdout.read()  # the summary, at the end
        proc.wait()
    finally:
        timer.cancel()
    end = time.monotonic() - start
    reader.join(timeout=10)
    published = [int(v) for v in re.findall(r"^published: \S+ version (\d+)", out, re.M)]
    adapted = _adapted_blocks(out)
    trained = bool(first) and max(published, default=0) > 1  # the adapted table: version 2
    return {
        "exit": proc.returncode,
        "first_publish_s": round(first[0] if first else end, 1),
        "adapted_publish_s": round(end, 1) if trained else None,
        "end_s": round(end, 1),
        "versions": published,
        "adapted_encoder": adapted[-1] if adapted else "",
        "error": "" if proc.returncode == 0 else (err_lines[-1] if err_lines else out[-300:]),
    }


def _adapted_blocks(out: str) -> list[str]:
    """Each "adapted encoder:" block of the summary, its indented lines (the model, its status
    and why) joined to it: the last one is what became of the adapted encoder."""
    blocks: list[str] = []
    inside = False
    for line in out.splitlines():
        if line.startswith("adapted encoder:"):
            blocks.append(line.strip())
            inside = True
        elif inside and line.startswith("  ") and line.strip():
            blocks[-1] += "; " + line.strip()
        else:
            inside = False
    return blocks


_CASE_VARS = ("RAG_INDEX_URI", "RAG_WORK_DIR", "RAG_DOCUMENTS_DIR", "DAGSTER_HOME")


def _text(rows: list[dict[str, Any]]) -> str:
    lines = ["first answer: a fresh `rag-assets index` per case (seconds from its start)"]
    for r in rows:
        adapted = (
            f"adapted publish {r['adapted_publish_s']:.1f} s"
            if r["adapted_publish_s"] is not None
            else f"no adapted table (end {r['end_s']:.1f} s)"
        )
        lines.append(
            f"  {r['case']}: first publish {r['first_publish_s']:.1f} s, {adapted}; "
            f"exit {r['exit']}, versions {r['versions'] or '-'}"
        )
        if r["adapted_encoder"]:
            lines.append(f"    {r['adapted_encoder']}")
        if r["error"]:
            lines.append(f"    error: {r['error']}")
    return "\n".join(lines)
