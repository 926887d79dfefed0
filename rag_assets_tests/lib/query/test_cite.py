"""Tests for the refusal gate, prompt context and citations (rag_assets.lib.query.cite)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_assets.lib.query.cite import (
    DEFAULT_DISTANCE_CUT,
    MAX_SOURCES,
    NEAR_MISS_MARGIN,
    NEAREST_SHOWN,
    PROMPT_INSTRUCTION,
    Context,
    StaleIndexError,
    build_context,
    document_url,
    fragment_for,
    gate,
    locator_label,
    no_answer_message,
)
from rag_assets.lib.types import Hit

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"

CANON = {
    "guide/intro.md": (
        "# Intro\n\nPipelines hide preprocessing.\n\n## Caching\n\n"
        "The model is cached after the first download.\n"
    ),
    "notes.txt": "Alpha beta gamma.\nDelta epsilon.\n",
}


def make_hit(
    document_id: str = "guide/intro.md",
    needle: str = "Pipelines hide preprocessing.",
    distance: float | None = 0.3,
    *,
    rank: int = 1,
    section: str = "Intro",
    title: str = "Intro",
    page: int | None = None,
    canon: str | None = None,
    rerank_score: float | None = None,
) -> Hit:
    text = canon if canon is not None else CANON[document_id]
    start = text.index(needle)
    return Hit(
        chunk_id=f"{document_id}#{start}",
        document_id=document_id,
        section=section,
        start=start,
        end=start + len(needle),
        content=needle,
        text=f"[{section}]\n{needle}",
        page=page,
        score=1.0 / rank,
        rank=rank,
        retriever="hybrid",
        cosine_distance=distance,
        rerank_score=rerank_score,
        title=title,
    )


def dist_hits(distances: list[float]) -> list[Hit]:
    return [make_hit(distance=d, rank=i + 1) for i, d in enumerate(distances)]


# ---------------------------------------------------------------- gate


def test_gate_keeps_at_most_four_strictly_below_cut_in_order() -> None:
    hits = dist_hits([0.30, 0.70, 0.10, 0.675, 0.50, 0.20, 0.40])
    kept = gate(hits, 0.675)
    assert [h.rank for h in kept] == [1, 3, 5, 6]  # 0.675 itself is not under the cut
    assert [h.cosine_distance for h in kept] == [0.30, 0.10, 0.50, 0.20]
    assert MAX_SOURCES == 4 and DEFAULT_DISTANCE_CUT == 0.675


def test_gate_none_pass_and_keep_parameter() -> None:
    assert gate(dist_hits([0.9, 0.68, 0.675]), 0.675) == []
    assert gate([], 0.675) == []
    assert [h.rank for h in gate(dist_hits([0.1, 0.2, 0.3]), 0.5, keep=2)] == [1, 2]


def test_gate_rejects_hit_without_distance_and_bad_cut() -> None:
    with pytest.raises(ValueError, match="cosine_distance"):
        gate([make_hit(distance=0.1), make_hit(distance=None, rank=2)], 0.675)
    with pytest.raises(ValueError, match="cosine_distance"):
        gate([make_hit(distance=math.nan)], 0.675)
    with pytest.raises(ValueError, match="finite"):
        gate(dist_hits([0.1]), math.nan)


@given(
    st.lists(st.floats(0.0, 2.0), max_size=12),
    st.floats(0.0, 2.0),
    st.integers(0, 6),
)
def test_gate_properties(distances: list[float], cut: float, keep: int) -> None:
    hits = dist_hits(distances)
    kept = gate(hits, cut, keep)
    ranks = [h.rank for h in kept]
    assert ranks == sorted(ranks) and len(kept) <= keep
    assert all(h.cosine_distance is not None and h.cosine_distance < cut for h in kept)
    if len(kept) < keep:  # then nothing below the cut was dropped
        assert len(kept) == sum(d < cut for d in distances)
    if kept:  # nothing below the cut was skipped before the last kept hit
        skipped = [h for h in hits if h.rank <= kept[-1].rank and h.rank not in ranks]
        assert all(h.cosine_distance is not None and h.cosine_distance >= cut for h in skipped)


# ---------------------------------------------------------------- build_context


def build(hits: list[Hit], **kw: object) -> Context:
    return build_context(
        "Is the model downloaded again?",
        hits,
        threshold=0.675,
        canonical_text=CANON.__getitem__,
        **kw,  # type: ignore[arg-type]
    )


def test_build_context_exact_prompt_for_two_sources(tmp_path: Path) -> None:
    hits = [
        make_hit(
            needle="The model is cached after the first download.",
            distance=0.2,
            section="Intro > Caching",
            rerank_score=3.5,
        ),
        make_hit("notes.txt", "Delta epsilon.", 0.6, rank=2, section="", title=""),
        make_hit("notes.txt", "Alpha beta gamma.", 0.7, rank=3, section="", title=""),
    ]
    ctx = build_context(
        "Is the model downloaded again?",
        hits,
        threshold=0.675,
        canonical_text=CANON.__getitem__,
        document_path=lambda d: str(tmp_path / d),
        document_name=lambda d: Path(d).name,
    )
    expected = (
        "Answer using ONLY the numbered sources below, in one to three full sentences that keep "
        "the sources' own wording; end each sentence with [n] for the source it comes from. "
        "If the sources do not contain the answer, say so and stop.\n"
        "\n"
        "[1] (intro.md — Intro > Caching)\n"
        "The model is cached after the first download.\n"
        "\n"
        "[2] (notes.txt — chars 18–32)\n"
        "Delta epsilon.\n"
        "\n"
        "Question: Is the model downloaded again?"
    )
    assert ctx.prompt == expected
    assert ctx.prompt == f"{PROMPT_INSTRUCTION}\n\n{ctx.user_message}"
    assert not ctx.no_answer and ctx.threshold == 0.675 and ctx.message == ""
    assert [c.index for c in ctx.citations] == [1, 2]
    c1 = ctx.citations[0]
    assert c1.quote == hits[0].content and c1.quote != hits[0].text
    assert "[Intro > Caching]" not in ctx.prompt  # the embedding header never reaches the model
    assert (c1.start, c1.end) == (52, 97)
    assert c1.fragment == "#char=52,97"
    assert c1.url == (tmp_path / "guide/intro.md").as_uri() + "#char=52,97"
    assert (c1.cosine_distance, c1.rerank_score, c1.page) == (0.2, 3.5, None)


def test_citation_to_dict_keys_exact() -> None:
    ctx = build([make_hit()], base_url="https://docs.example/")
    d = ctx.citations[0].to_dict()
    assert list(d) == [
        "index",
        "chunk_id",
        "document_id",
        "document_name",
        "section",
        "locator_label",
        "fragment",
        "url",
        "quote",
        "from",
        "to",
        "page",
        "cosine_distance",
        "rerank_score",
        "ocr",  # issue 14: the quote was OCR'd, with its page's confidence
        "ocr_confidence",
        "span",  # issue 21: the pinpoint inside the chunk
        "line",  # issue 31: the line `path:LINE` opens (text documents)
    ]
    assert list(d["span"]) == ["from", "to", "text", "fragment", "label", "page", "chosen_by"]
    assert (d["from"], d["to"]) == (9, 38) and d["document_name"] == "guide/intro.md"
    assert json.loads(json.dumps(ctx.to_dict()))["citations"][0] == d


def _three(distances: tuple[float, float, float]) -> list[Hit]:
    """Three distinct chunks (two documents) at the given distances, ranks 1..3."""
    cached = "The model is cached after the first download."
    return [
        make_hit(needle=cached, distance=distances[0], section="Intro > Caching"),
        make_hit("notes.txt", "Delta epsilon.", distances[1], rank=2, section="", title=""),
        make_hit("notes.txt", "Alpha beta gamma.", distances[2], rank=3, section="", title=""),
    ]


def test_refusal_says_how_close_it_came(tmp_path: Path) -> None:
    """Issue 31: the nearest distance and the cut with every refusal; a near miss is one
    whose nearest source is less than NEAR_MISS_MARGIN over the cut."""
    near = build(_three((0.70, 0.69, 0.80)), document_path=lambda d: str(tmp_path / d))
    assert near.no_answer and near.nearest_distance == 0.69 and near.threshold == 0.675
    assert NEAR_MISS_MARGIN == 0.05 and near.near_miss
    assert near.closeness == (
        "nearest source at cosine distance 0.690, 0.015 over the cut 0.675: "
        "a near miss (within 0.05)"
    )
    assert near.nearest == []  # listed only when asked for
    far = build(_three((0.80, 0.726, 0.90)), document_path=lambda d: str(tmp_path / d))
    assert far.no_answer and not far.near_miss and far.nearest_distance == 0.726
    assert far.closeness == "nearest source at cosine distance 0.726, 0.051 over the cut 0.675"
    answered = build(_three((0.2, 0.69, 0.8)), document_path=lambda d: str(tmp_path / d))
    assert not answered.no_answer and not answered.near_miss and answered.closeness == ""
    assert answered.nearest_distance == 0.2
    empty = build([], document_path=lambda d: str(tmp_path / d))
    assert empty.nearest_distance is None and empty.closeness == "nothing retrieved (cut 0.675)"


def test_show_nearest_lists_below_the_bar_apart_from_the_prompt(tmp_path: Path) -> None:
    """Issue 31: the closest sources that did not pass, by distance, unnumbered, marked below
    the bar, and never in the prompt (the refused question has no prompt at all)."""
    path = {"document_path": lambda d: str(tmp_path / d)}
    refused = build(_three((0.80, 0.69, 0.70)), show_nearest=True, **path)
    assert refused.no_answer and refused.prompt == "" and refused.citations == []
    assert [c.quote for c in refused.nearest] == [
        "Delta epsilon.",
        "Alpha beta gamma.",
        "The model is cached after the first download.",
    ]  # by distance: 0.69, 0.70, 0.80 (NEAREST_SHOWN = 3)
    assert NEAREST_SHOWN == 3
    rows = refused.to_dict()["nearest"]
    assert [r["below_the_bar"] for r in rows] == [True, True, True]
    assert all("index" not in r for r in rows)  # never a [n] to cite
    assert [round(r["over_cut"], 3) for r in rows] == [0.015, 0.025, 0.125]
    answered = build(_three((0.2, 0.69, 0.8)), show_nearest=True, **path)
    assert [c.quote for c in answered.citations] == [
        "The model is cached after the first download."
    ]
    assert [c.quote for c in answered.nearest] == ["Delta epsilon.", "Alpha beta gamma."]
    for c in answered.nearest:
        assert c.quote not in answered.prompt  # below the bar: never sent to a model


def test_a_judge_refusal_lists_what_the_judge_refused_below_its_bar(tmp_path: Path) -> None:
    ctx = build(
        _three((0.2, 0.69, 0.8)), show_nearest=True, document_path=lambda d: str(tmp_path / d)
    )
    verdict = {"answers": False, "score": 0.1, "cut": 0.5}
    refused = ctx.refused_by_judge(verdict, show_nearest=True)
    assert refused.no_answer and refused.refused_by == "judge" and refused.citations == []
    assert refused.prompt == "" and not refused.near_miss
    assert [c.cosine_distance for c in refused.nearest] == [0.2, 0.69, 0.8]  # judged first
    assert refused.closeness == "nearest source at cosine distance 0.200 (under the cut 0.675)"
    assert ctx.refused_by_judge(verdict).nearest == []  # only when asked for


def test_citation_line_is_the_spans_line_in_text_documents(tmp_path: Path) -> None:
    """Issue 31: ``line`` (what ``path:LINE`` opens) for line-based kinds only."""
    hit = make_hit(needle="The model is cached after the first download.")
    text = CANON["guide/intro.md"]
    ctx = build(
        [hit],
        document_path=lambda d: str(tmp_path / d),
        document_locators=lambda d: ("markdown", []),
    )
    c = ctx.citations[0]
    assert c.line == 7 == text[: c.span.start].count("\n") + 1  # type: ignore[union-attr]
    assert text.splitlines()[c.line - 1] == "The model is cached after the first download."
    pdfish = build(
        [hit], document_path=lambda d: str(tmp_path / d), document_locators=lambda d: ("docx", [])
    )
    assert pdfish.citations[0].line is None


def test_citation_line_counts_the_front_matter_taken_out(tmp_path: Path) -> None:
    """Issue 34 took a Markdown file's front matter out of its canonical text (offsets count
    from the body); ``path:LINE`` must still open the file's own line (a ``body`` locator)."""
    from rag_assets.lib.ingest.extract import extract_document

    src = tmp_path / "guide.md"
    src.write_text(
        "---\ntitle: Guide\ntags: [ops, howto]\n---\n# Intro\n\nPipelines hide preprocessing."
        "\n\n## Caching\n\nThe model is cached after the first download.\n"
    )
    doc = extract_document(src, tmp_path)
    assert (
        doc.ok and not doc.text.startswith("---") and doc.front_matter["tags"] == ["ops", "howto"]
    )
    needle = "The model is cached after the first download."
    hit = make_hit(document_id="guide.md", needle=needle, canon=doc.text)
    ctx = build_context(
        "Is the model downloaded again?",
        [hit],
        threshold=0.675,
        document_path=lambda d: str(tmp_path / d),
        canonical_text=lambda d: doc.text,
        document_locators=lambda d: (doc.kind, doc.locators),
    )
    line = ctx.citations[0].line
    assert line == 11
    assert src.read_text().splitlines()[line - 1] == needle  # the file's line, front matter above


