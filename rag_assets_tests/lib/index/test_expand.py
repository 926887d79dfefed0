"""doc2query expansion: question writing, its cache (incremental, resumable), views in retrieval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_assets.lib.index import expand as ex
from rag_assets.lib.index.views import Views, expanded_bm25_text, pool_dense
from rag_assets.lib.ingest.chunk import chunk_documents, strategy
from rag_assets.lib.ingest.extract import extract_folder
from rag_assets.lib.models.llm import LLMClient, LLMError
from rag_assets.lib.types import Chunk
from rag_assets_tests.lib.fake_llm import fake_llm, user_text


def _chunk(cid: str, doc: str, start: int, content: str) -> Chunk:
    text = f"[{doc} > s]\n{content}"
    return Chunk(cid, doc, "s", start, start + len(content), content, text)


def _writer(body: dict[str, Any]) -> tuple[str, None]:
    """Deterministic "model": three numbered questions naming the passage's last word."""
    passage = user_text(body).split("Passage:\n", 1)[1].split("\n\nWrite", 1)[0]
    word = passage.split()[-1]
    return f"1. What is {word}?\n2. Why does my {word} break?\n- How to fix {word} quickly?", None


STAMP = ex.ExpansionStamp("fake-writer", ex.prompt_hash(), 3)


def test_parse_questions_strips_numbering_and_dedups() -> None:
    reply = 'Questions:\n1. "What is X?"\n2) What is X?\n- Why does Y fail?\n\nQ3: How is Z set?\n'
    assert ex.parse_questions(reply, 3) == ["What is X?", "Why does Y fail?", "How is Z set?"]
    assert ex.parse_questions(reply, 1) == ["What is X?"]
    assert ex.parse_questions("", 3) == []


def test_stamp_changes_with_model_prompt_and_n() -> None:
    keys = {
        STAMP.key,
        ex.ExpansionStamp("other-model", STAMP.prompt, 3).key,
        ex.ExpansionStamp(STAMP.model, "0" * 12, 3).key,
        ex.ExpansionStamp(STAMP.model, STAMP.prompt, 2).key,
    }
    assert len(keys) == 4
    base = "chunk1:E:t512:o0:hdr1:bnd1"
    assert ex.expanded_pipeline(base, None) == base  # off: exactly today's stamp
    assert ex.chunk_pipeline_of(ex.expanded_pipeline(base, STAMP)) == base
    assert ex.expanded_pipeline(base, STAMP) != base


def test_expand_is_incremental_by_chunk_text(tmp_path: Path) -> None:
    chunks = [_chunk(f"c{i}", f"d{i % 2}.md", i * 10, f"passage {i} alpha{i}") for i in range(4)]
    with fake_llm(_writer) as (url, seen):
        client = LLMClient(url, "fake-writer")
        first = ex.expand_chunks(chunks, client, ex.QuestionCache(tmp_path, STAMP))
        assert (first.generated, first.cached, len(seen)) == (4, 0, 4)
        assert first.questions["c1"] == ["What is alpha1?", "Why does my alpha1 break?",
                                         "How to fix alpha1 quickly?"]  # fmt: skip
        # a new process, nothing changed: no model call
        again = ex.expand_chunks(chunks, client, ex.QuestionCache(tmp_path, STAMP))
        assert (again.generated, again.cached, len(seen)) == (0, 4, 4)
        assert again.questions == first.questions
        # one document edited (its two chunks' texts change): only those are regenerated
        edited = [
            _chunk(c.chunk_id + "x", c.document_id, c.start, c.content + " edited")
            if c.document_id == "d1.md"
            else c
            for c in chunks
        ]
        third = ex.expand_chunks(edited, client, ex.QuestionCache(tmp_path, STAMP))
        assert (third.generated, third.cached, len(seen)) == (2, 2, 6)
        assert third.questions["c1x"][0] == "What is edited?"
        # another prompt/model stamp is another cache: everything again
        other = ex.ExpansionStamp("fake-writer-2", STAMP.prompt, 3)
        fourth = ex.expand_chunks(chunks, client, ex.QuestionCache(tmp_path, other))
        assert fourth.generated == 4


def test_expand_resumes_after_a_kill(tmp_path: Path) -> None:
    chunks = [_chunk(f"c{i}", "d.md", i * 10, f"text number {i} w{i}") for i in range(5)]
    calls = {"n": 0}

    def dies_after_two(body: dict[str, Any]) -> tuple[str, None]:
        calls["n"] += 1
        if calls["n"] > 2:
            raise ConnectionError("killed")  # the handler dies: the client sees no reply
        return _writer(body)

    with fake_llm(dies_after_two) as (url, _):
        client = LLMClient(url, "fake-writer", timeout=5)
        with pytest.raises(LLMError):
            ex.expand_chunks(chunks, client, ex.QuestionCache(tmp_path, STAMP), max_failures=1)
    cache_file = ex.QuestionCache(tmp_path, STAMP).path
    assert len(cache_file.read_text().splitlines()) == 2  # what was written before the kill
    with cache_file.open("a") as f:
        f.write('{"text_hash": "trunc')  # a kill in the middle of a write
    with fake_llm(_writer) as (url, seen):
        resumed = ex.expand_chunks(
            chunks, LLMClient(url, "fake-writer"), ex.QuestionCache(tmp_path, STAMP)
        )
    assert (resumed.cached, resumed.generated, len(seen)) == (2, 3, 3)
    assert sorted(resumed.questions) == [c.chunk_id for c in chunks]


