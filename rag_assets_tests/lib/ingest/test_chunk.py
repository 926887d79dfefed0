"""Tests for rag_assets.lib.ingest.chunk: hand-computed spans per strategy, properties."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_assets.lib.ingest.chunk import (
    CHUNKER_VERSION,
    PRESETS,
    ChunkStrategy,
    chunk_document,
    chunk_documents,
    chunk_id,
    strategy,
)
from rag_assets.lib.types import Chunk, ExtractedDocument, Heading, sha256_text

_HEADING_LINE = re.compile(r"(#{1,2}) (.*)")


def local_headings(text: str) -> list[Heading]:
    """Level-1/2 ``# ``/``## `` heading lines outside ```/~~~ fences (spans without newline)."""
    heads: list[Heading] = []
    fence = ""
    pos = 0
    for line in text.split("\n"):
        start, pos = pos, pos + len(line) + 1
        s = line.strip()
        if fence:
            if s.startswith(fence) and not s.lstrip(fence[0]):
                fence = ""
        elif s.startswith(("```", "~~~")):
            fence = s[: len(s) - len(s.lstrip(s[0]))]
        elif m := _HEADING_LINE.fullmatch(line):
            heads.append(Heading(len(m.group(1)), m.group(2).strip(), start, start + len(line)))
    return heads


def make_doc(text: str, document_id: str = "doc.md", headings: list[Heading] | None = None):
    """An ok Markdown ExtractedDocument as the extractor would produce it."""
    heads = local_headings(text) if headings is None else headings
    title = next((h.title for h in heads if h.level == 1), "")
    return ExtractedDocument(
        document_id=document_id,
        path=f"/docs/{document_id}",
        kind="markdown",
        status="ok",
        reason=None,
        extractor="markdown",
        extractor_version="markdown-1",
        source_hash=sha256_text(text),
        title=title,
        text=text,
        headings=heads,
    )


# offsets:  "# Guide" 0-7 | "Intro text here." 9-25 | "## Setup" 27-35
# "Install it. Then run it now." 37-65 | "```py" 67-72 | "x = 1" 73-78 | (blank) 79
# "## not a heading" 80-96 | "```" 97-100 | "## Usage" 102-110 | "| a | b |" 112-121
# "| 1 | 2 |" 122-131 | "Done." 133-138 | len 139
DOC = (
    "# Guide\n\nIntro text here.\n\n## Setup\n\nInstall it. Then run it now.\n\n"
    "```py\nx = 1\n\n## not a heading\n```\n\n## Usage\n\n| a | b |\n| 1 | 2 |\n\nDone.\n"
)


def spans(chunks: list[Chunk]) -> list[tuple[str, int, int]]:
    return [(c.section, c.start, c.end) for c in chunks]


def test_hand_example_headings():
    assert len(DOC) == 139
    assert local_headings(DOC) == [
        Heading(1, "Guide", 0, 7),
        Heading(2, "Setup", 27, 35),
        Heading(2, "Usage", 102, 110),
    ]


def test_hand_example_C_and_E_target_40():
    doc = make_doc(DOC)
    expected = [("Guide", 9, 25), ("Setup", 37, 65), ("Setup", 67, 100), ("Usage", 112, 138)]
    c = chunk_document(doc, strategy("C", 40))
    e = chunk_document(doc, strategy("E", 40))
    assert spans(c) == expected and spans(e) == expected
    # the code block (blank line and "## " inside) is one paragraph, table + "Done." pack
    assert c[2].content == "```py\nx = 1\n\n## not a heading\n```"
    assert c[3].content == "| a | b |\n| 1 | 2 |\n\nDone."
    assert [x.text for x in c] == [x.content for x in c]
    assert e[0].text == "[Guide]\nIntro text here."
    assert e[1].text == "[Guide > Setup]\nInstall it. Then run it now."
    assert e[3].text == "[Guide > Usage]\n| a | b |\n| 1 | 2 |\n\nDone."


def test_hand_example_C_target_512_packs_prose_with_code():
    chunks = chunk_document(make_doc(DOC), strategy("C"))
    assert spans(chunks) == [("Guide", 9, 25), ("Setup", 37, 100), ("Usage", 112, 138)]


