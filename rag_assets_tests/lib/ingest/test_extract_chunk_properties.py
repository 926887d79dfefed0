"""Property: raw files (BOM, CRLF, lone CR, tabs, astral characters, empty sections, huge
paragraphs, over-long sentences) go through extraction and every chunking preset with
``content == canonical[from:to]``, and the canonical text is the file with newlines as LF."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_assets.lib.ingest.chunk import PRESETS, chunk_document, strategy
from rag_assets.lib.ingest.extract import extract_document

WORDS = st.sampled_from(
    ["alpha", "beta", "γάμμα", "😀", "𝔘𝔫𝔦", "tab\there", "end.", "Why?", "x" * 700, "—", "a"]
)
SENTENCE = st.lists(WORDS, min_size=1, max_size=40).map(" ".join)
PARAGRAPH = st.lists(SENTENCE, min_size=1, max_size=12).map(" ".join)
BLOCK = st.one_of(
    PARAGRAPH,
    st.sampled_from(["## Section", "## ", "## Empty", "```\ncode\n\n## not a heading\n```"]),
)
NEWLINE = st.sampled_from(["\n", "\r\n", "\r"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    blocks=st.lists(BLOCK, min_size=1, max_size=15),
    nl=NEWLINE,
    bom=st.booleans(),
    target=st.integers(40, 600),
)
def test_raw_files_chunk_exactly(tmp_path_factory, blocks, nl, bom, target):
    root = tmp_path_factory.mktemp("raw")
    body = ("# Title" + nl + nl + (nl + nl).join(blocks) + nl).replace("\n", nl)
    path = Path(root) / "doc.md"
    path.write_bytes(("\ufeff" if bom else "").encode() + body.encode("utf-8"))
    doc = extract_document(path, root)
    assert doc.ok, doc.reason
    assert doc.text == body.replace("\r\n", "\n").replace("\r", "\n")
    for name in PRESETS:
        for c in chunk_document(doc, strategy(name, target)):
            assert doc.text[c.start : c.end] == c.content
            assert c.content.strip() == c.content != ""
            assert c.text.endswith(c.content)