def test_view_rows_carry_the_header_not_the_content() -> None:
    c = _chunk("c0", "doc.md", 0, "the content")
    rows = ex.view_rows([c], {"c0": ["Why?", "How?"]})
    assert rows == [("c0", "[doc.md > s]\nWhy?"), ("c0", "[doc.md > s]\nHow?")]
    assert expanded_bm25_text(c.text, ["Why?"]) == c.text + "\nWhy?"
    assert expanded_bm25_text(c.text, []) == c.text


def test_views_max_pool_to_their_chunk_with_deterministic_ties() -> None:
    q = np.array([1.0, 0.0], np.float32)
    vecs = np.array([[0.0, 1.0], [1.0, 0.0], [0.6, 0.8], [1.0, 0.0]], np.float32)
    views = Views(["a", "a", "b", "c"], ["v"] * 4, vecs, None, {})  # type: ignore[arg-type]
    # a's best view is exact (0.0), c ties with it and sorts after by id; b at 0.4
    got = views.dense(q, 10)
    assert [c for c, _ in got] == ["a", "c", "b"]
    assert got[0][1] == pytest.approx(0.0) and got[2][1] == pytest.approx(0.4)
    # merged with the chunks' own distances: each chunk keeps its best one
    merged = pool_dense([("b", 0.1), ("d", 0.5)], got, k=3)
    assert merged == [("a", pytest.approx(0.0)), ("c", pytest.approx(0.0)), ("b", 0.1)]


# -- on the real things --------------------------------------------------------------------
@pytest.mark.slow
def test_index_with_views_returns_the_chunk_quoted_from_content(
    tmp_path: Path, sample_docs: Path, real_embedder: Any, index_uri: str
) -> None:
    """A question only a view contains finds its chunk; the hit quotes the chunk's content."""
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.query.retrieve import Index

    strat = strategy("E")
    docs = extract_folder(sample_docs).documents
    chunks = chunk_documents(docs, strat)
    target = chunks[len(chunks) // 2]
    marker = "zebra quokka teleportation"  # in no document
    questions = {target.chunk_id: [f"Does {marker} work?"]}

    idx, plain_uri = f"{index_uri}/idx", f"{index_uri}/plain"
    built = index_folder(
        sample_docs, idx, strat, real_embedder, publish=False,
        expand=lambda _: (STAMP, questions),
    )  # fmt: skip
    plain = index_folder(sample_docs, plain_uri, strat, real_embedder, publish=False)
    assert built.entry.table != plain.entry.table  # expanded rows never share a table
    assert built.stamps.pipeline == ex.expanded_pipeline(strat.pipeline_version, STAMP)
    index = Index(IndexStore(idx), built.entry, real_embedder)
    assert index.views is not None and index.views.meta["views"] == 1
    for retriever in ("bm25", "dense", "hybrid"):
        hit = index.search(f"{marker}?", retriever, k=3)[0]
        assert hit.chunk_id == target.chunk_id, retriever
        assert hit.content == target.content and marker not in hit.content
        # the gate's distance is the chunk's own vector's, not the view's
        own = 1 - float(np.dot(real_embedder.encode_query(f"{marker}?"),
                               real_embedder.encode([target.text])[0]))  # fmt: skip
        assert hit.cosine_distance == pytest.approx(own, abs=1e-4)
    plain_index = Index(IndexStore(plain_uri), plain.entry, real_embedder)
    assert plain_index.views is None
    assert plain_index.search(f"{marker}?", "bm25", k=3) == []


@pytest.mark.slow
def test_real_model_writes_questions(tmp_path: Path, llama_server_small: str) -> None:
    chunk = _chunk(
        "c0", "doc.md", 0,
        "To save a fine-tuned model, call model.save_pretrained('my-dir'); reload it later "
        "with AutoModel.from_pretrained('my-dir') instead of downloading it again.",
    )  # fmt: skip
    client = LLMClient(llama_server_small, timeout=600)  # 2 shared cores can be very busy
    stamp = ex.ExpansionStamp(ex.model_label(client), ex.prompt_hash(), 2)
    assert stamp.model == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    report = ex.expand_chunks([chunk], client, ex.QuestionCache(tmp_path, stamp))
    assert report.failed == []
    qs = report.questions["c0"]
    assert report.generated == 1 and 1 <= len(qs) <= 2
    assert all(len(q) >= 8 and "\n" not in q for q in qs)
    assert report.seconds_per_chunk > 0
    again = ex.expand_chunks([chunk], client, ex.QuestionCache(tmp_path, stamp))
    assert (again.generated, again.questions) == (0, report.questions)
    stored = [json.loads(x) for x in (tmp_path / f"questions-{stamp.key}.jsonl").open()]
    assert stored[0]["questions"] == qs


def test_echoed_headers_and_instructions_are_dropped(tmp_path: Path) -> None:
    """What the 0.5 B model really wrote for one course chunk (first run of issue 15)."""
    reply = (
        "What can Transformers do? > Working with pipelines\n"
        "2. Question 2: How can I pass several sentences?\n"
        "Question 3: Describe the symptom or goal in everyday words, quoting an exact error "
        "message, parameter or name only if the passage has one."
    )
    assert ex.parse_questions(reply, 3) == ["How can I pass several sentences?"]
    cache = ex.QuestionCache(tmp_path, STAMP)
    cache.put("h", reply.splitlines())  # written before the filter: filtered when read
    assert cache.get("h") == ["How can I pass several sentences?"]
