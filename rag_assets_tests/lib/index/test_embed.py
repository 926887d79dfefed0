"""The real all-MiniLM-L6-v2: offline loading, normalisation, stamps, the encoder window."""

from __future__ import annotations

import numpy as np
import pytest

from rag_assets.lib.index.embed import DEFAULT_MODEL_ID, Embedder, ModelNotAvailable, resolve_model
from rag_assets.lib.index.versioning import model_revision


def test_default_model_is_the_packaged_minilm():
    spec = resolve_model(None)
    assert spec.model_id == DEFAULT_MODEL_ID and spec.dims == 384
    assert spec.revision == model_revision(spec.path) and len(spec.revision) == 16


def test_vectors_are_unit_length_and_meaningful(real_embedder):
    v = real_embedder.encode(
        [
            "The cat sat on the mat.",
            "A cat was sitting on a rug.",
            "Quarterly tax filing deadlines.",
        ]
    )
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3
    assert np.allclose(real_embedder.encode_query("The cat sat on the mat."), v[0], atol=1e-5)


def test_window_is_the_models_256_and_token_counts_are_untruncated(real_embedder):
    assert real_embedder.max_seq_length == 256
    short, long = real_embedder.token_counts(["hello world", "word " * 400])
    assert short == 4  # [CLS] hello world [SEP]
    assert long == 402
    assert real_embedder.dropped_chars("word " * 400) == len("word " * 400) - len("word " * 254) + 1
    assert real_embedder.dropped_chars("short text") == 0


