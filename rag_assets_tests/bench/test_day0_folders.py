"""The day-0 benchmark folders (issue 53): each folder assembles, the same way twice, from this
machine's Debian files or ../shared (skipped with the reason where they are absent or another
version), and its question set passes the project's own checker with every needle found, plus
the rules of ../shared/eval/README.md (one plain sentence of 40-220 characters, found exactly
once in the folder, no query copying 5 consecutive needle words). No model, no index."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from rag_assets.bench import day0_folders as d0
from rag_assets.lib.evaluate.question_check import check_question_set
from rag_assets.lib.ingest.extract import extract_document
from rag_assets.lib.types import normalize_ws

MARKUP = set("`*_[]<>$\\|{}~#")
SHINGLE = 5
ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "Dr.", "Mr.", "Ms.", "No.")


def _needs_shared(folder: d0.Folder) -> bool:
    paths = list(folder.files + folder.questions + folder.out_of_domain)
    return any(p.startswith(d0.SHARED_PREFIX) for p in paths)


def _param(name: str) -> object:
    folder = d0.FOLDERS[name]
    marks = []
    if _needs_shared(folder):
        marks.append(pytest.mark.shared)
    if folder.kind == "man":
        marks.append(pytest.mark.slow)  # renders each page with groff, a subprocess
    return pytest.param(name, marks=marks, id=name)


Built = tuple[Path, Path]  # (documents folder, question-set folder)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Built]:
    """Assemble a folder and its set once per module; skip with the reason where it cannot be."""
    root = tmp_path_factory.mktemp("day0")
    done: dict[str, Built | str] = {}

    def get(name: str) -> Built:
        if name not in done:
            try:
                done[name] = (
                    d0.assemble(name, root / "documents"),
                    d0.question_set(name, root / "questions"),
                )
            except (d0.FolderUnavailable, d0.SourceChanged) as exc:
                done[name] = str(exc)
        got = done[name]
        if isinstance(got, str):
            pytest.skip(got)
        return got

    return get


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _words(text: str) -> list[str]:
    return [w for w in (t.strip(".,;:!?\"'()[]{}`*_") for t in text.lower().split()) if w]


def _shared_run(needle: str, query: str) -> str | None:
    grams = {tuple(_words(needle)[i : i + SHINGLE]) for i in range(len(_words(needle)))}
    q = _words(query)
    for i in range(len(q) - SHINGLE + 1):
        if tuple(q[i : i + SHINGLE]) in grams:
            return " ".join(q[i : i + SHINGLE])
    return None


def _sentence_breaks(needle: str) -> list[int]:
    hits = []
    for m in re.finditer(r"[.!?][\"')]?\s+[A-Z0-9\"(]", needle):
        head = needle[: m.start() + 1]
        if not head.endswith(ABBREVIATIONS) and not re.search(r"\b[A-Z]\.$", head):
            hits.append(m.start())
    return hits


@pytest.mark.parametrize("name", [_param(n) for n in d0.FOLDERS])
def test_folder_assembles_and_every_needle_is_found(
    name: str, build: Callable[[str], Built], tmp_path: Path
) -> None:
    docs, questions = build(name)
    folder = d0.FOLDERS[name]
    assert len(list(docs.iterdir())) == folder.documents
    # deterministic: a second assembly writes the same bytes
    assert _hashes(d0.assemble(name, tmp_path)) == _hashes(docs)

    extracted: dict[str, tuple[str, str]] = {}  # each document read once (a PDF takes seconds)

    def read(doc_id: str, path: Path) -> tuple[str, str]:
        if doc_id not in extracted:
            doc = extract_document(path, docs)
            assert doc.ok, (doc_id, doc.reason)
            extracted[doc_id] = (doc.kind, doc.text)
        return extracted[doc_id]

    report = check_question_set(questions, docs, read=read)  # the project's checker
    assert report.problems == [], "\n".join(report.lines())
    assert report.found == report.questions >= 20
    kinds = [r["kind"] for r in _rows(questions / "out_of_domain.jsonl")]
    assert kinds.count("near") >= 25 and kinds.count("unrelated") >= 5

    texts = [read(p.name, p) for p in sorted(docs.iterdir())]
    everything = "\n".join(normalize_ws(t) if kind == "pdf" else t for kind, t in texts)
    for row in _rows(questions / "questions.jsonl"):
        needle, qid = row["needle"], row["id"]
        if row["document"].endswith(".pdf"):
            needle = normalize_ws(needle)
        assert 40 <= len(needle) <= 220 and "\n" not in needle, qid
        assert not set(needle) & MARKUP and "://" not in needle, qid
        assert needle.endswith((".", "!", "?", ":")) and not _sentence_breaks(needle), qid
        assert everything.count(needle) == 1, f"{qid}: not exactly once in {name}"
        for phrasing in ("course", "ticket"):
            query = row["queries"][phrasing]
            assert _shared_run(row["needle"], query) is None, (qid, phrasing)


def test_ids_and_queries_are_distinct_across_folders(tmp_path: Path) -> None:
    """Each folder's index is asked every other folder's questions: a query id names one
    question of one folder, and no query text is in two sets."""
    ids: dict[str, str] = {}
    texts: dict[str, str] = {}
    for name in d0.FOLDERS:
        try:
            folder = d0.question_set(name, tmp_path)
        except d0.FolderUnavailable:
            continue  # ../shared absent: its sets are checked where it is there
        rows = _rows(folder / "questions.jsonl") + _rows(folder / "out_of_domain.jsonl")
        for row in rows:
            assert ids.setdefault(row["id"], name) == name, f"id {row['id']} in two folders"
            queries = list(row["queries"].values()) if "queries" in row else [row["query"]]
            for q in queries:
                assert texts.setdefault(q.lower(), name) == name, f"{q!r} in two folders"
    assert len(ids) > 300


def test_unrelated_test_set_is_new() -> None:
    """150 held-out off-topic questions, none the same as a line of the shipped list the
    day-0 rule may be calibrated on, nor as a folder's out-of-domain query."""
    held_out = d0.unrelated_test()
    assert len(held_out) == len({q.lower() for q in held_out}) == 150
    shipped = Path(d0.__file__).parents[1] / "data" / "unrelated_questions.txt"
    calibration = {q.strip().lower() for q in shipped.read_text(encoding="utf-8").splitlines()}
    own = {
        r["query"].lower()
        for n in d0.FOLDERS
        for part in d0.FOLDERS[n].out_of_domain
        if part.startswith(d0.DATA_PREFIX)
        for r in _rows(d0.DATA / part.removeprefix(d0.DATA_PREFIX))
    }
    assert not {q.lower() for q in held_out} & (calibration | own)