def test_no_answer_context_and_message() -> None:
    ctx = build([make_hit(distance=0.675), make_hit(distance=0.9, rank=2)])
    assert ctx.no_answer and ctx.citations == [] and ctx.prompt == ""
    msg = 'NO ANSWER: nothing under cosine distance 0.675 for "Is the model downloaded again?"'
    assert ctx.message == msg == no_answer_message("Is the model downloaded again?", 0.675)


def test_fragments_and_pdf_locators() -> None:
    canon = "page one text\fpage two starts here and goes on\f"
    text_hit = make_hit(needle="gamma", document_id="notes.txt", section="", title="")
    assert fragment_for(text_hit) == "#char=11,16"
    pdf = make_hit(
        "paper.pdf", "two starts", page=2, section="Paper > Method", title="Paper", canon=canon
    )
    assert fragment_for(pdf) == "#page=2"
    assert locator_label(pdf) == "Paper > Method, p. 2"
    assert locator_label(make_hit("p.pdf", "two", page=2, section="", title="", canon=canon)) == (
        "p. 2"
    )
    # a bare section name is prefixed with the title; an existing path is kept as is
    assert locator_label(make_hit(section="Caching", title="Intro")) == "Intro > Caching"
    assert locator_label(make_hit(section="Intro > Caching", title="Intro")) == "Intro > Caching"
    assert locator_label(make_hit(section="Intro", title="Intro")) == "Intro"