def test_hand_example_C_target_20_sentence_and_line_fallback():
    chunks = chunk_document(make_doc(DOC), strategy("C", 20))
    assert [(c.start, c.end) for c in chunks] == [
        (9, 25),  # "Intro text here." (16)
        (37, 48),  # "Install it." - paragraph of 28 split at the sentence end
        (49, 65),  # "Then run it now."
        (67, 78),  # "```py\nx = 1" - code of 33 split at line ends only
        (80, 100),  # "## not a heading\n```" (exactly 20)
        (112, 131),  # table (19)
        (133, 138),  # "Done." (19 + 2 + 5 > 20)
    ]


def test_hand_example_A_blind_target_20():
    chunks = chunk_document(make_doc(DOC), strategy("A", 20))
    # each section body is trimmed, cut every 20 chars from its first char, pieces trimmed
    assert spans(chunks) == [
        ("Guide", 9, 25),
        ("Setup", 37, 57),  # "Install it. Then run"
        ("Setup", 58, 76),  # [57, 77) = " it now.\n\n```py\nx = " trimmed
        ("Setup", 77, 96),  # [77, 97) = "1\n\n## not a heading\n" trimmed
        ("Setup", 97, 100),
        ("Usage", 112, 131),  # [112, 132) trimmed
        ("Usage", 133, 138),
    ]


def test_hand_example_D_overlap_8_target_20():
    d = chunk_document(make_doc(DOC), replace(strategy("D", 20), overlap=8))
    assert [(c.start, c.end) for c in d] == [
        (9, 25),  # first chunk of its section: no overlap
        (37, 48),
        (45, 65),  # 49-8=41 is inside "Install"; snapped forward to "it." at 45
        (61, 78),  # 67-8=59 is inside "it"; snapped to "now." at 61
        (73, 100),  # 80-8=72 is the newline after ```py; next word start is "x" at 73
        (112, 131),
        (126, 138),  # 133-8=125 is a space; the next word start is "|" at 126
    ]
    assert d[2].content == "it. Then run it now."


def test_long_sentence_cut_at_whitespace_else_hard():
    doc = make_doc("# T\n\nalpha beta gamma delta\n\nabcdefghijklmnopqrstuvwxyz")
    got = [c.content for c in chunk_document(doc, strategy("C", 12))]
    assert got == ["alpha beta", "gamma delta", "abcdefghijkl", "mnopqrstuvwx", "yz"]


def test_whitespace_exactly_at_target_is_a_valid_cut():
    doc = make_doc("alpha beta gamma")
    assert [c.content for c in chunk_document(doc, strategy("C", 10))] == ["alpha beta", "gamma"]


def test_sentence_end_needs_whitespace_after_it():
    doc = make_doc("Run v1.5 now. Go.")
    assert [c.content for c in chunk_document(doc, strategy("C", 10))] == ["Run v1.5", "now. Go."]


def test_hard_wrapped_prose_is_cut_at_sentence_ends_not_line_ends():
    doc = make_doc("aaa bbb ccc. ddd eee\nfff ggg hhh.")
    got = [c.content for c in chunk_document(doc, strategy("C", 20))]
    assert got == ["aaa bbb ccc.", "ddd eee\nfff ggg hhh."]
    doc = make_doc("Aa.\nBbb ccc ddd eee.")  # a full stop at a line end ends a sentence
    got = [c.content for c in chunk_document(doc, strategy("C", 12))]
    assert got == ["Aa.", "Bbb ccc ddd", "eee."]


@pytest.mark.parametrize("m", ["- ", "* ", "+ ", "• ", "> ", "1. ", "2) ", "| ", "<"])
def test_list_items_and_table_rows_are_line_units(m: str):
    doc = make_doc(f"{m}one item here\n{m}two item here\n{m}three")
    got = [c.content for c in chunk_document(doc, strategy("C", 20))]
    assert got == [f"{m}one item here", f"{m}two item here", f"{m}three"]


def test_prose_next_to_a_line_unit_ends_at_its_line_end():
    doc = make_doc("Intro words go here\n- item")
    got = [c.content for c in chunk_document(doc, strategy("C", 22))]
    assert got == ["Intro words go here", "- item"]
    doc = make_doc("- item one\nthen prose here")
    got = [c.content for c in chunk_document(doc, strategy("C", 20))]
    assert got == ["- item one", "then prose here"]


def test_code_over_target_is_cut_at_line_ends_only():
    doc = make_doc("```\nprint('Hi. There')\n```")
    got = [c.content for c in chunk_document(doc, strategy("C", 20))]
    assert got == ["```", "print('Hi. There')", "```"]


