"""The pointer queries follow (:class:`Published`), a history record, the pointer files' I/O."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rag_assets.lib.index.store.schema import _why
from rag_assets.lib.index.versioning import Stamps

FILE_MODE = 0o666  # pointer/manifest files: this, less the umask (like LanceDB's own files)


class PointerDamaged(RuntimeError):
    """``published.json`` / ``staging.json`` cannot be read and nothing valid replaces it."""


@dataclass(frozen=True)
class Published:
    """The pointer queries follow."""

    table: str
    version: int
    documents_version: int
    stamps: Stamps
    threshold: float | None
    threshold_policy: str | None
    rows: int
    published_at: str
    # issue 11: was the table evaluated against a question set that belongs to its corpus?
    evaluation: str = "evaluated"  # "evaluated" | "unevaluated" (no matching question set)
    evaluation_note: str = ""  # why unevaluated, or the gate's figure when evaluated
    threshold_source: str = ""  # calibrated | unrelated-only | default | override
    # issue 19: which questions evaluated it (hand-written | reviewed | generated (model …) |
    # unrelated-only | unevaluated) and their counts (questions, queries, near, unrelated)
    evaluation_source: str = ""
    evaluation_counts: dict[str, int] = field(default_factory=dict)
    # issue 34: what this table version changed against the one before it in its table:
    # "content" | "metadata" (only documents' metadata: nothing embedded) | "none" | "" (unknown)
    change: str = ""
    # issue 30: what the cut cannot bound (a folder too uniform for a model-free cut), and what
    # to do; "" when nothing is wrong
    threshold_warning: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["stamps"] = self.stamps.as_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Published:
        """Parse a pointer; unknown keys (history's ``action``/``at``) are ignored. Raises
        ValueError/KeyError/TypeError for a damaged one."""
        if not isinstance(d, dict):
            raise TypeError(f"expected a JSON object, found {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        d["stamps"] = Stamps.from_dict(d["stamps"])
        for key in ("table", "published_at"):
            if not isinstance(d[key], str) or not d[key]:
                raise ValueError(f"{key!r} is not a non-empty string")
        for key in ("version", "documents_version", "rows"):
            if not isinstance(d[key], int) or isinstance(d[key], bool):
                raise ValueError(f"{key!r} is not an integer")
        return cls(**d)

    @property
    def key(self) -> str:
        """``table@version``: what identifies a published version (and ``rollback --to``)."""
        return f"{self.table}@{self.version}"


@dataclass(frozen=True)
class HistoryRecord:
    """One line of ``published-history.jsonl``: a publish or a rollback, and when."""

    action: str  # "publish" | "rollback" (lines written before actions were logged: publish)
    entry: Published
    at: str
    line: int  # 1-based line number in the history file


def index_versions(records: list[HistoryRecord]) -> dict[str, int]:
    """Issue 39: the index's own version of each published ``table@version`` key, counted the
    way a user counts (the first publish is version 1, the next 2, ...), from the history,
    oldest first. A rollback, or a publish of a key already counted, makes no new version.
    (``Published.version`` is LanceDB's version of the table: one per commit, 6 on a new one.)"""
    out: dict[str, int] = {}
    for r in records:
        if r.action != "rollback" and r.entry.key not in out:
            out[r.entry.key] = len(out) + 1
    return out


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file in the same folder (mode :data:`FILE_MODE` less the umask,
    not ``mkstemp``'s owner-only 0600), fsync it, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_dir(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` at ``out``: the old one is renamed aside, the new one
    renamed in, the old one removed. A crash leaves the old folder, the new one, or (only
    between the two renames) none; never a partial one."""
    old = out.parent / f".{out.name}.old-{secrets.token_hex(8)}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _read_pointer(path: Path) -> Published:
    """Parse a pointer file; :class:`PointerDamaged` names the file and what is wrong."""
    raw = path.read_bytes()
    try:
        return Published.from_dict(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        size = f"{len(raw)} bytes" if raw else "empty"
        raise PointerDamaged(f"{path} is damaged ({size}: {_why(exc)})") from None