def test_document_url_base_url_vs_file_uri(tmp_path: Path) -> None:
    assert (
        document_url("sub dir/a#b.md", "https://docs.example/kb", None)
        == "https://docs.example/kb/sub%20dir/a%23b.md"
    )
    assert document_url("a.md", "https://docs.example/kb/", "/ignored") == (
        "https://docs.example/kb/a.md"
    )
    uri = document_url("sub dir/a.md", None, str(tmp_path / "sub dir" / "a.md"))
    assert uri.startswith("file:///") and uri.endswith("/sub%20dir/a.md")
    assert Path(url2pathname(urlparse(uri).path)) == tmp_path / "sub dir" / "a.md"
    ctx = build([make_hit()], base_url="https://docs.example/kb")
    assert ctx.citations[0].url == "https://docs.example/kb/guide/intro.md#char=9,38"
    with pytest.raises(ValueError, match="base_url or document_path"):
        build([make_hit()])


def test_quote_verification_catches_stale_index() -> None:
    stale = make_hit(needle="Pipelines hide preprocessing.")
    edited = dict(CANON, **{"guide/intro.md": "# Intro\n\nPipelines now do preprocessing.\n"})
    with pytest.raises(StaleIndexError, match=r"stale index.*guide/intro\.md"):
        build_context(
            "q", [stale], threshold=0.675, canonical_text=edited.__getitem__, base_url="https://x"
        )
    shrunk = dict(CANON, **{"guide/intro.md": "# Intro\n"})
    with pytest.raises(StaleIndexError, match="out of range"):
        build_context(
            "q", [stale], threshold=0.675, canonical_text=shrunk.__getitem__, base_url="https://x"
        )