def test_blank_line_inside_code_does_not_end_the_paragraph():
    # prose (28) + code (33) do not fit 45 together; the code's first half would (41)
    chunks = chunk_document(make_doc(DOC), strategy("C", 45))
    assert [(c.start, c.end) for c in chunks if c.section == "Setup"] == [(37, 65), (67, 100)]


@pytest.mark.parametrize(
    "block",
    [
        "One two. Three.",  # a paragraph of exactly target chars is not split
        "~~~\nx\n\ny\n~~~",  # tilde fences hold blank lines too
        "```\nx\n```py\n\ny\n```",  # a fence line with an info string does not close
        "````\nx\n```\n\ny\n````",  # nor does a shorter fence
    ],
)
def test_paragraph_of_exactly_target_stays_whole(block: str):
    doc = make_doc("ab\n\n" + block)
    assert [c.content for c in chunk_document(doc, strategy("C", len(block)))] == ["ab", block]


def test_overlapping_heading_spans_are_all_excluded():
    heads = [Heading(2, "Heading one", 0, 11), Heading(2, "din", 3, 6)]
    (chunk,) = chunk_document(make_doc("Heading one\nbody", headings=heads), strategy("E"))
    assert (chunk.section, chunk.content, chunk.text) == ("din", "body", "[doc.md > din]\nbody")


def test_empty_sections_and_heading_only_docs_give_no_chunks():
    doc = make_doc("# Only\n\n## A\n\n## B\n  \n\t\n## C")
    assert chunk_document(doc, strategy("E")) == []
    doc = make_doc("no headings at all.\n\nSecond.")
    (chunk,) = chunk_document(doc, strategy("E"))
    assert chunk.section == "doc.md"  # no title: the document id names the preamble
    assert chunk.text == "[doc.md]\nno headings at all.\n\nSecond."


def test_level1_heading_inside_a_section_splits_it():
    doc = make_doc("# T\n\n## S\n\none\n# Again\ntwo")
    chunks = chunk_document(doc, strategy("F"))
    assert [(c.section, c.content) for c in chunks] == [("S", "one"), ("S", "two")]


def test_pdf_pages_and_outline_headings():
    text = "Cover words here.\n\f\nChapter Two\nBody of two.\n\f\nmore body"
    heads = [Heading(2, "Chapter Two", 20, 31)]
    doc = replace(make_doc(text, "a.pdf", heads), kind="pdf", page_starts=[0, 20, 46])
    chunks = chunk_document(doc, strategy("C", 12))
    assert [(c.section, c.content, c.page) for c in chunks] == [
        ("a.pdf", "Cover words", 1),
        ("a.pdf", "here.", 1),
        ("Chapter Two", "Body of two.", 2),
        ("Chapter Two", "more body", 3),
    ]
    # a paragraph running over a page break is cut there, whatever the target
    doc = replace(make_doc("end of one\nstart of two", "b.pdf", []), page_starts=[0, 11])
    chunks = chunk_document(doc, strategy("E"))
    assert [(c.content, c.page) for c in chunks] == [("end of one", 1), ("start of two", 2)]


def test_failed_docs_skipped_and_order_deterministic():
    a, b = make_doc("alpha.", "a.md"), make_doc("beta.", "b.md")
    bad = replace(make_doc("", "c.md"), status="failed", reason="broken")
    assert chunk_document(bad, strategy()) == []
    one = chunk_documents([b, bad, a], strategy())
    assert [c.document_id for c in one] == ["a.md", "b.md"]
    assert one == chunk_documents([a, b], strategy())


def test_strategy_presets_and_pipeline_version():
    assert strategy().pipeline_version == f"chunk{CHUNKER_VERSION}:E:t512:o0:hdr1:bnd1"
    assert strategy("B", 300).pipeline_version == f"chunk{CHUNKER_VERSION}:B:t300:o64:hdr0:bnd0"
    assert len({s.pipeline_version for s in PRESETS.values()}) == 6
    assert [(s.blind, s.overlap, s.header) for s in PRESETS.values()] == [
        (True, 0, False),
        (True, 64, False),
        (False, 0, False),
        (False, 64, False),
        (False, 0, True),
        (False, 64, True),
    ]
    for bad in (
        lambda: strategy("G"),
        lambda: ChunkStrategy("x", boundaries=True, header=False, overlap=0, blind=True),
        lambda: ChunkStrategy("x", boundaries=False, header=False, overlap=0),
        lambda: ChunkStrategy("x", boundaries=True, header=False, overlap=-1),
        lambda: ChunkStrategy("x", boundaries=True, header=False, overlap=0, target=0),
        lambda: ChunkStrategy("a:b", boundaries=True, header=False, overlap=0),
    ):
        with pytest.raises(ValueError):
            bad()


