"""Tests for rag_assets.lib.evaluate.questions: loaders, errors, needle checks, shared sets."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from rag_assets.lib.evaluate.questions import (
    BrokenQuestion,
    Question,
    QuestionFileError,
    check_needles,
    load_beir,
    load_needle_set,
)

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"
needs_shared = pytest.mark.skipif(
    not (SHARED / "eval" / "course-dev").is_dir() or not (SHARED / "beir").is_dir(),
    reason="needs ../shared (eval sets, corpus, beir)",
)


def q(i: int, **over) -> dict:
    d = {
        "id": f"d{i:02d}",
        "document": "doc.md",
        "needle": f"Needle number {i} is here.",
        "queries": {"course": f"course question {i}?", "ticket": f"ticket {i} broken"},
    }
    d.update(over)
    return d


def write_jsonl(path: Path, rows: list) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_needle_set_happy_path(tmp_path):
    write_jsonl(tmp_path / "questions.jsonl", [q(1), "", q(2, page=3)])
    write_jsonl(
        tmp_path / "out_of_domain.jsonl",
        [
            {"id": "o01", "kind": "near", "query": "a?"},
            {"id": "o02", "kind": "unrelated", "query": "b?"},
        ],
    )
    s = load_needle_set(tmp_path)
    assert [x.id for x in s.questions] == ["d01", "d02"]
    assert s.questions[0].page is None and s.questions[1].page == 3
    assert [x.query_id for x in s.queries()] == [
        "d01/course",
        "d01/ticket",
        "d02/course",
        "d02/ticket",
    ]
    assert s.queries()[3].text == "ticket 2 broken" and s.queries()[3].phrasing == "ticket"
    assert [(o.id, o.kind) for o in s.out_of_domain] == [("o01", "near"), ("o02", "unrelated")]


def test_out_of_domain_is_optional(tmp_path):
    write_jsonl(tmp_path / "questions.jsonl", [q(1)])
    assert load_needle_set(tmp_path).out_of_domain == []


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ('{"id": "d02", "document": ', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (q(2, needle=None), "'needle' must be a string"),
        ({k: v for k, v in q(2).items() if k != "needle"}, "missing field 'needle'"),
        ({k: v for k, v in q(2).items() if k != "queries"}, "missing field 'queries'"),
        (q(2, queries={"course": "x?"}), "missing field 'queries.ticket'"),
        (q(2, queries={"course": "x?", "ticket": ""}), "'queries.ticket' must be a non-empty"),
        (q(2, document=7), "'document' must be a string"),
        (q(2, needle="   "), "field 'needle' is empty"),
        (q(2, page=0), "'page' must be a 1-based integer"),
        (q(2, page="4"), "'page' must be a 1-based integer"),
        (q(2, id="d/2"), "must not contain '/'"),
        (q(1), "duplicate id 'd01' (first on line 1)"),
    ],
)
def test_question_errors_name_file_and_line(tmp_path, row, problem):
    path = write_jsonl(tmp_path / "questions.jsonl", [q(1), row, q(3)])
    with pytest.raises(QuestionFileError) as err:
        load_needle_set(tmp_path)
    assert err.value.line == 2 and err.value.path == path
    assert str(err.value).startswith(f"{path}:2: ")
    assert problem in str(err.value)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"id": "o02", "kind": "far", "query": "x"}, "kind must be one of"),
        ({"id": "o02", "kind": "near"}, "missing field 'query'"),
        ({"id": "o01", "kind": "near", "query": "x"}, "duplicate id 'o01'"),
        ("not json", "invalid JSON"),
    ],
)
def test_ood_errors_name_file_and_line(tmp_path, row, problem):
    write_jsonl(tmp_path / "questions.jsonl", [q(1)])
    ok = {"id": "o01", "kind": "near", "query": "a?"}
    path = write_jsonl(tmp_path / "out_of_domain.jsonl", [ok, "", row])
    with pytest.raises(
        QuestionFileError, match=re.escape(f"{path}:3: ") + ".*" + re.escape(problem)
    ):
        load_needle_set(tmp_path)


def test_missing_or_empty_question_file(tmp_path):
    with pytest.raises(QuestionFileError, match="questions.jsonl: file not found"):
        load_needle_set(tmp_path)
    (tmp_path / "questions.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(QuestionFileError, match="no questions"):
        load_needle_set(tmp_path)


def test_check_needles_reports_broken_questions():
    docs = {
        "course/a.md": "Alpha text.  The first   needle sits here. More.",
        "course/b.md": "Beta text. The second needle sits here.",
    }
    qs = [
        Question("d01", "a.md", "The first   needle sits here.", {}),  # resolved by suffix
        Question("d02", "a.md", "The second needle sits here.", {}),  # in the wrong doc
        Question("d03", "b.md", "Not in the corpus.", {}),
        Question("d04", "c.md", "The second needle sits here.", {}),  # unknown doc
        Question("d05", "a.md", "The first needle sits here.", {}),  # only after collapsing
    ]
    broken = check_needles(qs, docs)
    assert [b.question_id for b in broken] == ["d02", "d03", "d04", "d05"]
    assert broken[0] == BrokenQuestion(
        "d02", "a.md", "needle not in 'course/a.md'; needle found in ['course/b.md']"
    )
    assert broken[1].reason == "needle not in 'course/b.md'; needle occurs nowhere in the corpus"
    assert broken[2].reason.startswith("document 'c.md' is not in the corpus; needle found in")
    assert [b.question_id for b in check_needles(qs, docs, collapse_ws=True)] == [
        "d02",
        "d03",
        "d04",
    ]


def make_beir(tmp_path: Path, gz: bool = True) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = [
        {"_id": "10", "title": "Cats", "text": "Cats purr."},
        {"_id": "11", "text": "No title here."},
        {"_id": 12, "title": "Int id", "text": "Numeric ids are strings."},
    ]
    body = "".join(json.dumps(r) + "\n" for r in corpus)
    if gz:
        with gzip.open(tmp_path / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write(body)
    else:
        (tmp_path / "corpus.jsonl").write_text(body, encoding="utf-8")
    write_jsonl(
        tmp_path / "queries.jsonl",
        [{"_id": "1", "text": "do cats purr?"}, {"_id": "2", "text": "unjudged"},
         {"_id": "3", "text": "ids"}],
    )  # fmt: skip
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n1\t10\t2\n1\t11\t0\n3\t12\t1\n", encoding="utf-8"
    )
    return tmp_path


@pytest.mark.parametrize("gz", [True, False])
def test_load_beir_tmp_fixture(tmp_path, gz):
    b = load_beir(make_beir(tmp_path, gz))
    assert b.corpus == {
        "10": ("Cats", "Cats purr."),
        "11": ("", "No title here."),
        "12": ("Int id", "Numeric ids are strings."),
    }
    assert b.queries == {"1": "do cats purr?", "3": "ids"}  # query 2 has no judgements
    assert b.qrels == {"1": {"10": 2, "11": 0}, "3": {"12": 1}}


@pytest.mark.parametrize(
    ("qrels", "line", "problem"),
    [
        ("query-id\tdoc\tscore\n", 1, "expected header"),
        ("query-id\tcorpus-id\tscore\n1\t10\n", 2, "expected 3 tab-separated fields"),
        ("query-id\tcorpus-id\tscore\n1\t10\t1\n1\t11\thigh\n", 3, "score must be an integer"),
        ("query-id\tcorpus-id\tscore\n9\t10\t1\n", 2, "query-id '9' is not in queries.jsonl"),
        ("query-id\tcorpus-id\tscore\n1\t99\t1\n", 2, "corpus-id '99' is not in the corpus"),
    ],
)
def test_beir_qrels_errors(tmp_path, qrels, line, problem):
    folder = make_beir(tmp_path)
    path = folder / "qrels" / "test.tsv"
    path.write_text(qrels, encoding="utf-8")
    with pytest.raises(QuestionFileError) as err:
        load_beir(folder)
    assert err.value.line == line and err.value.path == path
    assert problem in str(err.value) and f"test.tsv:{line}:" in str(err.value)


def test_beir_corpus_and_query_errors(tmp_path):
    folder = make_beir(tmp_path)
    with gzip.open(folder / "corpus.jsonl.gz", "at", encoding="utf-8") as f:
        f.write('{"_id": "13", "title": "t"}\n')
    with pytest.raises(QuestionFileError, match=r"corpus\.jsonl\.gz:4: missing field 'text'"):
        load_beir(folder)
    (folder / "corpus.jsonl.gz").unlink()
    with pytest.raises(QuestionFileError, match="file not found"):
        load_beir(folder)
    folder = make_beir(tmp_path / "second")
    (folder / "queries.jsonl").write_text('{"_id": "1", "text": "ok"}\n{"_id": "2"}\n')
    with pytest.raises(QuestionFileError, match=r"queries\.jsonl:2: missing field 'text'"):
        load_beir(folder)
    with pytest.raises(QuestionFileError, match=r"qrels/dev\.tsv: file not found"):
        load_beir(make_beir(tmp_path / "third"), split="dev")


@pytest.mark.shared
@needs_shared
def test_shared_course_dev():
    s = load_needle_set(SHARED / "eval" / "course-dev")
    assert len(s.questions) == 32
    assert len(s.queries()) == 64
    assert len({x.query_id for x in s.queries()}) == 64
    assert len(s.out_of_domain) == 50
    kinds = [o.kind for o in s.out_of_domain]
    assert (kinds.count("near"), kinds.count("unrelated")) == (37, 13)
    docs = {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted((SHARED / "corpus" / "course").glob("*.md"))
        if p.name != "README.md"
    }
    assert check_needles(s.questions, docs) == []


@pytest.mark.shared
@needs_shared
def test_shared_pdf_dev_needles_on_their_pages():
    pymupdf = pytest.importorskip("pymupdf")
    s = load_needle_set(SHARED / "eval" / "pdf-dev")
    assert len(s.questions) == 12 and all(x.page for x in s.questions)
    pages: dict[str, list[str]] = {}
    for name in sorted({x.document for x in s.questions}):
        with pymupdf.open(SHARED / "corpus" / "pdf" / name) as doc:
            pages[name] = [page.get_text() for page in doc]
    docs = {name: "\n".join(p) for name, p in pages.items()}
    assert check_needles(s.questions, docs, collapse_ws=True) == []
    assert len(check_needles(s.questions, docs, collapse_ws=False)) > 0  # line breaks matter
    for x in s.questions:
        assert x.page is not None
        one_page = {x.document: pages[x.document][x.page - 1]}
        assert check_needles([x], one_page, collapse_ws=True) == [], x.id


@pytest.mark.shared
@needs_shared
@pytest.mark.parametrize(
    ("name", "docs", "queries", "rows", "grades"),
    [("scifact", 5183, 300, 339, {1}), ("nfcorpus", 3633, 323, 12334, {1, 2})],
)
def test_shared_beir(name, docs, queries, rows, grades):
    b = load_beir(SHARED / "beir" / name)
    assert len(b.corpus) == docs
    assert len(b.queries) == queries and set(b.queries) == set(b.qrels)
    assert sum(len(v) for v in b.qrels.values()) == rows
    assert {g for v in b.qrels.values() for g in v.values()} == grades