def test_missing_model_fails_fast_naming_the_setting(tmp_path, monkeypatch):
    """Refused before anything is fetched or loaded: no connection is even attempted."""
    import socket

    attempts: list[object] = []

    def connect(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", connect)
    with pytest.raises(ModelNotAvailable, match="RAG_EMBEDDING_MODEL"):
        resolve_model("sentence-transformers/all-mpnet-base-v2")  # a hub name: never downloaded
    with pytest.raises(ModelNotAvailable, match="RAG_EMBEDDING_MODEL"):
        resolve_model(str(tmp_path))  # a folder that is not a model
    assert attempts == []


def test_second_model_differs_in_revision_and_vectors(second_model_dir, real_embedder):
    spec = resolve_model(str(second_model_dir))
    assert spec.dims == 384 and spec.revision != real_embedder.spec.revision
    other = Embedder(spec)
    a = real_embedder.encode(["version stamps invalidate downstream assets"])[0]
    b = other.encode(["version stamps invalidate downstream assets"])[0]
    assert abs(float(np.linalg.norm(b)) - 1) < 1e-5
    assert float(a @ b) < 0.99
    s1 = real_embedder.stamps("p", "x")
    s2 = other.stamps("p", "x")
    assert s1.table_name != s2.table_name and s1.code_version != s2.code_version


def test_window_report_counts_overflow_and_the_headers_share(real_embedder):
    from rag_assets.lib.index.embed import window_report
    from rag_assets.lib.types import Chunk

    def chunk(i: int, content: str, header: str) -> Chunk:
        return Chunk(f"c{i}", "doc.md", "S", 0, len(content), content, header + content)

    long = "word " * 300
    plain = [chunk(0, "a short paragraph", ""), chunk(1, long, "")]
    r = window_report(real_embedder, plain)
    assert r["window"] == 256 and r["over"] == 1 and r["header_token_share"] == 0.0
    assert r["dropped_chars"] == real_embedder.dropped_chars(long) > 0
    assert "c1" in r["worst_md"]
    headed = [chunk(0, "alpha beta", "[Doc > Sec]\n")]
    counts = real_embedder.token_counts(["[Doc > Sec]\nalpha beta", "alpha beta"])
    expected = (counts[0] - counts[1]) / counts[0]
    assert window_report(real_embedder, headed)["header_token_share"] == round(expected, 4) > 0


# -- prompts and Matryoshka truncation (issue 8) ----------------------------------------------
def _with_prompts(src, dst, prompts: dict[str, str]):
    """A copy of a real model directory that declares named prompts (weights hard-linked)."""
    import json
    import shutil

    from rag_assets_tests.helpers import link_or_copy

    shutil.copytree(src, dst, copy_function=link_or_copy)
    cfg_file = dst / "config_sentence_transformers.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    cfg["prompts"] = prompts
    if cfg_file.exists():
        cfg_file.unlink()  # may be a hard link into the installed package
    cfg_file.write_text(json.dumps(cfg))
    return dst


def test_prompts_resolve_from_the_models_own_names_or_the_setting(tmp_path):
    from rag_assets.lib.index.embed import default_model_path

    d = _with_prompts(
        default_model_path(), tmp_path / "m", {"query": "Q: ", "passage": "P: ", "STS": "S: "}
    )
    spec = resolve_model(str(d))
    assert (spec.query_prompt, spec.document_prompt) == ("Q: ", "P: ")  # passage: no "document"
    spec = resolve_model(str(d), query_prompt="STS", document_prompt="none")
    assert (spec.query_prompt, spec.document_prompt) == ("S: ", "")
    spec = resolve_model(str(d), query_prompt="search_query: ", document_prompt="NONE")
    assert (spec.query_prompt, spec.document_prompt) == ("search_query: ", "")
    # a model without prompts gets none, unless the setting gives literal text
    plain = resolve_model(None)
    assert (plain.query_prompt, plain.document_prompt) == ("", "")
    assert resolve_model(None, query_prompt="query: ").query_prompt == "query: "


def test_prompts_and_dims_are_part_of_the_stamps_and_the_table_name(tmp_path):
    import hashlib

    from rag_assets.lib.index.versioning import Stamps

    base = Stamps("m/x", "r", 768, True, "p", "e")
    # prompt-less stamps keep the table name they had before prompts were stamped
    key = "m/x|r|768|True|p"
    assert base.table_name == f"chunks_x_768d_p_{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    q = Stamps("m/x", "r", 768, True, "p", "e", query_prompt="Q: ")
    d = Stamps("m/x", "r", 768, True, "p", "e", document_prompt="D: ")
    small = Stamps("m/x", "r", 256, True, "p", "e")
    names = {s.table_name for s in (base, q, d, small)}
    versions = {s.code_version for s in (base, q, d, small)}
    assert len(names) == 4 and len(versions) == 4
    assert q.differences(base) == ["query_prompt: 'Q: ' != ''"]
    assert Stamps.from_dict(q.as_dict()) == q
    assert (
        Stamps.from_schema_metadata(
            {k.encode(): v.encode() for k, v in d.schema_metadata().items()}
        )
        == d
    )
    # stamps written before prompts existed read back as prompt-less
    old = {k: v for k, v in base.as_dict().items() if "prompt" not in k}
    assert Stamps.from_dict(old) == base


def test_dims_beyond_the_model_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"RAG_EMBED_DIMS=512 .*\(384 dims\)"):
        resolve_model(None, dims=512)
    with pytest.raises(ValueError, match="RAG_EMBED_DIMS"):
        resolve_model(None, dims=-1)
    assert resolve_model(None, dims=128).dims == 128
    assert resolve_model(None, dims=128).native_dims == 384


def test_model_revision_hashes_weights_even_under_a_cache_folder(tmp_path):
    import hashlib
    import shutil

    from rag_assets.lib.index.embed import default_model_path

    a = tmp_path / ".cache" / "models" / "a"  # like ~/.cache/rag-assets/models/...
    shutil.copytree(default_model_path(), a)
    assert model_revision(a) == resolve_model(None).revision  # same files, same hash
    assert model_revision(a) != hashlib.sha256().hexdigest()[:16]  # not the hash of nothing


@pytest.mark.slow
def test_prompts_are_prepended_on_their_own_side_only(tmp_path, real_embedder):
    from rag_assets.lib.index.embed import default_model_path, window_report
    from rag_assets.lib.types import Chunk

    d = _with_prompts(
        default_model_path(), tmp_path / "m", {"query": "query: ", "document": "passage: "}
    )
    emb = Embedder(resolve_model(str(d)))
    text = "Version stamps mark the embedding asset stale."
    plain = real_embedder.encode([text, "query: " + text, "passage: " + text])
    assert np.allclose(emb.encode([text])[0], plain[2], atol=1e-5)
    assert np.allclose(emb.encode_query(text), plain[1], atol=1e-5)
    assert float(plain[0] @ plain[2]) < 0.999  # the prompt changes the vector
    s = emb.stamps("p", "e")
    assert (s.query_prompt, s.document_prompt) == ("query: ", "passage: ")
    # the window report counts the document prompt the encoder sees
    c = Chunk("c0", "doc.md", "S", 0, len(text), text, text)
    counts = real_embedder.token_counts(["passage: " + text])
    assert emb.token_counts([text], "passage: ") == counts
    assert window_report(emb, [c])["over"] == 0