def test_chunk_id_depends_on_every_input():
    base = chunk_id("d", 1, 2, "v", "t")
    assert re.fullmatch(r"[0-9a-f]{32}", base)
    assert base == chunk_id("d", 1, 2, "v", "t")
    variants = [("e", 1, 2, "v", "t"), ("d", 0, 2, "v", "t"), ("d", 1, 3, "v", "t")]
    variants += [("d", 1, 2, "w", "t"), ("d", 1, 2, "v", "u"), ("d", 12, 2, "v", "t")]
    assert len({chunk_id(*v) for v in variants} | {base}) == 7
    # a same-length edit keeps offsets but must change the id (nothing keyed by id goes stale)
    old = chunk_document(make_doc("# T\n\nteh cat"), strategy())[0]
    new = chunk_document(make_doc("# T\n\nthe cat"), strategy())[0]
    assert (old.start, old.end) == (new.start, new.end) and old.chunk_id != new.chunk_id


# ---------------------------------------------------------------- hypothesis properties


@dataclass
class GenDoc:
    text: str
    headings: list[Heading]
    paragraphs: list[tuple[int, int]]  # trimmed spans of the blocks that are one paragraph each
    sentences: list[tuple[int, int]]  # spans of the sentences of hard-wrapped prose blocks


_CHARS = [*"abcxyz", "😀", "𝔘", "日", "é", "\t", ".", "!", "?", ",", "|", "-", "\u00a0"]
_word = st.text(st.sampled_from(_CHARS), min_size=1, max_size=10).filter(str.strip)
_long = st.integers(30, 900).map(lambda n: ("ab😀c" * n)[:n])
_line = st.lists(st.one_of(*[_word] * 6, _long), min_size=1, max_size=14).map(" ".join)
_para = st.lists(_line, min_size=1, max_size=5).map("\n".join)
_code_line = st.one_of(_line, st.sampled_from(["", "  ", "\t", "## inside", "# also", "x = 1"]))


@st.composite
def _fence(draw, closed: bool = True) -> str:
    opener, closer = draw(st.sampled_from([("```", "```"), ("```py", "```"), ("~~~", "~~~")]))
    body = draw(st.lists(_code_line, max_size=8))
    return "\n".join([opener, *body] + ([closer] if closed else []))


_plain = st.text(st.sampled_from([*"abcxyz", "😀", "𝔘", "é"]), min_size=1, max_size=9)
# hard-wrapped prose: sentences of plain words ending in ". ", lines broken between words
_prose = st.lists(
    st.lists(st.tuples(_plain, st.sampled_from([" ", " ", "\n", "\t"])), min_size=1, max_size=40),
    min_size=1,
    max_size=12,
)
_heading = st.tuples(st.sampled_from(["# ", "## "]), _word)
_block = st.one_of(
    _heading,
    _para,
    _para,
    _fence(),
    st.tuples(_line, _fence(), _line).map("\n".join),  # code inside a paragraph
    _prose,
)
_sep = st.lists(st.sampled_from(["", " ", "\t", "\u00a0 "]), min_size=1, max_size=3).map(
    lambda blanks: "\n" + "\n".join(blanks) + "\n"
)


@st.composite
def gen_docs(draw) -> GenDoc:
    text = draw(st.sampled_from(["", "\n", "\n \n"]))
    headings: list[Heading] = []
    paragraphs: list[tuple[int, int]] = []
    sentences: list[tuple[int, int]] = []
    blocks = draw(st.lists(_block, max_size=14))
    if draw(st.booleans()):
        blocks.append(draw(_fence(closed=False)))
    for i, block in enumerate(blocks):
        if i:
            text += draw(_sep)
        start = len(text)
        if isinstance(block, list):  # prose: record each sentence
            for j, words in enumerate(block):
                sentence_start = len(text)
                text += "".join(word + gap for word, gap in words)[:-1] + "."
                sentences.append((sentence_start, len(text)))
                text += draw(st.sampled_from([" ", "\n", " \t"])) if j < len(block) - 1 else ""
            paragraphs.append((start, len(text)))
        elif isinstance(block, tuple):
            text += block[0] + block[1]
            level = len(block[0]) - 1
            headings.append(Heading(level, block[1].strip(), start, len(text)))
        else:
            text += block
            lead = len(block) - len(block.lstrip())
            paragraphs.append((start + lead, start + len(block.rstrip())))
    text += draw(st.sampled_from(["", "\n", "\n  \n\t"]))
    return GenDoc(text, headings, paragraphs, sentences)


