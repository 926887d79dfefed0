"""Document metadata (issue 34): what the file system says and what the owner writes.

Every document carries ``metadata``: a mapping from a key to a list of string values (one value
for a scalar, several for a list), built from three sources, later ones winning per key:

1. **File-system facts** (:data:`SYSTEM_KEYS`, always present, never set by an owner):
   ``document`` (the document id), ``folder`` (every folder the document is in, outermost
   first: ``hr`` and ``hr/policies`` for ``hr/policies/leave.md``; none at the top), ``format``
   (the extractor's kind: ``markdown``, ``pdf``, ...), ``size`` (bytes) and ``modified`` (the
   file's modification time, ISO 8601 UTC to the second), plus ``title`` (the extracted title).
2. **``.ragmeta`` files** in any folder of the documents tree (a folder's, a Git commit's, a
   bucket prefix's: :func:`rules_from`, issue 49). Each line is ``PATTERN key=value
   [key=value ...]``: ``PATTERN`` is gitignore-style (:mod:`.select`'s rules), relative to the
   folder holding the ``.ragmeta``; a value with several items separates them with commas
   (``hr/** access=hr,legal``); ``key=`` gives the key no values; ``#`` starts a comment;
   words are split as a shell splits them, so ``title="Leave policy"`` may hold spaces. Per key,
   the deepest ``.ragmeta`` with a matching line wins, and within one file the last matching
   line.
3. **Markdown front matter** (a ``---`` line first, YAML, a closing ``---`` or ``...`` line): every
   top-level key with a scalar or a list of scalars (``tags: [a, b]``, ``title: ...``,
   ``access: hr``); nested mappings are ignored. For ``access`` and ``tags`` a scalar with commas
   is split like a ``.ragmeta`` value. ``title`` sets the document's title. The front matter is
   metadata, not text: the extractor removes it from the canonical text (see extract.py).

The ``access`` key (:data:`ACCESS_KEY`) lists the groups a document is restricted to; a document
without it is visible to every token, one with ``access`` and no value (``access=``) only to the
administrator. Group names and keys are checked (:data:`KEY_RE`, :data:`GROUP_RE`).

Bad metadata fails closed and alone: a ``.ragmeta`` line that cannot be read makes every
document under that folder fail with the file, the line and the cause (under
``RAG_FAILED_POLICY=keep`` their last good rows stay, with the metadata they had); front matter
that is not valid YAML fails its document.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.ingest.select import _regex

META_FILE = ".ragmeta"
ACCESS_KEY = "access"
TITLE_KEY = "title"
SYSTEM_KEYS = ("document", "folder", "format", "size", "modified")
"""Keys the file system sets; an owner's ``.ragmeta`` may not set them (front matter keys of
these names, such as Quarto's ``format:``, are ignored)."""
SPLIT_KEYS = (ACCESS_KEY, "tags")
"""Front-matter keys whose scalar value is split at commas, as in ``.ragmeta``."""
KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
"""A metadata key: lower-case letters, digits, ``_`` and ``-``, starting with a letter."""
GROUP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A group name (``access`` values, ``token add --groups``)."""
MAX_VALUE_CHARS = 512
"""Longest metadata value kept (a longer front-matter string is cut there)."""

Metadata = dict[str, list[str]]


class MetadataError(ValueError):
    """Metadata that cannot be read; the message names the file, line and cause."""


# -- front matter ---------------------------------------------------------------------------
_FM_OPEN = "---"
_FM_CLOSE = ("---", "...")


@dataclass(frozen=True)
class FrontMatter:
    """A Markdown file's front matter: its fields and where the body starts."""

    fields: Metadata
    end: int  # offset of the first character after the closing line (0: no front matter)


def front_matter(text: str) -> FrontMatter:
    """The front matter of a Markdown ``text`` (BOM removed, LF newlines), or ``end == 0``.

    Raises :class:`MetadataError` when the block is there but is not a YAML mapping."""
    if not text.startswith(_FM_OPEN + "\n"):
        return FrontMatter({}, 0)
    pos = len(_FM_OPEN) + 1
    start = pos
    while pos <= len(text):
        nl = text.find("\n", pos)
        line_end = len(text) if nl < 0 else nl
        if text[pos:line_end].rstrip() in _FM_CLOSE:
            block = text[start:pos]
            end = len(text) if nl < 0 else nl + 1
            return FrontMatter(_yaml_fields(block), end)
        if nl < 0:
            break
        pos = nl + 1
    return FrontMatter({}, 0)  # no closing line: a thematic break, not front matter


