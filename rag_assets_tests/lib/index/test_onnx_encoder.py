"""The ONNX query encoder: exported from the packaged model's local weights, checked against
torch, cached by the model's content hash, and used for query vectors only."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_assets.lib.index import onnx_encoder as oe
from rag_assets.lib.index.embed import Embedder, resolve_model

QUERIES = [  # not among oe.PROBES: the check must hold beyond the probes it was made on
    "What does the published pointer file contain?",
    "dims mismatch error after I changed the embedding model",
    "rollback",
]


def test_setting_values_and_a_bad_one():
    # issue 20: the exact fp32 export is the default (torch is the fallback and a choice)
    assert oe.parse_query_encoder(None) == oe.parse_query_encoder("") == "onnx"
    assert oe.parse_query_encoder("torch") == "torch"
    assert oe.parse_query_encoder(" ONNX-int8 ") == "onnx-int8"
    assert oe.parse_query_encoder("onnx") == "onnx"
    with pytest.raises(ValueError, match=r"RAG_QUERY_ENCODER='tensorrt': use torch or onnx"):
        oe.parse_query_encoder("tensorrt")


def test_models_with_layers_the_export_does_not_hold_are_refused(tmp_path):
    modules = [
        {"type": "sentence_transformers.models.Transformer", "path": ""},
        {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
        {"type": "sentence_transformers.models.Dense", "path": "2_Dense"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(oe.OnnxEncoderError, match="set RAG_QUERY_ENCODER=torch") as e:
        oe._supported(tmp_path)
    assert "Transformer+Pooling+Dense" in str(e.value) and "\n" not in str(e.value)


def test_cache_is_keyed_by_the_model_content_hash_and_the_kind(tmp_path):
    spec = resolve_model(None)
    fp32 = oe.OnnxQueryEncoder(spec, tmp_path, kind="onnx")
    int8 = oe.OnnxQueryEncoder(spec, tmp_path, kind="onnx-int8")
    other = oe.OnnxQueryEncoder(dataclasses.replace(spec, revision="0" * 16), tmp_path)
    assert fp32.cache_dir.name.startswith(spec.revision)
    assert len({fp32.cache_dir, int8.cache_dir, other.cache_dir}) == 3
    assert fp32.model_file.name == "model.onnx" and int8.model_file.name == "model.int8.onnx"
    with pytest.raises(ValueError, match="onnx or onnx-int8"):
        oe.OnnxQueryEncoder(spec, tmp_path, kind="torch")


@pytest.fixture(scope="module")
def exports(tmp_path_factory, real_embedder) -> dict[str, oe.OnnxQueryEncoder]:
    """Both exports of the real packaged model, made once (fp32, then int8 quantised from it)."""
    root = tmp_path_factory.mktemp("onnx-cache")
    out = {}
    for kind in (oe.ONNX, oe.ONNX_INT8):
        enc = oe.OnnxQueryEncoder(real_embedder.spec, root, threads=1, kind=kind)
        enc.ensure(real_embedder)
        out[kind] = enc
    return out


@pytest.mark.slow
def test_exports_pass_their_check_and_match_torch_on_new_queries(exports, real_embedder):
    spec = real_embedder.spec
    torch_vecs = real_embedder._encode(QUERIES, spec.query_prompt)
    cos = {}
    for kind, enc in exports.items():
        m = enc.manifest
        assert m["revision"] == spec.revision and m["encoder"] == kind
        assert m["check"]["min_cosine"] >= oe.MIN_PROBE_COSINE[kind]
        assert m["check"]["probes"] == len(oe.PROBES)
        vecs = enc.encode([spec.query_prompt + q for q in QUERIES])
        assert vecs.shape == torch_vecs.shape and vecs.dtype == np.float32
        assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
        cos[kind] = np.sum(vecs * torch_vecs, axis=1)
    assert cos["onnx"].min() >= 0.9999  # the same computation
    assert cos["onnx-int8"].min() >= oe.MIN_PROBE_COSINE["onnx-int8"]
    assert cos["onnx-int8"].max() < 0.99999  # really quantised: a near, not the same, vector
    assert not (exports["onnx-int8"].cache_dir / "model.onnx").exists()  # only int8 kept


@pytest.mark.slow
def test_a_cached_export_is_reused_and_runs_without_torch(exports):
    enc = exports["onnx-int8"]
    created = enc.manifest["created"]
    code = (
        "import json, sys\n"
        "from rag_assets.lib.index.embed import resolve_model\n"
        "from rag_assets.lib.index.onnx_encoder import OnnxQueryEncoder\n"
        f"e = OnnxQueryEncoder(resolve_model(None), {str(enc.cache_root)!r}, 1, 'onnx-int8')\n"
        "m = e.ensure()\n"
        "v = e.encode(['stale assets'])\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'created': m['created'],"
        " 'norm': float((v ** 2).sum())}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"torch": False, "created": created, "norm": pytest.approx(1.0, abs=1e-5)}


@pytest.mark.slow
def test_a_failed_check_refuses_the_export_and_caches_nothing(
    exports, tmp_path, real_embedder, monkeypatch
):
    import shutil

    def export(self, ref, folder):  # the real export, copied (a second one costs ~40 s)
        shutil.copyfile(exports[oe.ONNX].model_file, folder / "model.onnx")

    monkeypatch.setattr(oe.OnnxQueryEncoder, "_export", export)
    monkeypatch.setitem(oe.MIN_PROBE_COSINE, oe.ONNX, 1.01)  # no export can reach it
    enc = oe.OnnxQueryEncoder(real_embedder.spec, tmp_path, kind=oe.ONNX)
    with pytest.raises(oe.OnnxEncoderError, match="below 1.01: set RAG_QUERY_ENCODER=torch"):
        enc.ensure(real_embedder)
    assert not enc.cache_dir.exists()
    assert [p.name for p in (tmp_path / "onnx-query").iterdir()] == []  # no half export left


@pytest.mark.slow
def test_embedder_uses_it_for_queries_and_torch_for_documents(
    exports, real_embedder, sample_docs, tmp_path
):
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.query.retrieve import Index

    spec = real_embedder.spec
    fp32 = Embedder(spec, query_encoder=exports["onnx"])
    int8 = Embedder(spec, query_encoder=exports["onnx-int8"])
    fp32.__dict__["model"] = real_embedder.model  # the same torch model for documents
    text = "A paragraph about stale assets."
    assert np.array_equal(fp32.encode([text]), real_embedder.encode([text]))
    q = QUERIES[0]
    assert np.array_equal(int8.encode_query(q), exports["onnx-int8"].encode([q])[0])
    assert fp32.stamps("p", "x") == real_embedder.stamps("p", "x")  # same table allowed

    for extra in sorted(p for p in sample_docs.iterdir() if p.suffix == ".md")[3:]:
        extra.unlink()  # three Markdown documents are enough to compare rankings (and quick)
    for other in [p for p in sample_docs.iterdir() if p.suffix != ".md"]:
        other.unlink()
    index_folder(sample_docs, tmp_path / "index", strategy("E"), real_embedder)
    store = IndexStore(tmp_path / "index")
    pub = store.published()
    assert pub is not None
    by = {name: Index(store, pub, emb) for name, emb in [("torch", real_embedder), ("onnx", fp32)]}
    for query in QUERIES:
        for retriever in ("dense", "hybrid"):
            a, b = (by[n].search(query, retriever, k=10) for n in ("torch", "onnx"))
            assert [h.chunk_id for h in a] == [h.chunk_id for h in b], (query, retriever)
            assert [h.cosine_distance for h in a] == pytest.approx(
                [h.cosine_distance for h in b], abs=1e-4
            )


def test_no_export_without_the_tokenizer_file(tmp_path):
    spec = dataclasses.replace(resolve_model(None), path=Path(tmp_path))
    enc = oe.OnnxQueryEncoder(spec, tmp_path / "cache")
    with pytest.raises(oe.OnnxEncoderError, match="tokenizer.json"):
        _ = enc.tokenizer


class _CountingEncoder:
    """A deterministic stand-in query encoder (plumbing only; the real one is tested above)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, texts):  # type: ignore[no-untyped-def]
        self.seen += list(texts)
        return np.stack([np.full(4, len(t), dtype=np.float32) for t in texts])


def test_query_encoder_hook_and_lru_query_cache(monkeypatch):
    import rag_assets.lib.index.embed as embed

    monkeypatch.setattr(embed, "QUERY_CACHE", 2)
    spec = dataclasses.replace(resolve_model(None), query_prompt="q: ")
    fake = _CountingEncoder()
    emb = Embedder(spec, query_encoder=fake)
    emb.encode_query("a")
    emb.encode_query("bb")
    emb.encode_query("a")  # a hit: "a" becomes the most recently used
    emb.encode_query("ccc")  # evicts "bb", the least recently used
    emb.encode_query("a")
    emb.encode_query("bb")
    assert fake.seen == ["q: a", "q: bb", "q: ccc", "q: bb"]  # the prompt is prepended
    assert "model" not in emb.__dict__  # torch was never loaded for queries