def test_canonical_text_read_once_per_document() -> None:
    calls: list[str] = []

    def canonical(doc: str) -> str:
        calls.append(doc)
        return CANON[doc]

    hits = [make_hit(rank=1), make_hit(needle="The model is cached", rank=2)]
    build_context("q", hits, threshold=0.675, canonical_text=canonical, base_url="https://x")
    assert calls == ["guide/intro.md"]


# ---------------------------------------------------------------- real files


def _file_of(url: str) -> Path:
    return Path(url2pathname(unquote(urlparse(url).path)))


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "eval/course-dev").exists(), reason="needs ../shared corpus")
def test_real_markdown_citations_resolve_to_the_quoted_text() -> None:
    """Needles from the eval set: each citation's file URI + #char fragment selects the quote."""
    docs = (SHARED / "corpus/course").resolve()
    rows = [json.loads(x) for x in (SHARED / "eval/course-dev/questions.jsonl").open()][:6]
    hits = []
    for i, row in enumerate(rows):
        canon = (docs / row["document"]).read_text(encoding="utf-8")
        hits.append(
            make_hit(
                row["document"],
                row["needle"],
                0.1 * i,
                rank=i + 1,
                section="",
                title="",
                canon=canon,
            )
        )
    ctx = build_context(
        rows[0]["queries"]["course"],
        hits,
        threshold=DEFAULT_DISTANCE_CUT,
        canonical_text=lambda d: (docs / d).read_text(encoding="utf-8"),
        document_path=lambda d: str(docs / d),
    )
    assert len(ctx.citations) == MAX_SOURCES  # distances 0.0..0.3 pass; 0.4, 0.5 are cut by keep
    for c, row in zip(ctx.citations, rows, strict=False):
        a, b = map(int, c.fragment.removeprefix("#char=").split(","))
        path = _file_of(c.url.split("#")[0])
        assert path.is_file() and path.read_text(encoding="utf-8")[a:b] == c.quote
        assert c.quote == row["needle"] and f"[{c.index}] ({row['document']} — " in ctx.prompt


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "corpus/pdf").exists(), reason="needs ../shared corpus")
def test_real_pdf_citation_points_at_the_page_holding_the_quote() -> None:
    pymupdf = pytest.importorskip("pymupdf")
    pdf = (SHARED / "corpus/pdf/nist-fips-197-aes-2001.pdf").resolve()
    with pymupdf.open(pdf) as doc:
        pages = [p.get_text() for p in doc]
    canon = "".join(pages)
    page = 3
    offset = sum(len(p) for p in pages[: page - 1])
    quote = pages[page - 1].strip().split("\n")[0]
    hit = make_hit(pdf.name, quote, 0.2, page=page, section="", title="", canon=canon)
    hit.start = offset + pages[page - 1].index(quote)
    hit.end = hit.start + len(quote)
    ctx = build_context(
        "q",
        [hit],
        threshold=0.675,
        canonical_text=lambda d: canon,
        document_path=lambda d: str(pdf),
    )
    c = ctx.citations[0]
    assert c.fragment == f"#page={page}" and c.locator_label == f"p. {page}"
    with pymupdf.open(_file_of(c.url.split("#")[0])) as doc:
        assert quote in doc[int(c.fragment.removeprefix("#page=")) - 1].get_text()


