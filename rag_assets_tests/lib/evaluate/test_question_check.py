"""``rag-assets questions --check`` (issue 31): every bad row with its place, every needle not
found byte for byte with the nearest text, on the bundled set and on broken copies of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rag_assets.lib.evaluate.question_check import check_question_set, nearest_match
from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets_tests.helpers import SAMPLE_DOCS, SAMPLE_EVAL


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _write(path: Path, rows: list[dict | str]) -> None:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    """The bundled set with one problem of each kind (lines as commented)."""
    folder = tmp_path / "set"
    folder.mkdir()
    rows: list[dict | str] = list(_rows(SAMPLE_EVAL / "questions.jsonl"))
    rows[2]["needle"] = rows[2]["needle"].replace(" ever ", " ")  # line 3: a word dropped
    del rows[4]["queries"]["ticket"]  # line 5
    rows[5]["document"] = "03-versions-and-invalidaton.md"  # line 6: a typo in the name
    rows[6]["needle"] = rows[6]["needle"].replace("A cross-encoder", "A cross\u2011encoder")  # 7
    rows[7]["id"] = rows[1]["id"]  # line 8: a duplicate id
    rows.insert(9, '{"id": "s99", "needle": ')  # line 10: not JSON
    _write(folder / "questions.jsonl", rows)
    ood: list[dict | str] = list(_rows(SAMPLE_EVAL / "out_of_domain.jsonl"))
    ood[3]["kind"] = "far"  # line 4
    _write(folder / "out_of_domain.jsonl", ood)
    return folder


def test_the_bundled_set_passes() -> None:
    report = check_question_set(SAMPLE_EVAL, SAMPLE_DOCS)
    assert report.problems == [] and not report.unusable and not report.foreign
    assert (report.questions, report.ood, report.found) == (12, 22, 12)
    assert report.lines() == [
        f"{SAMPLE_EVAL}: 12 questions, 22 out-of-domain queries; every needle found"
    ]
    assert len(load_needle_set(SAMPLE_EVAL).questions) == report.questions  # same reading


def test_every_problem_is_named_with_its_place(broken: Path) -> None:
    report = check_question_set(broken, SAMPLE_DOCS)
    q, o = str(broken / "questions.jsonl"), str(broken / "out_of_domain.jsonl")
    heads = [(p.path, p.line, p.question_id, p.dropped) for p in report.problems]
    assert sorted(heads, key=lambda h: (h[0], h[1])) == [
        (o, 4, "so04", False),
        (q, 3, "s03", True),
        (q, 5, "s05", False),
        (q, 6, "s06", True),
        (q, 7, "s07", True),
        (q, 8, "s02", False),
        (q, 10, "", False),
    ]
    assert report.unusable  # a bad row: the loaders refuse the whole set
    lines = report.lines()
    assert lines[0] == f"{o}:4: so04: kind must be one of ('near', 'unrelated'), got 'far'"
    assert lines[1] == f"{q}:3: s03: needle not found byte for byte in 02-chunking-strategies.md"
    assert lines[2].startswith('    needle:  "Level-2 headings open sections, and no chunk crosses')
    assert lines[3] == (
        '    nearest: "Level-2 headings open sections, and no chunk ever crosses from one section '
        'into the next." (line 31, 97% alike)'
    )
    raw = (SAMPLE_DOCS / "02-chunking-strategies.md").read_text(encoding="utf-8").splitlines()
    assert "no chunk ever crosses" in raw[31 - 1]  # the line named is the line in the file
    assert (
        lines[4]
        == "    differs at character 46: needle has 'crosses from', the document 'ever crosses'"
    )
    text = "\n".join(lines)
    assert f"{q}:5: s05: missing field 'queries.ticket'" in text
    assert (
        f"{q}:6: s06: document '03-versions-and-invalidaton.md' is not in {SAMPLE_DOCS} "
        "(closest file name: 03-versions-and-invalidation.md)"
    ) in text
    assert "needle has '\\u2011encoder can', the document '-encoder can'" in text  # look-alike
    assert f"{q}:8: s02: duplicate id 's02' (first on line 2)" in text
    assert f"{q}:10: invalid JSON: " in text
    assert lines[-1] == f"{broken}: 4 bad row(s): the set cannot be used until they are fixed"


def test_dropped_needles_only_leave_the_set_usable(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    shutil.copytree(SAMPLE_EVAL, folder)
    rows = _rows(folder / "questions.jsonl")
    rows[0]["needle"] = rows[0]["needle"].replace(" ", "  ", 1)
    _write(folder / "questions.jsonl", rows)
    report = check_question_set(folder, SAMPLE_DOCS)
    assert not report.unusable and [p.question_id for p in report.dropped] == ["s01"]
    assert report.dropped[0].what.endswith(": only its white space differs")
    assert report.lines()[-1].endswith("; 1 question(s) dropped: needle not found")


def test_a_set_for_other_documents_is_named_foreign_in_one_line(tmp_path: Path) -> None:
    other = tmp_path / "docs"
    other.mkdir()
    (other / "notes.md").write_text("# Notes\n\nNothing about pipelines.\n", encoding="utf-8")
    report = check_question_set(SAMPLE_EVAL, other)
    assert report.foreign and not report.unusable and len(report.dropped) == 12
    assert report.lines() == [
        f"{SAMPLE_EVAL}: 12 of 12 needles are not in these documents: the set belongs to "
        "another corpus and is not used"
    ]


def test_pdf_needles_match_with_white_space_collapsed(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    row = {
        "id": "p1",
        "document": "report.pdf",
        "needle": "The audit found three drums.",
        "queries": {"course": "How many drums?", "ticket": "drums count?"},
    }
    _write(folder / "questions.jsonl", [row])
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "report.pdf").write_bytes(b"%PDF-")  # only its name is listed; `read` gives the text
    report = check_question_set(
        folder, docs, read=lambda d, p: ("pdf", "Finding 1. The audit found\nthree drums.")
    )
    assert report.problems == [] and report.found == 1
    report = check_question_set(folder, docs, read=lambda d, p: ("text", "The audit found\nthree"))
    assert report.dropped and "white space" not in report.dropped[0].what


def test_nearest_match_finds_the_edited_sentence() -> None:
    text = "Intro line.\nThe cache is kept for seven days before it is purged.\nOther text."
    start, end, score = nearest_match("The cache is kept for 7 days before it is purged.", text)
    assert text[start:end] == "The cache is kept for seven days before it is purged."
    assert 0.9 < score < 1.0
    assert nearest_match("anything", "") == (0, 0, 0.0)
