"""The plain text of ``ask`` and ``search`` (issue 31): links that open, how close a refusal
came, the sources below the bar, a line of the quote beside each search hit."""

from __future__ import annotations

from pathlib import Path

from rag_assets.lib.query.cite import Citation, Context, Span
from rag_assets.lib.query.plain import ask_lines, open_link, search_lines, shorten
from rag_assets.lib.types import Hit


def _citation(tmp_path: Path, name: str, fragment: str, line: int | None, **kw) -> Citation:
    path = tmp_path / "docs" / name
    return Citation(
        index=kw.pop("index", 1),
        document_id=name,
        document_name=name,
        locator_label=kw.pop("label", "Guide > Setup"),
        fragment=fragment,
        url=path.resolve().as_uri() + fragment,
        quote=kw.pop("quote", "Install it with pip. It needs nothing else."),
        start=120,
        end=163,
        page=kw.pop("page", None),
        cosine_distance=kw.pop("distance", 0.412),
        rerank_score=None,
        span=kw.pop(
            "span", Span(120, 140, "Install it with pip.", "#char=120,140", "chars 120–140")
        ),
        line=line,
        **kw,
    )


def test_open_link_prefers_the_service_then_path_line(tmp_path: Path) -> None:
    md = _citation(tmp_path, "guide setup.md", "#char=120,163", 7)
    assert open_link(md, cwd=tmp_path) == "docs/guide setup.md:7"  # relative under the cwd
    outside = tmp_path / "elsewhere"
    assert open_link(md, cwd=outside) == "../docs/guide setup.md:7"  # issue 39: never absolute
    base = "http://127.0.0.1:8000/documents/"
    assert open_link(md, base) == (
        "http://127.0.0.1:8000/documents/guide%20setup.md?char=120,140"  # the span, in the view
    )
    pdf = _citation(tmp_path, "report.pdf", "#page=3", None, page=3)
    assert pdf.url.startswith("file://") and pdf.url.endswith("/docs/report.pdf#page=3")
    assert open_link(pdf, cwd=tmp_path) == "docs/report.pdf#page=3"  # issue 39: no file://
    assert open_link(pdf, cwd=outside) == "../docs/report.pdf#page=3"
    sheet = _citation(tmp_path, "prices.xlsx", "#prices!A4:C4", None)
    assert open_link(sheet, cwd=tmp_path) == "docs/prices.xlsx"  # no viewer scrolls to A4
    docx = _citation(tmp_path, "handbook.docx", "#char=5,40", None)
    assert open_link(docx, cwd=tmp_path) == "docs/handbook.docx"


def test_ask_lines_answered_refused_and_below_the_bar(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    c = _citation(tmp_path, "guide.md", "#char=120,163", 7)
    answered = Context("How do I install it?", "prompt", [c], threshold=0.53, nearest_distance=0.41)
    assert ask_lines(answered) == [
        "[1] guide.md  Guide > Setup  docs/guide.md:7  d=0.412",
        '    chars 120–140  "Install it with pip."',
    ]
    assert ask_lines(answered, "Use pip [1].")[:2] == ["Use pip [1].", ""]
    below = _citation(tmp_path, "notes.md", "#char=1,9", 2, distance=0.551)
    refused = Context(
        "How do I tune HNSW?",
        "",
        [],
        no_answer=True,
        threshold=0.53,
        refused_by="distance",
        nearest_distance=0.551,
    )
    assert ask_lines(refused) == [
        'NO ANSWER: nothing under cosine distance 0.53 for "How do I tune HNSW?"',
        "  nearest source at cosine distance 0.551, 0.021 over the cut 0.53: a near miss "
        "(within 0.05); --show-nearest lists the closest sources",
    ]
    refused.nearest = [below]
    lines = ask_lines(refused)
    assert lines[1].endswith("a near miss (within 0.05)")  # no hint: they are listed
    assert lines[2:] == [
        "",
        "below the bar (the cut 0.53): not an answer, not sent to a model",
        "  - notes.md  Guide > Setup  docs/notes.md:2  d=0.551",
        '    chars 120–140  "Install it with pip."',
    ]
    assert not any(line.startswith("[") for line in lines)  # nothing below the bar is numbered


def test_search_lines_show_a_line_of_the_quote(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    long = "word " * 40
    span = Span(120, 320, long, "#char=120,320", "chars 120–320")
    c = _citation(tmp_path, "guide.md", "#char=120,163", 7, span=span)
    hit = Hit(
        chunk_id="x",
        document_id="guide.md",
        section="Setup",
        start=120,
        end=163,
        content=long,
        text=long,
        page=None,
        score=0.0328,
        rank=1,
        retriever="hybrid",
        cosine_distance=0.264,
    )
    assert search_lines([hit], [c], None) == [
        "  1   0.0328 d=0.264 guide.md Setup docs/guide.md:7",
        f'    "{shorten(long, 94)}"',
    ]
    assert shorten(long, 94).endswith("…") and len(shorten(long, 94)) == 94