def _yaml_fields(block: str) -> Metadata:
    import yaml

    try:
        data = yaml.safe_load(block) if block.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""  # +1 opening, 1-based
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MetadataError(f"front matter is not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MetadataError(
            f"front matter is a YAML {type(data).__name__}, not a mapping of keys to values"
        )
    out: Metadata = {}
    for raw_key, value in data.items():
        key = str(raw_key).strip().lower()
        if not KEY_RE.fullmatch(key) or key in SYSTEM_KEYS:
            continue  # not a key we can filter on, or the file system's: ignored
        values = _yaml_values(value)
        if key == ACCESS_KEY:  # fails closed: a value that is not group names fails the document
            out[key] = _access_values(value, values)
            continue
        if values is None:
            continue
        if key in SPLIT_KEYS:
            values = [v for item in values for v in _split_values(item)]
        out[key] = values
    return out


def _access_values(raw: Any, values: list[str] | None) -> list[str]:
    """The groups of a front-matter ``access`` value, checked as ``.ragmeta`` and ``token add
    --groups`` check them (issue 43: ``*``, a mapping, a nested list or binary data never make
    a document public); :class:`MetadataError` otherwise, which fails the document closed."""
    if (
        values is None
        or isinstance(raw, bool)
        or (isinstance(raw, list) and any(isinstance(v, bool) for v in raw))
    ):
        raise MetadataError(
            f"front matter: access is {_shown_yaml(raw)}, not a group name or a list of group "
            "names (e.g. `access: [hr, legal]`); the document is not indexed until it is fixed"
        )
    groups = [v for item in values for v in _split_values(item)]
    bad = [g for g in groups if not GROUP_RE.fullmatch(g)]
    if bad:
        raise MetadataError(
            f"front matter: access {bad[0][:40]!r} is not a group name (letters, digits, _, . "
            "and -; `*` is not a group: leave access out to make a document public)"
        )
    return groups