def _check_invariants(doc: ExtractedDocument, gen: GenDoc, strat: ChunkStrategy) -> list[Chunk]:
    text = doc.text
    chunks = chunk_document(doc, strat)
    heads = sorted(gen.headings, key=lambda h: h.start)
    for c in chunks:
        assert c.content == text[c.start : c.end]
        assert c.content and c.content == c.content.strip()
        assert c.document_id == doc.document_id and c.page is None
        # never contains a heading line, and belongs to the last level-2 heading before it
        assert not any(h.start < c.end and c.start < h.end for h in heads)
        opened = [h.title for h in heads if h.level == 2 and h.end <= c.start]
        assert c.section == (opened[-1] if opened else doc.title or doc.document_id)
        # length bound: target for the forward part, plus at most `overlap` reaching back
        assert len(c.content) <= strat.target + strat.overlap
        if strat.header:
            head = f"[{doc.title}]" if not opened else f"[{doc.title} > {opened[-1]}]"
            assert c.text == f"{head}\n{c.content}"
        else:
            assert c.text == c.content
    starts = [c.start for c in chunks]
    assert starts == sorted(set(starts))
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    assert chunk_document(doc, strat) == chunks
    # nothing is lost: every non-whitespace char outside heading lines is in some chunk
    covered = [False] * len(text)
    for c in chunks:
        covered[c.start : c.end] = [True] * (c.end - c.start)
    for h in heads:
        covered[h.start : h.end] = [True] * (h.end - h.start)
    assert all(cov or ch.isspace() for cov, ch in zip(covered, text, strict=True))
    if strat.boundaries:  # never cut inside a paragraph, nor a prose sentence, that fits
        for a, b in gen.paragraphs + gen.sentences:
            if b - a <= strat.target:
                assert any(c.start <= a and b <= c.end for c in chunks), (a, b)
    return chunks


@pytest.mark.slow  # 150 examples x 6 presets: 120 s measured on two busy cores
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gen=gen_docs(), target=st.integers(40, 600), overlap=st.integers(1, 200))
def test_properties_all_presets(gen: GenDoc, target: int, overlap: int):
    doc = make_doc(gen.text, headings=gen.headings)
    if not doc.title:
        doc.title = "Doc"
    assert local_headings(gen.text) == gen.headings  # the helper agrees with the generator
    got = {name: _check_invariants(doc, gen, strategy(name, target)) for name in PRESETS}
    for name in PRESETS:  # the preset's own overlap must not be the only one exercised
        _check_invariants(doc, gen, replace(strategy(name, target), overlap=overlap))
    for name in "CE":
        assert all(len(c.content) <= target for c in got[name])
    # overlap only moves starts back: same ends, start at a word start inside the previous one
    for base, over in (("A", "B"), ("C", "D"), ("E", "F")):
        n = PRESETS[over].overlap
        plain, moved = got[base], got[over]
        assert [c.end for c in plain] == [c.end for c in moved]
        for i, (p, m) in enumerate(zip(plain, moved, strict=True)):
            assert p.start - n <= m.start <= p.start
            assert m.end - p.start <= target
            if m.start < p.start:
                prev = moved[i - 1]
                assert prev.section == m.section and prev.start < m.start < prev.end
                assert doc.text[m.start - 1].isspace() and not doc.text[m.start].isspace()
    assert [c.start for c in got["C"]] == [c.start for c in got["E"]]
    # greedy: the next chunk of a section would not have fitted; hard cuts only without spaces
    for c1, c2 in zip(got["C"], got["C"][1:], strict=False):
        if c1.section == c2.section and not any(c1.end <= h.start < c2.start for h in gen.headings):
            assert c2.end - c1.start > target
            if c1.end == c2.start:
                assert len(c1.content) == target and not any(ch.isspace() for ch in c1.content)


@settings(max_examples=30, deadline=None)
@given(gen=gen_docs())
def test_chunk_ids_unique_across_strategies_and_targets(gen: GenDoc):
    doc = make_doc(gen.text, headings=gen.headings)
    ids = [
        c.chunk_id for t in (40, 512) for s in PRESETS for c in chunk_document(doc, strategy(s, t))
    ]
    assert len(ids) == len(set(ids))
