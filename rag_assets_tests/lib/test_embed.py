"""The real all-MiniLM-L6-v2: offline loading, normalisation, stamps, the encoder window."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rag_assets.lib.embed import DEFAULT_MODEL_ID, Embedder, ModelNotAvailable, resolve_model
from rag_assets.lib.versioning import model_revision


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


def test_missing_model_fails_fast_naming_the_setting(tmp_path):
    t = time.perf_counter()
    with pytest.raises(ModelNotAvailable, match="RAG_EMBEDDING_MODEL"):
        resolve_model("sentence-transformers/all-mpnet-base-v2")  # a hub name: never downloaded
    with pytest.raises(ModelNotAvailable, match="RAG_EMBEDDING_MODEL"):
        resolve_model(str(tmp_path))  # a folder that is not a model
    assert time.perf_counter() - t < 5


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
    from rag_assets.lib.embed import window_report
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