def _shown_yaml(value: Any) -> str:
    """A short, one-line description of a YAML value for an error line."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list holding a non-scalar"
    if isinstance(value, bytes):
        return "binary data"
    return f"a YAML {type(value).__name__}"


def _yaml_values(value: Any) -> list[str] | None:
    """A scalar → one value; a list of scalars → its values; None → no value; else None."""
    if value is None:
        return []
    if isinstance(value, list):
        items = [_scalar(v) for v in value]
        return None if any(v is None for v in items) else [v for v in items if v is not None]
    one = _scalar(value)
    return None if one is None else [one]


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, _dt.date | int | float | str):
        text = value.isoformat() if isinstance(value, _dt.date) else str(value)
        return " ".join(text.split())[:MAX_VALUE_CHARS]
    return None


def _split_values(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


# -- .ragmeta ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetaLine:
    folder: str  # the folder holding the .ragmeta, relative to the root ("" at the top)
    line: int
    pattern: str
    values: Metadata

    def matches(self, document_id: str) -> bool:
        prefix = f"{self.folder}/" if self.folder else ""
        if not document_id.startswith(prefix):
            return False
        return bool(_regex(self.pattern).match(document_id[len(prefix) :]))


@dataclass
class MetaRules:
    """Every ``.ragmeta`` of a documents tree, read once per run."""

    lines: list[MetaLine] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # folder -> "<file> line N: cause"
    digests: dict[str, str] = field(default_factory=dict)  # .ragmeta path -> sha256 of bytes

    def for_document(self, document_id: str) -> Metadata:
        """The keys the ``.ragmeta`` files give ``document_id`` (deepest folder, then the last
        matching line, wins per key). Raises :class:`MetadataError` when a ``.ragmeta`` of a
        folder holding the document could not be read."""
        for folder, why in sorted(self.errors.items()):
            if not folder or document_id.startswith(folder + "/"):
                raise MetadataError(why)
        out: Metadata = {}
        depth: dict[str, int] = {}
        for ml in self.lines:  # shallow folders first, then line order
            if ml.matches(document_id):
                d = ml.folder.count("/") + 1 if ml.folder else 0
                for key, values in ml.values.items():
                    if d >= depth.get(key, -1):
                        out[key], depth[key] = list(values), d
        return out


def read_rules(root: Path) -> MetaRules:
    """Every ``.ragmeta`` under ``root`` (not inside hidden folders, whose files are not
    documents either), parsed; a file that cannot be read is an error for its whole folder."""
    files: dict[str, bytes | str] = {}
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if META_FILE in filenames:
            folder = Path(dirpath).relative_to(root).as_posix()
            try:
                files["" if folder == "." else folder] = (Path(dirpath) / META_FILE).read_bytes()
            except OSError as exc:
                files["" if folder == "." else folder] = str(exc.strerror or exc)
    return rules_from(files)


def rules_from(files: dict[str, bytes | str]) -> MetaRules:
    """The rules of the ``.ragmeta`` files of a tree, by the folder holding each (``""`` at the
    top): its bytes, or why it could not be read (an error for that whole folder). A folder's
    files (:func:`read_rules`), a Git commit's or a bucket prefix's (issue 49) alike."""
    rules = MetaRules()
    for folder in sorted(files, key=lambda f: (f.count("/") + bool(f), f)):
        data = files[folder]
        shown = f"{folder}/{META_FILE}" if folder else META_FILE
        if isinstance(data, str):
            rules.errors[folder] = f"{shown}: cannot read it: {data}"
            continue
        rules.digests[shown] = hashlib.sha256(data).hexdigest()
        try:
            rules.lines += parse_ragmeta(data.decode("utf-8"), folder, shown)
        except UnicodeDecodeError:
            rules.errors[folder] = f"{shown}: not UTF-8 text"
        except MetadataError as exc:
            rules.errors[folder] = str(exc)
    return rules


def parse_ragmeta(text: str, folder: str = "", shown: str = META_FILE) -> list[MetaLine]:
    """The lines of one ``.ragmeta`` (see the module docstring); :class:`MetadataError` names
    the first bad line."""
    out: list[MetaLine] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        try:
            words = shlex.split(raw, comments=True, posix=True)
        except ValueError as exc:
            raise MetadataError(f"{shown} line {n}: {exc}") from None
        if not words:
            continue
        pattern, pairs = words[0], words[1:]
        if "=" in pattern:
            raise MetadataError(
                f"{shown} line {n}: starts with {pattern!r}, not a pattern: write "
                "PATTERN key=value (e.g. `hr/** access=hr`)"
            )
        if not pairs:
            raise MetadataError(f"{shown} line {n}: pattern {pattern!r} sets no key=value")
        values: Metadata = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            key = key.strip()
            if not eq:
                raise MetadataError(f"{shown} line {n}: {pair!r} is not key=value")
            if not KEY_RE.fullmatch(key):
                raise MetadataError(
                    f"{shown} line {n}: {key!r} is not a key (lower-case letters, digits, _ "
                    "and -, starting with a letter)"
                )
            if key in SYSTEM_KEYS:
                raise MetadataError(
                    f"{shown} line {n}: {key!r} is set by the file system "
                    f"({', '.join(SYSTEM_KEYS)}); choose another key"
                )
            items = _split_values(value)
            if key == ACCESS_KEY:
                bad = [g for g in items if not GROUP_RE.fullmatch(g)]
                if bad:
                    raise MetadataError(f"{shown} line {n}: {bad[0]!r} is not a group name")
            values[key] = items
        out.append(MetaLine(folder, n, pattern, values))
    return out


# -- one document -------------------------------------------------------------------------------
def system_facts(document_id: str, kind: str, path: Path | None, title: str = "") -> Metadata:
    """The file-system keys of a document (``size``/``modified`` need its ``path``)."""
    parts = document_id.split("/")[:-1]
    facts: Metadata = {
        "document": [document_id],
        "folder": ["/".join(parts[: i + 1]) for i in range(len(parts))],
        "format": [kind],
    }
    if title:
        facts[TITLE_KEY] = [" ".join(title.split())[:MAX_VALUE_CHARS]]
    if path is not None:
        try:
            st = os.stat(path)
        except OSError:
            return facts
        facts["size"] = [str(st.st_size)]
        facts["modified"] = [iso_time(st.st_mtime)]
    return facts


def iso_time(seconds: float) -> str:
    """``2025-03-01T10:20:30Z`` (UTC, to the second)."""
    return _dt.datetime.fromtimestamp(int(seconds), tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(facts: Metadata, rules: Metadata, fields: Metadata) -> Metadata:
    """File-system facts, then ``.ragmeta`` keys, then front-matter fields (later wins per
    key; the file system's own keys are never overridden)."""
    out = {**facts}
    for source in (rules, fields):
        for key, values in source.items():
            if key not in SYSTEM_KEYS:
                out[key] = list(values)
    return dict(sorted(out.items()))


def access_groups(metadata: Metadata) -> list[str] | None:
    """The groups a document is restricted to, or None when it has no ``access`` key."""
    values = metadata.get(ACCESS_KEY)
    return None if values is None else sorted(set(values))


def labels(metadata: Metadata) -> list[str]:
    """``key=value`` for every value (what a chunk row's ``meta`` column holds), sorted."""
    return sorted({f"{k}={v}" for k, vs in metadata.items() for v in vs})


def metadata_digest(metadata: Metadata) -> str:
    """A short stable hash of a document's metadata (the rows' ``meta_hash`` stamp)."""
    blob = json.dumps(metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]