def test_every_source_has_its_recorded_sha256() -> None:
    """sources.sha256 (``sha256sum -c`` format) holds exactly the registry's source files."""
    files = {path for folder in d0.FOLDERS.values() for path in folder.files}
    assert set(d0.SOURCES) == files
    assert all(re.fullmatch(r"[0-9a-f]{64}", sha) for sha in d0.SOURCES.values())


def _fake(monkeypatch: pytest.MonkeyPatch, path: str, sha: str) -> None:
    base = d0.FOLDERS["libffi-manual"]
    monkeypatch.setitem(d0.FOLDERS, "fake", replace(base, name="fake", files=(path,)))
    monkeypatch.setitem(d0.SOURCES, path, sha)


def test_a_changed_or_absent_source_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.html"
    page.write_text("<p>another version of the page</p>", encoding="utf-8")
    _fake(monkeypatch, str(page), "0" * 64)
    with pytest.raises(d0.SourceChanged) as changed:
        d0.assemble("fake", tmp_path / "out")
    assert str(page) in str(changed.value) and "\n" not in str(changed.value)
    assert not (tmp_path / "out" / "fake").exists()

    _fake(monkeypatch, str(tmp_path / "gone.html"), "0" * 64)
    with pytest.raises(d0.FolderUnavailable, match="gone.html is absent"):
        d0.assemble("fake", tmp_path / "out")

    _fake(monkeypatch, "../shared/corpus/pdf/x.pdf", "0" * 64)
    with pytest.raises(d0.FolderUnavailable, match="no ../shared beside the repository"):
        d0.assemble("fake", tmp_path / "out", shared=tmp_path / "no-shared")

    sha = hashlib.sha256(page.read_bytes()).hexdigest()
    _fake(monkeypatch, str(page), sha)
    (tmp_path / "out" / "fake").mkdir(parents=True)
    (tmp_path / "out" / "fake" / "stale.html").write_text("old", encoding="utf-8")
    out = d0.assemble("fake", tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == ["page.html"]  # replaced, not merged
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["fake"]  # no work folder left


INFO = (
    "This is t.info, produced by makeinfo.\n\n"
    "\x1f\nFile: t.info,  Node: Top,  Next: Basics,  Up: (dir)\n\nT\n*\n\n"
    "* Menu:\n\n* Basics::  The basics.\n* Index::\n\n"
    "\x1f\nFile: t.info,  Node: Basics,  Next: Detail,  Prev: Top,  Up: Top\n\n"
    "1 Basics\n********\n\n"
    "Wget is a free utility for non-interactive download of files from the\n"
    "Web.  It supports HTTP.\n\n"
    "     wget -r URL\n     wget -c URL\n\n"
    "   • A bullet whose text is long enough that makeinfo had to wrap it\n"
    "     onto a second line.\n"
    "   • Short one.\n\n"
    "* Menu:\n\n* Detail::\n\n"
    "\x1f\nFile: t.info,  Node: Detail,  Prev: Basics,  Up: Basics\n\n"
    "1.1 Detail\n==========\n\n"
    "# a comment line of an example that is long enough to look like filled\n"
    "# text but must stay as it is.\n\n"
    "\x1f\nFile: t.info,  Node: Index,  Prev: Basics,  Up: Top\n\nIndex\n*****\n\nstuff\n"
    "\x1f\nTag Table:\nNode: Top\x7f42\n\x1f\nEnd Tag Table\n"
)


def test_info_chapters_are_markdown_with_one_line_paragraphs() -> None:
    chapters = d0.info_chapters(INFO, skip=("Index",))
    assert chapters == [
        (
            "Basics",
            "# 1 Basics\n\n"
            "Wget is a free utility for non-interactive download of files from the Web."
            "  It supports HTTP.\n\n"
            "     wget -r URL\n     wget -c URL\n\n"
            "   • A bullet whose text is long enough that makeinfo had to wrap it onto a "
            "second line.\n"
            "   • Short one.\n\n"
            "## 1.1 Detail\n\n"
            "# a comment line of an example that is long enough to look like filled\n"
            "# text but must stay as it is.\n",
        )
    ]


@pytest.mark.slow  # groff is a subprocess
def test_a_man_page_renders_with_one_line_paragraphs() -> None:
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed (Debian package groff-base)")
    source = (
        b'.TH FOO 1 2024-01-02 "foo 1.0" "User Commands"\n.SH NAME\nfoo \\- frobnicate files\n'
        b".SH DESCRIPTION\n.B foo\nreads every file named on its command line and frobnicates "
        b"it, which is a long word for changing it in a way that nobody quite understands.\n"
        b".PP\nSecond paragraph.\n.TP\n.B \\-x\nan option\n"
    )
    assert d0.render_man(source) == (
        "FOO(1)   User Commands   FOO(1)\n\nNAME\n       foo - frobnicate files\n\n"
        "DESCRIPTION\n       foo reads every file named on its command line and frobnicates "
        "it, which is a long word for changing it in a way that nobody quite understands.\n\n"
        "       Second paragraph.\n\n       -x     an option\n\nfoo 1.0   2024-01-02   FOO(1)\n"
    )
