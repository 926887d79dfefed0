"""``rag-assets questions --check DIR``: every problem of a needle-format question set, at once.

The loaders of :mod:`.questions` stop at the first bad line, and a needle that is not in its
document is only found (and its question dropped) when the evaluation runs, after the corpus is
extracted, chunked and embedded. This check reads the set and only the documents its rows name
(well under a second for a folder of text), and reports every problem with its place:

* a bad row (``questions.jsonl:7: missing field 'queries.ticket'``): invalid JSON, a missing or
  empty field, an id with ``/`` or used twice, an out-of-domain ``kind`` that is not ``near`` or
  ``unrelated``, a ``page`` that is not a 1-based number. Any of these makes the set unusable
  (the loaders refuse it), so :attr:`CheckReport.unusable` is true;
* a row whose ``document`` is not in the folder (with the closest file name), or whose needle is
  not in that document byte for byte (PDFs: after collapsing white space, as the evaluation
  matches them), with the nearest text of the document (:func:`nearest_match`) and where it
  differs. The evaluation drops such a question; the rest of the set is still used.

A set whose needles are mostly not in these documents (fewer than
:data:`~.question_source.MIN_MATCHING_SHARE` found) belongs to another corpus: the index run
does not use it, and the check says so in one line instead of a line per row
(:attr:`CheckReport.foreign`).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.evaluate.questions import OOD_KINDS, REQUIRED_PHRASINGS
from rag_assets.lib.types import normalize_ws

#: The set's files (the out-of-domain one is optional).
QUESTIONS_FILE, OOD_FILE = "questions.jsonl", "out_of_domain.jsonl"
#: Shown of a needle and of its nearest match (characters).
SHOWN_CHARS = 160


@dataclass(frozen=True)
class Problem:
    """One problem of one row: ``path:line: [id: ]what``; ``dropped`` is a question the
    evaluation leaves out (its needle cannot be found), else the row makes the set unusable."""

    path: str
    line: int | None
    what: str
    question_id: str = ""
    dropped: bool = False
    detail: tuple[str, ...] = ()  # further lines: the needle, its nearest match

    def lines(self) -> list[str]:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        who = f"{self.question_id}: " if self.question_id else ""
        return [f"{where}: {who}{self.what}", *(f"    {d}" for d in self.detail)]


@dataclass
class CheckReport:
    """What :func:`check_question_set` found."""

    folder: str
    questions: int = 0  # rows of questions.jsonl that parsed as questions
    ood: int = 0  # rows of out_of_domain.jsonl that parsed
    found: int = 0  # needles found byte for byte (PDF: white space collapsed)
    documents: int = 0  # files in the documents folder (hidden ones not counted)
    problems: list[Problem] = field(default_factory=list)

    @property
    def unusable(self) -> bool:
        """A row the loaders refuse: the whole set cannot be read."""
        return any(not p.dropped for p in self.problems)

    @property
    def dropped(self) -> list[Problem]:
        return [p for p in self.problems if p.dropped]

    @property
    def foreign(self) -> bool:
        """Most needles are not in these documents: the set was written for another corpus."""
        from rag_assets.lib.evaluate.question_source import MIN_MATCHING_SHARE

        return self.questions > 0 and self.found < MIN_MATCHING_SHARE * self.questions

    def summary(self) -> str:
        if self.unusable:
            bad = sum(1 for p in self.problems if not p.dropped)
            return f"{self.folder}: {bad} bad row(s): the set cannot be used until they are fixed"
        if self.foreign:
            return (
                f"{self.folder}: {self.questions - self.found} of {self.questions} needles are not "
                "in these documents: the set belongs to another corpus and is not used"
            )
        drop = len(self.dropped)
        tail = f"; {drop} question(s) dropped: needle not found" if drop else "; every needle found"
        return f"{self.folder}: {self.questions} questions, {self.ood} out-of-domain queries{tail}"

    def lines(self) -> list[str]:
        """Each problem (by file, then line), then :meth:`summary`."""
        rows = [] if self.foreign and not self.unusable else self.problems
        rows = sorted(rows, key=lambda p: (p.path, p.line or 0))
        return [line for p in rows for line in p.lines()] + [self.summary()]


def check_question_set(
    folder: str | Path,
    documents: str | Path,
    *,
    read: Callable[[str, Path], tuple[str, str] | None] | None = None,
) -> CheckReport:
    """Check the needle-format set in ``folder`` against the documents folder ``documents``.

    ``read(document_id, path)`` returns a document's ``(kind, canonical text)`` (default: the
    extractor, one document at a time; None when it cannot be read). Only the documents the rows
    name are read."""
    folder = Path(folder)
    report = CheckReport(str(folder))
    qpath = folder / QUESTIONS_FILE
    if not qpath.is_file():
        report.problems.append(Problem(str(qpath), None, "file not found"))
        return report
    questions = _questions(qpath, report)
    opath = folder / OOD_FILE
    if opath.is_file():
        _out_of_domain(opath, report)
    files = _document_files(Path(documents))
    report.documents = len(files)
    reader = read or _extract
    texts: dict[str, tuple[str, str] | None] = {}
    for line, row in questions:
        doc_id = _resolve(row["document"], files)
        if doc_id is None:
            close = difflib.get_close_matches(row["document"], list(files), n=1, cutoff=0.6)
            hint = f" (closest file name: {close[0]})" if close else ""
            report.problems.append(
                Problem(
                    str(qpath),
                    line,
                    f"document {row['document']!r} is not in {documents}{hint}",
                    row["id"],
                    dropped=True,
                )
            )
            continue
        if doc_id not in texts:
            texts[doc_id] = reader(doc_id, files[doc_id])
        got = texts[doc_id]
        if got is None:
            report.problems.append(
                Problem(str(qpath), line, f"{doc_id} cannot be read", row["id"], dropped=True)
            )
            continue
        kind, text = got
        needle = row["needle"]
        collapse = kind == "pdf"
        if (normalize_ws(needle) in normalize_ws(text)) if collapse else (needle in text):
            report.found += 1
            continue
        report.problems.append(_missing(str(qpath), line, row["id"], doc_id, needle, text))
    return report


def nearest_match(needle: str, text: str) -> tuple[int, int, float]:
    """``(start, end, similarity)`` of the stretch of ``text`` most like ``needle``: around each
    of the longest blocks the two share, a window of the needle's length, widened to whole
    words, scored by :class:`difflib.SequenceMatcher` (similarity 0..1)."""
    if not text or not needle:
        return 0, 0, 0.0
    best = (0, 0, 0.0)
    seen: set[int] = set()
    matcher = difflib.SequenceMatcher(None, text, needle, autojunk=False)
    for block in sorted(matcher.get_matching_blocks(), key=lambda b: -b.size)[:8]:
        if block.size == 0:
            continue
        start = max(0, block.a - block.b)
        if start in seen:
            continue
        seen.add(start)
        end = min(len(text), start + len(needle))
        start, end = _widen(text, start, end)
        score = difflib.SequenceMatcher(None, text[start:end], needle, autojunk=False).ratio()
        if score > best[2]:
            best = (start, end, score)
    return best


def _missing(path: str, line: int, qid: str, doc_id: str, needle: str, text: str) -> Problem:
    """The problem of a needle not found byte for byte, with its nearest match."""
    detail = [f"needle:  {_show(needle)}"]
    if normalize_ws(needle) in normalize_ws(text):
        what = f"needle not found byte for byte in {doc_id}: only its white space differs"
    elif needle.lower() in text.lower():
        what = f"needle not found byte for byte in {doc_id}: only letter case differs"
    else:
        what = f"needle not found byte for byte in {doc_id}"
    start, end, score = nearest_match(needle, text)
    if score > 0:
        found = text[start:end]
        at = text.count("\n", 0, start) + 1
        detail.append(f"nearest: {_show(found)} (line {at}, {score:.0%} alike)")
        diff = _first_difference(needle, found)
        if diff:
            detail.append(diff)
    return Problem(path, line, what, qid, dropped=True, detail=tuple(detail))


def _first_difference(needle: str, found: str) -> str:
    """``differs at character N: needle has '…', the document '…'`` (repr, so white space
    and look-alike characters such as a curly quote show)."""
    n = next((i for i, (a, b) in enumerate(zip(needle, found, strict=False)) if a != b), None)
    if n is None:
        if len(needle) == len(found):
            return ""
        n = min(len(needle), len(found))
    a, b = needle[n : n + 12], found[n : n + 12]
    return f"differs at character {n + 1}: needle has {ascii(a)}, the document {ascii(b)}"


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    """Move ``start`` back and ``end`` forward to word edges (at most 40 characters each)."""
    lo = start
    while lo > 0 and start - lo < 40 and not text[lo - 1].isspace():
        lo -= 1
    hi = end
    while hi < len(text) and hi - end < 40 and not text[hi].isspace():
        hi += 1
    while lo < hi and text[lo].isspace():
        lo += 1
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    return lo, hi


def _show(text: str) -> str:
    """``text`` as a JSON string (white space and look-alikes visible), cut to SHOWN_CHARS."""
    return json.dumps(
        text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…", ensure_ascii=False
    )


def _rows(path: Path, report: CheckReport) -> list[tuple[int, dict[str, Any]]]:
    out = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                report.problems.append(
                    Problem(str(path), n, f"invalid JSON: {e.msg} (column {e.colno})")
                )
                continue
            if not isinstance(obj, dict):
                report.problems.append(
                    Problem(str(path), n, f"expected a JSON object, got {type(obj).__name__}")
                )
                continue
            out.append((n, obj))
    return out


def _text_field(obj: Mapping[str, Any], key: str) -> str | None:
    """What is wrong with ``obj[key]`` as a non-empty string, else None."""
    if key not in obj:
        return f"missing field {key!r}"
    value = obj[key]
    if not isinstance(value, str):
        return f"field {key!r} must be a string, got {value!r}"
    if not value.strip():
        return f"field {key!r} is empty"
    return None


def _questions(path: Path, report: CheckReport) -> list[tuple[int, dict[str, Any]]]:
    """The rows of ``questions.jsonl`` that are well-formed questions (problems recorded)."""
    good = []
    first: dict[str, int] = {}
    for n, obj in _rows(path, report):
        wrong = [w for k in ("id", "document", "needle") if (w := _text_field(obj, k))]
        qid = obj.get("id") if isinstance(obj.get("id"), str) else ""
        if qid and "/" in qid:
            wrong.append(f"id {qid!r} must not contain '/'")
        queries = obj.get("queries")
        if not isinstance(queries, dict):
            wrong.append("missing field 'queries' (an object of phrasing -> text)")
        else:
            wrong += [
                f"missing field 'queries.{p}'" for p in REQUIRED_PHRASINGS if p not in queries
            ]
            wrong += [
                f"'queries.{p}' must be a non-empty string"
                for p, t in queries.items()
                if not isinstance(t, str) or not t.strip()
            ]
        page = obj.get("page")
        if page is not None and (isinstance(page, bool) or not isinstance(page, int) or page < 1):
            wrong.append(f"'page' must be a 1-based integer, got {page!r}")
        if qid and qid in first:
            wrong.append(f"duplicate id {qid!r} (first on line {first[qid]})")
        elif qid:
            first[qid] = n
        for w in wrong:
            report.problems.append(Problem(str(path), n, w, qid or ""))
        if not wrong:
            report.questions += 1
            good.append((n, obj))
    if not good and not report.problems:
        report.problems.append(Problem(str(path), None, "no questions"))
    return good


def _out_of_domain(path: Path, report: CheckReport) -> None:
    first: dict[str, int] = {}
    for n, obj in _rows(path, report):
        wrong = [w for k in ("id", "kind", "query") if (w := _text_field(obj, k))]
        kind = obj.get("kind")
        if isinstance(kind, str) and kind.strip() and kind not in OOD_KINDS:
            wrong.append(f"kind must be one of {OOD_KINDS}, got {kind!r}")
        oid = obj.get("id") if isinstance(obj.get("id"), str) else ""
        if oid and oid in first:
            wrong.append(f"duplicate id {oid!r} (first on line {first[oid]})")
        elif oid:
            first[oid] = n
        for w in wrong:
            report.problems.append(Problem(str(path), n, w, oid or ""))
        if not wrong:
            report.ood += 1


def _document_files(root: Path) -> dict[str, Path]:
    """document_id (the POSIX path under ``root``) -> path of every regular file below ``root``
    (names only; symbolic links to folders not followed, hidden files and folders left out)."""
    out: dict[str, Path] = {}
    if not root.is_dir():
        return out
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            path = Path(here) / name
            if not name.startswith(".") and path.is_file():
                out[path.relative_to(root).as_posix()] = path
    return out


def _resolve(document: str, files: Mapping[str, Path]) -> str | None:
    """``document`` as a document id: exact, else the one id ending in ``/document``."""
    if document in files:
        return document
    matches = [d for d in files if d.endswith("/" + document)]
    return matches[0] if len(matches) == 1 else None


#: Suffixes whose canonical text is the file decoded (:mod:`rag_assets.lib.ingest.extract`):
#: read here directly, without loading the extractors (PyMuPDF alone takes seconds to import).
PLAIN_TEXT = {".md": "markdown", ".markdown": "markdown", ".rst": "rst", ".rest": "rst"}
PLAIN_TEXT[".txt"] = "text"


def _extract(doc_id: str, path: Path) -> tuple[str, str] | None:
    """(kind, canonical text) of one document, or None if it cannot be read: a text file
    decoded by the extractor's rules (strict UTF-8, BOM dropped, CRLF/CR to LF), any other
    through the extractor."""
    kind = PLAIN_TEXT.get(path.suffix.lower())
    if kind is not None:
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        return kind, text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    from rag_assets.lib.ingest.extract import extract_document

    root = path
    for _ in doc_id.split("/"):
        root = root.parent
    doc = extract_document(path, root)
    return (doc.kind, doc.text) if doc.ok else None
