"""RAG_DEVICE and RAG_EMBED_PRECISION (issue 23): where torch encodes is no stamp, the precision
is one; an explicit device torch cannot use fails in one line naming the setting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rag_assets.lib.index.embed import (
    DEVICE_TOLERANCE,
    Embedder,
    check_device,
    resolve_device,
    resolve_model,
)
from rag_assets.lib.index.versioning import Stamps
from rag_assets.settings import Settings

HAS_CUDA = torch.cuda.is_available()
TEXTS = [
    "The cat sat on the mat.",
    "Quarterly tax filing deadlines for small companies.",
    "Gradient descent minimises a loss by following its negative gradient " * 6,
]


def test_settings_read_device_and_precision():
    default = Settings.from_env({})
    assert (default.device, default.embed_precision) == ("auto", "fp32")
    s = Settings.from_env({"RAG_DEVICE": "cuda:1", "RAG_EMBED_PRECISION": "fp16"})
    assert (s.device, s.embed_precision) == ("cuda:1", "fp16")


def test_auto_is_cuda_when_torch_sees_one_else_cpu():
    assert resolve_device("auto") == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("") == resolve_device("auto")
    assert resolve_device("CPU") == "cpu"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cpu:0", "tpu"])
def test_a_device_that_is_no_device_is_refused_naming_the_setting(bad):
    with pytest.raises(ValueError, match="RAG_DEVICE") as exc:
        check_device(bad)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="RAG_DEVICE"):
        Embedder(resolve_model(None), device=bad)  # refused before any model loads


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_explicit_cuda_without_one_fails_in_one_line(device):
    embedder = Embedder(resolve_model(None), device=device)
    with pytest.raises(ValueError) as exc:
        embedder.encode(["hello"])
    msg = str(exc.value)
    assert msg.startswith(f"RAG_DEVICE={device}:") and "no CUDA device" in msg
    assert "RAG_DEVICE=auto" in msg and "\n" not in msg


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA device")
def test_rag_index_with_cuda_and_no_gpu_fails_naming_the_setting(tmp_path, capsys, monkeypatch):
    """``rag-assets index`` (a real Dagster run) stops at the embedding step with the one line
    naming RAG_DEVICE, and publishes nothing."""
    from rag_assets import cli
    from rag_assets.lib.index.store import IndexStore

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Title\n\nSome text about encoders and devices.\n")
    monkeypatch.setenv("RAG_DEVICE", "cuda")
    monkeypatch.setenv("RAG_WORK_DIR", str(tmp_path / "work"))
    index = tmp_path / "index"
    rc = cli.main(["index", "--quiet", "--documents", str(docs), "--index", str(index)])
    out = capsys.readouterr()
    assert rc == 1
    assert "RAG_DEVICE=cuda: torch" in out.out + out.err and "Traceback" not in out.err
    assert IndexStore(str(index)).published() is None


def test_the_device_is_not_a_stamp(real_embedder):
    spec = real_embedder.spec
    stamps = {
        Embedder(spec, device=d).stamps("p", "e") for d in ("auto", "cpu", "cuda", "cuda:1", "mps")
    }
    assert len(stamps) == 1
    assert real_embedder.device == resolve_device("auto")


def test_vectors_agree_across_devices_within_the_tolerance(real_embedder):
    """The tolerance that makes the device no stamp: fp32 vectors of one text from another
    device (CUDA when there is one) or from another kernel path (batch size 1, no padding)."""
    ref = real_embedder.encode(TEXTS)
    other = Embedder(real_embedder.spec, batch_size=1, device="cuda" if HAS_CUDA else "cpu")
    got = other.encode(TEXTS)
    assert other.device.startswith("cuda" if HAS_CUDA else "cpu")
    assert float(np.abs(ref - got).max()) <= DEVICE_TOLERANCE
    assert [int(i) for i in (got @ ref.T).argmax(axis=1)] == [0, 1, 2]


def test_precision_is_a_stamp_and_fp32_names_are_unchanged():
    fp32 = resolve_model(None)
    fp16 = resolve_model(None, precision="FP16")
    assert (fp32.precision, fp16.precision) == ("fp32", "fp16")
    s32 = Embedder(fp32).stamps("p", "e")
    s16 = Embedder(fp16).stamps("p", "e")
    assert s16.differences(s32) == ["precision: 'fp16' != 'fp32'"]
    assert s16.table_name != s32.table_name and s16.code_version != s32.code_version
    # an fp32 index keeps the table name and code version it had before precision was stamped
    legacy = {k: v for k, v in s32.as_dict().items() if k != "precision"}
    assert Stamps.from_dict(legacy) == s32
    assert "precision" not in s32.code_version


def test_a_precision_that_is_none_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="RAG_EMBED_PRECISION='int4'"):
        resolve_model(None, precision="int4")


def test_fp16_vectors_are_other_vectors_close_to_fp32(real_embedder):
    half = Embedder(resolve_model(None, precision="fp16"))
    v16 = half.encode(TEXTS)
    v32 = real_embedder.encode(TEXTS)
    assert v16.dtype == np.float32 and v16.shape == v32.shape
    assert np.allclose(np.linalg.norm(v16, axis=1), 1.0, atol=5e-3)
    assert not np.array_equal(v16, v32)  # another vector space in the bits: hence the stamp
    assert float(np.abs(v16 - v32).max()) < 2e-2
    assert [int(i) for i in (v16 @ v32.T).argmax(axis=1)] == [0, 1, 2]


def test_graph_code_version_follows_the_precision_not_the_device():
    from rag_assets.defs.build import stamps_for

    base = stamps_for(Settings.from_env({}))
    assert stamps_for(Settings.from_env({"RAG_DEVICE": "cuda"})) == base
    half = stamps_for(Settings.from_env({"RAG_EMBED_PRECISION": "fp16"}))
    assert half.precision == "fp16" and half.code_version != base.code_version
