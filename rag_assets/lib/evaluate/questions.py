"""Loaders for the evaluation sets: needle questions, out-of-domain queries, BEIR datasets.

Formats are those of ``shared/eval/README.md`` and ``shared/beir/README.md``. Every loader
fails loudly: a bad line raises :class:`QuestionFileError` naming the file, the 1-based line
number and what is wrong. Blank lines are skipped; unknown JSON fields are ignored.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.types import normalize_ws

#: The phrasings every needle question must carry (shared/eval/README.md).
REQUIRED_PHRASINGS = ("course", "ticket")
OOD_KINDS = ("near", "unrelated")


class QuestionFileError(ValueError):
    """A question, query or qrels file is malformed; ``path`` and ``line`` say where."""

    def __init__(self, path: Path, line: int | None, problem: str) -> None:
        self.path, self.line, self.problem = path, line, problem
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class Query:
    """One query to run: ``query_id`` is ``"<question id>/<phrasing>"`` or the OOD id."""

    query_id: str
    text: str
    question_id: str
    phrasing: str


@dataclass(frozen=True)
class Question:
    """A needle question: the answer is any chunk containing ``needle`` whole."""

    id: str
    document: str
    needle: str
    queries: dict[str, str]  # phrasing -> query text
    page: int | None = None  # 1-based page of the needle (PDF sets)

    def query_list(self) -> list[Query]:
        return [Query(f"{self.id}/{p}", t, self.id, p) for p, t in sorted(self.queries.items())]


@dataclass(frozen=True)
class OODQuery:
    """An out-of-domain query: the right answer is a refusal. ``kind`` is near|unrelated."""

    id: str
    kind: str
    query: str


@dataclass
class NeedleSet:
    questions: list[Question]
    out_of_domain: list[OODQuery] = field(default_factory=list)

    def queries(self) -> list[Query]:
        """All in-domain queries, question order then phrasing name."""
        return [q for question in self.questions for q in question.query_list()]


@dataclass(frozen=True)
class BrokenQuestion:
    """A question whose needle cannot be found where it should be (not a retrieval miss)."""

    question_id: str
    document: str
    reason: str


@dataclass
class BeirSet:
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text)
    queries: dict[str, str]  # only the queries judged in the split's qrels
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> grade


def load_needle_set(folder: Path) -> NeedleSet:
    """Read ``questions.jsonl`` (required) and ``out_of_domain.jsonl`` (optional)."""
    folder = Path(folder)
    qpath = folder / "questions.jsonl"
    if not qpath.is_file():
        raise QuestionFileError(qpath, None, "file not found")
    questions: list[Question] = []
    first_line: dict[str, int] = {}
    for n, obj in _jsonl(qpath):
        q = _question(qpath, n, obj)
        if q.id in first_line:
            raise QuestionFileError(
                qpath, n, f"duplicate id {q.id!r} (first on line {first_line[q.id]})"
            )
        first_line[q.id] = n
        questions.append(q)
    if not questions:
        raise QuestionFileError(qpath, None, "no questions")
    ood: list[OODQuery] = []
    opath = folder / "out_of_domain.jsonl"
    if opath.is_file():
        first_line = {}
        for n, obj in _jsonl(opath):
            o = OODQuery(
                _str(opath, n, obj, "id"), _str(opath, n, obj, "kind"), _str(opath, n, obj, "query")
            )
            if o.kind not in OOD_KINDS:
                raise QuestionFileError(
                    opath, n, f"kind must be one of {OOD_KINDS}, got {o.kind!r}"
                )
            if o.id in first_line:
                raise QuestionFileError(
                    opath, n, f"duplicate id {o.id!r} (first on line {first_line[o.id]})"
                )
            first_line[o.id] = n
            ood.append(o)
    return NeedleSet(questions, ood)


def check_needles(
    questions: list[Question], documents: Mapping[str, str], collapse_ws: bool = False
) -> list[BrokenQuestion]:
    """Questions whose needle is not in their named document (document id -> canonical text).

    ``question.document`` is matched to a document id exactly, else to the single id that ends
    with ``"/" + document`` (corpus folders with sub-folders). With ``collapse_ws`` needle and
    texts are whitespace-collapsed first (the PDF-set rule).
    """
    norm = normalize_ws if collapse_ws else (lambda s: s)
    texts = {doc_id: norm(text) for doc_id, text in documents.items()}
    broken = []
    for q in questions:
        needle = norm(q.needle)
        doc_id = _resolve(q.document, texts)
        if doc_id is not None and needle in texts[doc_id]:
            continue
        elsewhere = sorted(d for d, t in texts.items() if needle in t)
        found = (
            f"needle found in {elsewhere}" if elsewhere else "needle occurs nowhere in the corpus"
        )
        if doc_id is None:
            reason = f"document {q.document!r} is not in the corpus; {found}"
        else:
            reason = f"needle not in {doc_id!r}; {found}"
        broken.append(BrokenQuestion(q.id, q.document, reason))
    return broken


def load_beir(folder: Path, split: str = "test") -> BeirSet:
    """Read a BEIR dataset folder; only queries judged in ``qrels/<split>.tsv`` are kept.

    Corpus from ``corpus.jsonl`` or ``corpus.jsonl.gz`` (title may be absent). Every qrels
    query id must exist in ``queries.jsonl`` and every corpus id in the corpus.
    """
    folder = Path(folder)
    cpath = folder / "corpus.jsonl"
    if not cpath.is_file():
        cpath = folder / "corpus.jsonl.gz"
    if not cpath.is_file():
        raise QuestionFileError(folder / "corpus.jsonl[.gz]", None, "file not found")
    corpus: dict[str, tuple[str, str]] = {}
    for n, obj in _jsonl(cpath):
        doc_id = _id(cpath, n, obj)
        title = obj.get("title") or ""
        if not isinstance(title, str):
            raise QuestionFileError(cpath, n, f"field 'title' must be a string, got {title!r}")
        if doc_id in corpus:
            raise QuestionFileError(cpath, n, f"duplicate _id {doc_id!r}")
        corpus[doc_id] = (title, _str(cpath, n, obj, "text", allow_empty=True))
    qpath = folder / "queries.jsonl"
    if not qpath.is_file():
        raise QuestionFileError(qpath, None, "file not found")
    all_queries = {_id(qpath, n, obj): _str(qpath, n, obj, "text") for n, obj in _jsonl(qpath)}
    rpath = folder / "qrels" / f"{split}.tsv"
    qrels = _qrels(rpath, all_queries, corpus)
    return BeirSet(corpus, {q: all_queries[q] for q in qrels}, qrels)


def _qrels(
    path: Path, queries: Mapping[str, str], corpus: Mapping[str, Any]
) -> dict[str, dict[str, int]]:
    if not path.is_file():
        raise QuestionFileError(path, None, "file not found")
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as f:
        for n, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
            if n == 1:
                if line.split("\t") != ["query-id", "corpus-id", "score"]:
                    raise QuestionFileError(
                        path, n, f"expected header 'query-id<TAB>corpus-id<TAB>score', got {line!r}"
                    )
                continue
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise QuestionFileError(
                    path, n, f"expected 3 tab-separated fields, got {len(parts)}"
                )
            qid, did, score = parts
            try:
                grade = int(score)
            except ValueError:
                raise QuestionFileError(
                    path, n, f"score must be an integer, got {score!r}"
                ) from None
            if qid not in queries:
                raise QuestionFileError(path, n, f"query-id {qid!r} is not in queries.jsonl")
            if did not in corpus:
                raise QuestionFileError(path, n, f"corpus-id {did!r} is not in the corpus")
            qrels.setdefault(qid, {})[did] = grade
    if not qrels:
        raise QuestionFileError(path, None, "no judgements")
    return qrels


def _question(path: Path, n: int, obj: dict[str, Any]) -> Question:
    qid = _str(path, n, obj, "id")
    if "/" in qid:
        raise QuestionFileError(path, n, f"id {qid!r} must not contain '/'")
    queries = obj.get("queries")
    if not isinstance(queries, dict):
        raise QuestionFileError(path, n, "missing field 'queries' (an object of phrasing -> text)")
    # a question from reviewed traffic (issue 33) has the phrasings users asked, at least one
    for phrasing in REQUIRED_PHRASINGS if "traffic" not in obj else ():
        if phrasing not in queries:
            raise QuestionFileError(path, n, f"missing field 'queries.{phrasing}'")
    if not queries:
        raise QuestionFileError(path, n, "field 'queries' is empty: give at least one phrasing")
    for phrasing, text in queries.items():
        if not isinstance(text, str) or not text.strip():
            raise QuestionFileError(path, n, f"'queries.{phrasing}' must be a non-empty string")
    page = obj.get("page")
    if page is not None and (isinstance(page, bool) or not isinstance(page, int) or page < 1):
        raise QuestionFileError(path, n, f"'page' must be a 1-based integer, got {page!r}")
    return Question(
        qid, _str(path, n, obj, "document"), _str(path, n, obj, "needle"), dict(queries), page
    )


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise QuestionFileError(
                    path, n, f"invalid JSON: {e.msg} (column {e.colno})"
                ) from None
            if not isinstance(obj, dict):
                raise QuestionFileError(
                    path, n, f"expected a JSON object, got {type(obj).__name__}"
                )
            yield n, obj


def _str(path: Path, n: int, obj: dict[str, Any], key: str, allow_empty: bool = False) -> str:
    if key not in obj:
        raise QuestionFileError(path, n, f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, str):
        raise QuestionFileError(path, n, f"field {key!r} must be a string, got {value!r}")
    if not allow_empty and not value.strip():
        raise QuestionFileError(path, n, f"field {key!r} is empty")
    return value


def _id(path: Path, n: int, obj: dict[str, Any]) -> str:
    value = obj.get("_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _str(path, n, obj, "_id")


def _resolve(document: str, texts: Mapping[str, str]) -> str | None:
    if document in texts:
        return document
    matches = [d for d in texts if d.endswith("/" + document)]
    return matches[0] if len(matches) == 1 else None