@pytest.mark.slow
def test_matryoshka_truncation_renormalises_the_leading_dims(real_embedder):
    small = Embedder(resolve_model(None, dims=128))
    texts = ["stale assets after a model change", "tax filing deadlines"]
    full = real_embedder.encode(texts)
    cut = small.encode(texts)
    assert cut.shape == (2, 128)
    assert np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    lead = full[:, :128] / np.linalg.norm(full[:, :128], axis=1, keepdims=True)
    assert np.allclose(cut, lead, atol=1e-5)
    assert small.encode_query(texts[0]).shape == (128,)
    assert small.stamps("p", "e").dims == 128


@pytest.mark.slow
def test_embeddinggemma_uses_its_own_query_and_document_prompts():
    """The real embeddinggemma-300m (skipped where it is not fetched): its named prompts are the
    defaults, and with them a query finds its passage; a 256-dim truncation stays unit length."""
    from rag_assets_tests.llm_server import GEMMA, model_file

    path = model_file(GEMMA)
    spec = resolve_model(str(path))
    assert spec.query_prompt == "task: search result | query: "
    assert spec.document_prompt == "title: none | text: "
    emb = Embedder(spec)
    assert emb.max_seq_length == 2048
    docs = [
        "Rolling back points published.json at the previous table version.",
        "BM25 scores documents by term frequency and inverse document frequency.",
    ]
    dv = emb.encode(docs)
    q = emb.encode_query("how do I go back to the old embedding model?")
    assert float(q @ dv[0]) > float(q @ dv[1])
    raw = emb.model.encode(docs[:1], prompt="", normalize_embeddings=True)[0]
    assert float(raw @ dv[0]) < 0.999  # the document prompt is really prepended
    small = Embedder(resolve_model(str(path), dims=256))
    small.__dict__["model"] = emb.model  # same weights: truncation happens at encode time
    v = small.encode(docs[:1])
    assert v.shape == (1, 256) and abs(float(np.linalg.norm(v)) - 1) < 1e-5
    lead = dv[0, :256] / np.linalg.norm(dv[0, :256])
    assert np.allclose(v[0], lead, atol=1e-4)


def test_a_repeated_query_is_embedded_once_and_returned_as_a_copy(real_embedder, monkeypatch):
    emb = Embedder(real_embedder.spec)
    emb.__dict__["model"] = real_embedder.model
    calls = []
    real = emb._encode

    def counting(texts, prompt):
        calls.append(list(texts))
        return real(texts, prompt)

    monkeypatch.setattr(emb, "_encode", counting)
    a = emb.encode_query("stale assets")
    a[:] = 0  # callers may scribble on their copy
    b = emb.encode_query("stale assets")
    assert len(calls) == 1 and abs(float(np.linalg.norm(b)) - 1) < 1e-5
    emb.encode_query("rollback")
    assert len(calls) == 2


def test_prefetched_queries_come_from_the_cache(real_embedder):
    queries = [f"prefetch probe {i}: how are lanterns stored in winter?" for i in range(5)]
    alone = [real_embedder.encode_queries([q])[0] for q in queries]
    real_embedder.prefetch_queries(queries + queries[:2])  # repeats are embedded once
    calls: list[list[str]] = []
    encode = real_embedder.encode_queries
    real_embedder.encode_queries = lambda qs: calls.append(list(qs)) or encode(qs)
    try:
        got = [real_embedder.encode_query(q) for q in queries]
    finally:
        del real_embedder.encode_queries
    assert calls == []  # every vector was in the cache: no forward pass
    for a, b in zip(alone, got, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)  # batched: the same vectors
