"""The adaptation harness (issue 32) without training: the synthetic corpus that scales the cost
measurement keeps the pairs per chunk, and the command line refuses what it cannot run."""

from __future__ import annotations

import pytest
import torch

from rag_assets.bench.adapt import corpus_chunks, main, synthetic_copies
from rag_assets.lib.index.adapt import build_pairs
from rag_assets_tests.helpers import SAMPLE_DOCS


def test_synthetic_copies_scale_the_pairs_with_the_corpus():
    chunks = corpus_chunks(SAMPLE_DOCS)
    one = build_pairs(chunks)
    copies = synthetic_copies(chunks, 3 * len(chunks))
    assert len(copies) == 3 * len(chunks)
    assert len({c.chunk_id for c in copies}) == len(copies)
    assert all(c.text.endswith(c.content) for c in copies)
    three = build_pairs(copies)
    per_chunk = (len(one.pairs) + len(one.held_out)) / len(chunks)
    scaled = (len(three.pairs) + len(three.held_out)) / len(copies)
    assert abs(scaled - per_chunk) / per_chunk < 0.05  # every sentence of a copy is unique


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_a_device_torch_cannot_use_is_refused_in_one_line(tmp_path, capsys):
    code = main(["train", "--documents", str(SAMPLE_DOCS), "--work", str(tmp_path),
                 "--device", "cuda", "--steps", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "RAG_DEVICE=cuda" in err and len(err.strip().splitlines()) == 1