# ---------------------------------------------------------------- pinpoint spans (issue 21)

FAQ = (
    "# Museum FAQ\n\nThe museum opens at nine on weekdays and at ten on Sundays. "
    "Tickets cost twelve euros for adults and are free for children under six. "
    "Every gallery has step-free access and lifts.\n"
)


def _hit_of(doc, chunk, rank: int = 1) -> Hit:  # type: ignore[no-untyped-def]
    return Hit(chunk.chunk_id, doc.document_id, chunk.section, chunk.start, chunk.end,
               chunk.content, chunk.text, chunk.page, 1.0 / rank, rank, "hybrid",
               cosine_distance=0.2, title=doc.title)  # fmt: skip


def _cite(docs: dict, question: str, hits: list[Hit], **kw: object) -> list:  # type: ignore[type-arg]
    from rag_assets.lib.query.cite import cite_hits

    return cite_hits(
        question,
        hits,
        canonical_text=lambda d: docs[d].text,
        document_path=lambda d: docs[d].path,
        document_locators=lambda d: (docs[d].kind, docs[d].locators),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def every_format(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    """One small real file of every format (no OCR: that is the extractor's test), extracted
    and chunked once."""
    from rag_assets.lib.ingest.chunk import chunk_document, strategy
    from rag_assets.lib.ingest.extract import extract_folder
    from rag_assets_tests.lib import format_files as ff

    root = tmp_path_factory.mktemp("formats")
    (root / "faq.md").write_text(FAQ, encoding="utf-8")
    (root / "notes.txt").write_text(CANON["notes.txt"] * 3, encoding="utf-8")
    for write in (ff.write_vtt, ff.write_srt, ff.write_csv, ff.write_xlsx, ff.write_html,
                  ff.write_docx, ff.write_report_pdf):  # fmt: skip
        write(root)
    docs = {d.document_id: d for d in extract_folder(root).documents if d.ok}
    chunks = {d: chunk_document(doc, strategy("E")) for d, doc in docs.items()}
    return {"docs": docs, "chunks": chunks}


def test_every_format_is_in_the_span_property_fixture(every_format: dict) -> None:  # type: ignore[type-arg]
    kinds = {d.kind for d in every_format["docs"].values()}
    assert {"markdown", "text", "vtt", "srt", "csv", "xlsx", "html", "docx", "pdf"} <= kinds


@given(data=st.data())
def test_span_is_exact_and_inside_its_chunk_on_every_format(
    every_format: dict,  # type: ignore[type-arg]
    data: st.DataObject,
) -> None:
    """Property: for any question and any cited chunks of any format, every span's text is
    ``canonical[from:to]``, lies inside its chunk, starts and ends on word boundaries, and has a
    locator of its own."""
    docs, chunks = every_format["docs"], every_format["chunks"]
    ids = data.draw(st.lists(st.sampled_from(sorted(docs)), min_size=1, max_size=4))
    hits = [
        _hit_of(docs[d], data.draw(st.sampled_from(chunks[d])), rank)
        for rank, d in enumerate(ids, start=1)
    ]
    words = sorted({w for h in hits for w in h.content.split()})
    question = " ".join(data.draw(st.lists(st.sampled_from(words), max_size=6)))
    scoring = data.draw(st.sampled_from(["lexical", "zero"]))
    scorer = (lambda q, ts: [0.0] * len(ts)) if scoring == "zero" else None
    for hit, c in zip(hits, _cite(docs, question, hits, span_scorer=scorer), strict=True):
        span, text = c.span, docs[hit.document_id].text
        assert span is not None and span.text == text[span.start : span.end]
        assert hit.start <= span.start < span.end <= hit.end and span.text.strip() == span.text
        assert span.start == hit.start or not (
            text[span.start - 1].isalnum() and text[span.start].isalnum()
        )
        assert span.end == hit.end or not (
            text[span.end - 1].isalnum() and text[span.end].isalnum()
        )
        assert span.fragment.startswith("#") and span.label
        kind = docs[hit.document_id].kind
        if kind in ("vtt", "srt"):
            assert span.fragment.startswith("#t=")
        elif kind in ("csv", "xlsx"):
            assert "!" in span.fragment and span.label in unquote(span.fragment)
        elif kind == "pdf":
            assert span.fragment == f"#page={span.page}" and span.page >= hit.page  # type: ignore[operator]
            assert span.label.startswith(f"p. {span.page}, chars ")
        elif kind == "html":
            assert span.fragment.startswith("#:~:text=")
        else:
            assert span.fragment == f"#char={span.start},{span.end}"
        assert c.quote == hit.content  # the quote stays the chunk's own content


def test_span_picks_the_answering_sentence_row_and_cue(every_format: dict) -> None:  # type: ignore[type-arg]
    docs, chunks = every_format["docs"], every_format["chunks"]

    def span_for(doc_id: str, words: str, question: str):  # type: ignore[no-untyped-def]
        chunk = next(c for c in chunks[doc_id] if words in c.content)
        return _cite(docs, question, [_hit_of(docs[doc_id], chunk)])[0].span

    s = span_for("faq.md", "Tickets", "How much is a ticket for adults?")
    assert s.text == "Tickets cost twelve euros for adults and are free for children under six."
    assert s.fragment == f"#char={s.start},{s.end}" and s.label == f"chars {s.start}–{s.end}"
    row = span_for("prices.csv", "kettle", "what does the copper kettle cost")
    assert row.text == "sku: C3; product: copper kettle; price: 41"
    assert row.fragment == "#prices!A4:C4" and row.label == "prices!A4:C4"
    cue = span_for("lecture.vtt", "walrus", "how much storage does the walrus index bill")
    assert cue.text == "That doubles the storage bill of the walrus index."
    assert cue.fragment == "#t=135,158.9" and cue.label == "2:15.0–2:38.9"


def test_span_of_a_pdf_on_a_later_page_names_that_page(every_format: dict) -> None:  # type: ignore[type-arg]
    """A quote that crosses a page break (the chunker keeps pages apart, a stored span from an
    older chunker may not): the span's page is the one its sentence is on."""
    docs, chunks = every_format["docs"], every_format["chunks"]
    pdf = next(d for d in docs.values() if d.kind == "pdf")
    first, later = chunks[pdf.document_id][0], chunks[pdf.document_id][-1]
    assert later.page is not None and later.page > first.page  # type: ignore[operator]
    content = pdf.text[first.start : later.end]
    wide = Hit("wide", pdf.document_id, first.section, first.start, later.end, content,
               content, first.page, 1.0, 1, "hybrid", cosine_distance=0.2)  # fmt: skip
    question = later.content  # its numbers tell it from the same sentence on earlier pages
    s = _cite(docs, question, [wide])[0].span
    assert s.page == pdf.page_at(s.start) == later.page and s.fragment == f"#page={later.page}"


def test_span_ties_go_to_the_earliest_and_short_sentences_extend() -> None:
    from rag_assets.lib.query.cite import MIN_SPAN_CHARS, choose_spans

    text = "Yes. The first long enough sentence is here. Another one follows it."
    units = [(0, 4), (5, 44), (45, len(text))]
    zero = lambda q, ts: [0.0] * len(ts)  # noqa: E731
    assert choose_spans("q", [(0, len(text), text, units)], zero) == [(0, 44)]  # "Yes." + next
    assert MIN_SPAN_CHARS > 4
    last = lambda q, ts: [0.0, 0.0, 1.0]  # noqa: E731
    assert choose_spans("q", [(0, len(text), text, units)], last) == [(45, len(text))]
    assert choose_spans("q", [(0, 3, "abc", [])], zero) == [(0, 3)]  # no candidates: the chunk


def test_lexical_scores_prefer_rare_question_words() -> None:
    from rag_assets.lib.query.cite import lexical_scores

    texts = ["the museum opens at nine", "tickets cost twelve euros", "the museum has lifts"]
    scores = lexical_scores("How much do tickets cost at the museum?", texts)
    assert scores.index(max(scores)) == 1 and min(scores) > 0
    assert lexical_scores("zebra", texts) == [0.0, 0.0, 0.0] and lexical_scores("x", []) == []


def test_span_scorer_names() -> None:
    from rag_assets.lib.query.cite import lexical_scores, span_scorer

    assert span_scorer("lexical") is lexical_scores
    with pytest.raises(ValueError, match="must be one of lexical, dense, mix"):
        span_scorer("fuzzy")
    with pytest.raises(ValueError, match="needs the query encoder"):
        span_scorer("dense")


@pytest.mark.slow
def test_dense_and_mix_span_scoring_on_the_real_encoder(real_embedder) -> None:  # type: ignore[no-untyped-def]
    from rag_assets.lib.ingest.formats.locate import span_units
    from rag_assets.lib.query.cite import choose_spans, span_scorer

    units = span_units("markdown", [], 0, len(FAQ), FAQ)

    def pick(question: str, name: str) -> str:
        ((a, b),) = choose_spans(
            question, [(0, len(FAQ), FAQ, units)], span_scorer(name, real_embedder)
        )
        return FAQ[a:b]

    cases = {
        "How much is a ticket for an adult?": "Tickets cost twelve euros",
        "What time does the museum open on Sunday?": "The museum opens at nine",
        "Can I get to every gallery in a wheelchair?": "Every gallery has step-free",
    }
    for name in ("dense", "mix"):
        for question, start in cases.items():
            assert pick(question, name).startswith(start), (name, question)
    # no content word shared with its answer: only the encoder finds it (the mix, half lexical,
    # follows the shared "for" to the ticket sentence, as lexical scoring does)
    wheelchair = "Is the building accessible for wheelchair users?"
    assert pick(wheelchair, "dense") == "Every gallery has step-free access and lifts."


def test_span_window_covers_the_best_run_of_candidates() -> None:
    from rag_assets.lib.query.cite import choose_spans

    text = "One long first sentence is here. Second long sentence is here. Third long one here."
    units = [(0, 32), (33, 62), (63, len(text))]
    by = lambda q, ts: [0.0, 1.0, 0.9]  # noqa: E731
    assert choose_spans("q", [(0, len(text), text, units)], by, 2) == [(33, len(text))]
    assert choose_spans("q", [(0, len(text), text, units)], by, 1) == [(33, 62)]
    assert choose_spans("q", [(0, len(text), text, units)], by, 5) == [(0, len(text))]
    with pytest.raises(ValueError, match="window must be >= 1"):
        choose_spans("q", [(0, len(text), text, units)], by, 0)


def test_answer_claims_split_sentences_and_keep_markers_after_the_full_stop() -> None:
    from rag_assets.lib.query.cite import answer_claims

    text = (
        "Adults pay twelve euros [1]. Children under six go free. [1, 2]\n"
        "Lifts serve every gallery [2]! Nothing else [3]"
    )
    assert answer_claims(text) == {
        1: "Adults pay twelve euros . Children under six go free.",
        2: "Children under six go free. Lifts serve every gallery !",
        3: "Nothing else",
    }
    assert answer_claims("[4]") == {}  # a marker with no words claims nothing
    # no marker anywhere: the whole answer is claimed for every source it was written from
    assert answer_claims("No markers.  At all.", [1, 2]) == {
        1: "No markers. At all.",
        2: "No markers. At all.",
    }
    assert answer_claims("No markers at all.") == {} and answer_claims("", [1]) == {}


def test_the_answer_rechooses_the_span_of_the_chunks_it_cites(every_format: dict) -> None:  # type: ignore[type-arg]
    """The question's words pick the opening-hours sentence; the model's claim, citing [1],
    words it as the ticket sentence does, and that sentence becomes the span. An uncited chunk
    keeps the question's span, and the property of every span still holds."""
    from rag_assets.lib.query.cite import ground_spans

    docs, chunks = every_format["docs"], every_format["chunks"]
    faq = next(c for c in chunks["faq.md"] if "Tickets" in c.content)
    row = next(c for c in chunks["prices.csv"] if "kettle" in c.content)
    hits = [_hit_of(docs["faq.md"], faq, 1), _hit_of(docs["prices.csv"], row, 2)]
    question = "When can I visit the museum on weekdays and what do I pay?"
    cited = _cite(docs, question, hits)
    assert cited[0].span.text.startswith("The museum opens at nine")
    assert cited[0].span.chosen_by == "question"
    answer = "Adults pay twelve euros for tickets; children under six are free [1]."
    grounded = ground_spans(
        question,
        cited,
        answer,
        canonical_text=lambda d: docs[d].text,
        document_locators=lambda d: (docs[d].kind, docs[d].locators),
    )
    s = grounded[0].span
    assert s.text == "Tickets cost twelve euros for adults and are free for children under six."
    assert s.chosen_by == "answer" and s.to_dict()["chosen_by"] == "answer"
    assert (
        s.text == docs["faq.md"].text[s.start : s.end] and faq.start <= s.start < s.end <= faq.end
    )
    assert s.fragment == f"#char={s.start},{s.end}"
    assert grounded[1] == cited[1]  # not cited by the answer: unchanged
    assert grounded[0].quote == cited[0].quote and grounded[0].fragment == cited[0].fragment
    bare = ground_spans(question, cited, "[1] [2]", canonical_text=lambda d: "")
    assert bare == cited  # markers without words: nothing to choose by
    unmarked = ground_spans(  # no marker at all: the answer's words choose in every chunk
        question,
        cited,
        "Adults pay twelve euros for tickets; children under six are free.",
        canonical_text=lambda d: docs[d].text,
        document_locators=lambda d: (docs[d].kind, docs[d].locators),
    )
    assert unmarked[0].span == s and unmarked[1].span.chosen_by == "answer"


def test_dense_span_scoring_embeds_candidates_as_passages_on_the_query_encoder() -> None:
    """An asymmetric model (embeddinggemma: different query and document prompts) must see the
    candidate sentences as documents; through the ONNX query encoder when one is set, so the
    query process still loads no torch."""
    import numpy as np

    from rag_assets.lib.index.embed import Embedder, ModelSpec
    from rag_assets.lib.query.cite import dense_scorer

    seen: list[str] = []

    class Recorder:  # stands in for the ONNX query encoder: records what it is given
        def encode(self, texts):  # type: ignore[no-untyped-def]
            seen.extend(texts)
            return np.eye(len(texts), 4, dtype=np.float32)

    spec = ModelSpec("test/asym", Path("."), "rev", 4, query_prompt="Q: ", document_prompt="D: ")
    emb = Embedder(spec, query_encoder=Recorder())
    scores = dense_scorer(emb)("what is it", ["first one", "second one"])
    assert seen == ["Q: what is it", "D: first one", "D: second one"]
    assert scores == [1.0, 0.0]  # the query's vector is e0, the candidates e0 and e1
    assert "model" not in emb.__dict__  # the torch model was never loaded
