"""Settings, with working defaults. ``Settings.from_env`` is pure: it is handed a mapping.

``rag_assets/definitions.py`` (for Dagster) and ``rag_assets/cli.py`` (for the command line)
are the places that pass ``os.environ`` in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

ENV = {
    "documents_dir": ("RAG_DOCUMENTS_DIR", "data/documents"),
    "index_uri": ("RAG_INDEX_URI", "data/index"),
    # issue 31: "" = the index's own working folder (index_work_dir), never the current directory
    "work_dir": ("RAG_WORK_DIR", ""),
    "chunk_strategy": ("RAG_CHUNK_STRATEGY", "E"),
    "chunk_target": ("RAG_CHUNK_TARGET", "512"),
    "embedding_model": ("RAG_EMBEDDING_MODEL", ""),
    "embed_batch_size": ("RAG_EMBED_BATCH_SIZE", "16"),
    "embed_threads": ("RAG_EMBED_THREADS", "0"),
    "rerank_model": ("RAG_RERANK_MODEL", ""),
    "distance_cut": ("RAG_DISTANCE_CUT", ""),
    "eval_dir": ("RAG_EVAL_DIR", "data/eval"),
    # issue 19: seconds of model time one run may spend writing the generated evaluation set
    "eval_budget_s": ("RAG_EVAL_BUDGET_S", "300"),
    "recall_floor": ("RAG_RECALL_FLOOR", "0.5"),
    "max_bluff_rate": ("RAG_MAX_BLUFF_RATE", "0.10"),
    "failed_policy": ("RAG_FAILED_POLICY", "keep"),
    "reindex_cron": ("RAG_REINDEX_CRON", "0 * * * *"),
    "base_url": ("RAG_BASE_URL", ""),
    "llm_url": ("RAG_LLM_URL", ""),
    "llm_model": ("RAG_LLM_MODEL", ""),
    "llm_api_key": ("RAG_LLM_API_KEY", ""),
    # embedding model options (issue 8): prompts and a Matryoshka truncation are part of the stamps
    "embed_dims": ("RAG_EMBED_DIMS", "0"),
    "query_prompt": ("RAG_QUERY_PROMPT", ""),
    "document_prompt": ("RAG_DOCUMENT_PROMPT", ""),
    "fusion": ("RAG_FUSION", "rrf"),
    # the local model that reads question and sources together (issues 9 and 15)
    "rerank_depth": ("RAG_RERANK_DEPTH", "25"),
    "answer_check": ("RAG_ANSWER_CHECK", ""),
    "expand": ("RAG_EXPAND", ""),
    "expand_llm_url": ("RAG_EXPAND_LLM_URL", ""),
    "expand_llm_model": ("RAG_EXPAND_LLM_MODEL", ""),
    "expand_n": ("RAG_EXPAND_N", "3"),
    "query_rewrite": ("RAG_QUERY_REWRITE", ""),
    # the HTTP service (issue 10)
    "api_token": ("RAG_API_TOKEN", ""),
    # issue 34: the token `rag-assets mcp` over stdio answers as (unset: the local operator)
    "token": ("RAG_TOKEN", ""),
    "query_encoder": ("RAG_QUERY_ENCODER", "onnx"),
    # extraction (issue 14)
    "ocr_min_confidence": ("RAG_OCR_MIN_CONFIDENCE", "0.80"),
    # issue 22: publish another documents folder into an index built from one (1 = allow)
    "force_folder": ("RAG_FORCE_FOLDER", ""),
    # where torch encodes and in what precision (issue 23): the precision is a stamp, not the device
    "device": ("RAG_DEVICE", "auto"),
    "embed_precision": ("RAG_EMBED_PRECISION", "fp32"),
    "backfill_batch_rows": ("RAG_BACKFILL_BATCH_ROWS", "2048"),  # chunks per backfill run
    # issue 25: one writer at a time, hosts the service answers; issue 22: what gets indexed
    "lease_seconds": ("RAG_LEASE_SECONDS", "60"),
    "lease_wait": ("RAG_LEASE_WAIT", "0"),
    "allowed_hosts": ("RAG_ALLOWED_HOSTS", ""),
    "include": ("RAG_INCLUDE", ""),
    "exclude": ("RAG_EXCLUDE", ""),
    # issue 35: embeddings and reranking from a model server (OpenAI /v1/embeddings, /rerank)
    "embed_url": ("RAG_EMBED_URL", ""),
    "embed_model": ("RAG_EMBED_MODEL", ""),
    "embed_api_key": ("RAG_EMBED_API_KEY", ""),
    "embed_concurrency": ("RAG_EMBED_CONCURRENCY", "2"),
    "embed_timeout": ("RAG_EMBED_TIMEOUT", "300"),
    "embed_retries": ("RAG_EMBED_RETRIES", "4"),
    "embed_window": ("RAG_EMBED_WINDOW", "0"),
    "embed_probe_interval": ("RAG_EMBED_PROBE_INTERVAL", "60"),
    "rerank_url": ("RAG_RERANK_URL", ""),
    "rerank_api_key": ("RAG_RERANK_API_KEY", ""),
    "rerank_timeout": ("RAG_RERANK_TIMEOUT", "5"),
    # issue 32: the encoder adapted to the corpus (opt-in), its step budget and retrain policy
    "adapt": ("RAG_ADAPT", ""),
    "adapt_steps": ("RAG_ADAPT_STEPS", "0"),
    "adapt_max_steps": ("RAG_ADAPT_MAX_STEPS", "500"),
    "adapt_retrain": ("RAG_ADAPT_RETRAIN", "changed:0.2"),
}

#: Integer settings and the smallest value each accepts (0 means "off/default" where allowed).
MIN_INT = {
    "chunk_target": 1,
    "embed_batch_size": 1,
    "embed_threads": 0,
    "embed_dims": 0,
    "rerank_depth": 1,
    "expand_n": 1,
    "backfill_batch_rows": 1,
    "embed_concurrency": 1,
    "embed_retries": 0,
    "embed_window": 0,
    "adapt_steps": 0,
    "adapt_max_steps": 1,
}
#: Float settings and their closed range.
FLOAT_RANGE = {
    "recall_floor": (0.0, 1.0),
    "max_bluff_rate": (0.0, 1.0),
    "ocr_min_confidence": (0.0, 1.0),
    "lease_seconds": (0.001, 86_400.0),
    "lease_wait": (0.0, 86_400.0),
    "embed_timeout": (0.1, 3_600.0),
    "embed_probe_interval": (0.0, 86_400.0),
    "rerank_timeout": (0.1, 600.0),
}


@dataclass(frozen=True)
class Settings:
    documents_dir: str = "data/documents"
    index_uri: str = "data/index"
    work_dir: str = ""  # "" = index_work_dir(index_uri), filled in on construction
    chunk_strategy: str = "E"
    chunk_target: int = 512
    embedding_model: str = ""  # "" = packaged all-MiniLM-L6-v2
    embed_batch_size: int = 16
    embed_threads: int = 0  # 0 = torch default
    rerank_model: str = ""  # "" = rerank off
    distance_cut: str = ""  # "" = calibrated cut, else 0.675
    eval_dir: str = "data/eval"
    eval_budget_s: float = 300.0  # RAG_EVAL_BUDGET_S: the rest waits for a later run
    recall_floor: float = 0.5
    max_bluff_rate: float = 0.10
    failed_policy: str = "keep"
    reindex_cron: str = "0 * * * *"
    base_url: str = ""
    llm_url: str = ""
    llm_model: str = ""
    llm_api_key: str = ""  # sent as a bearer token, never logged
    embed_dims: int = 0  # 0 = the model's own dimension; else a Matryoshka truncation
    query_prompt: str = ""  # "" = the model's own "query" prompt, if it has one
    document_prompt: str = ""  # "" = the model's own "document"/"passage" prompt, if any
    fusion: str = "rrf"
    rerank_depth: int = 25  # hybrid top-k the reranker scores
    answer_check: str = ""  # "" = distance gate only; "llm" = distance, then the judge
    expand: str = ""  # "" = off; "llm" = doc2query views written by the model
    expand_llm_url: str = ""  # "" = RAG_LLM_URL
    expand_llm_model: str = ""  # "" = RAG_LLM_MODEL
    expand_n: int = 3  # questions written per chunk
    query_rewrite: str = ""  # "" = off; "llm" = the model rewrites the question
    api_token: str = ""  # "" = no auth on the HTTP service
    token: str = ""  # RAG_TOKEN: `rag-assets mcp` over stdio sees what this token sees
    query_encoder: str = "onnx"  # exact fp32 ONNX query vectors (torch fallback); onnx-int8; torch
    ocr_min_confidence: float = 0.80
    force_folder: str = ""  # "1": a run may replace the folder the index is built from
    lease_seconds: float = 60.0  # writer lease TTL (a kill -9'd holder blocks at most this)
    lease_wait: float = 0.0  # seconds `index` waits for another writer before refusing
    allowed_hosts: str = ""  # comma-separated Host names the service answers besides loopback
    include: str = ""  # comma-separated gitignore-style globs: only matching files are indexed
    exclude: str = ""  # comma-separated gitignore-style globs: matching files are not indexed
    device: str = "auto"  # auto = CUDA when torch sees one, else cpu; cpu, cuda, cuda:N, mps
    embed_precision: str = "fp32"  # fp32, fp16 or bf16 (a half-precision index is a new table)
    backfill_batch_rows: int = 2048  # rag-assets backfill: about this many chunks per batch run
    # issue 35: a model server embeds (OpenAI /v1/embeddings) and/or reranks (/rerank)
    embed_url: str = ""  # "" = the local RAG_EMBEDDING_MODEL; else the server's base URL
    embed_model: str = ""  # a model the server lists ("" = its only one)
    embed_api_key: str = ""  # sent as a bearer token, never printed
    embed_concurrency: int = 2  # requests in flight while indexing
    embed_timeout: float = 300.0  # seconds per request (queueing at the server included)
    embed_retries: int = 4  # further tries on 429/5xx/dropped connections, honouring Retry-After
    embed_window: int = 0  # the server's input window in tokens (0 = ask it, else unknown)
    embed_probe_interval: float = 60.0  # the service re-probes the fingerprint (0 = never)
    rerank_url: str = ""  # "" = RAG_RERANK_MODEL decides; else a /rerank server
    rerank_api_key: str = ""  # sent as a bearer token, never printed
    rerank_timeout: float = 5.0  # past this a query keeps the hybrid order (never fails)
    adapt: str = ""  # "on": the graph trains the encoder on the corpus (issue 32); "" / off
    adapt_steps: int = 0  # training steps; 0 = one epoch of the pairs, at least 100
    adapt_max_steps: int = 500  # the cap on training steps (keeps a large corpus bounded)
    adapt_retrain: str = "changed:0.2"  # when to train again: changed:F, cron:EXPR, never

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for name, (var, default) in ENV.items():
            raw = env.get(var, default)
            kind = types[name]
            try:
                values[name] = (
                    int(raw) if kind == "int" else float(raw) if kind == "float" else str(raw)
                )
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a valid {kind}: set {var}") from None
            if name in MIN_INT and values[name] < MIN_INT[name]:
                raise ValueError(f"{var}={raw!r}: must be at least {MIN_INT[name]}")
            lo_hi = FLOAT_RANGE.get(name)
            if lo_hi and not lo_hi[0] <= values[name] <= lo_hi[1]:
                raise ValueError(f"{var}={raw!r}: must be between {lo_hi[0]:g} and {lo_hi[1]:g}")
        cut = values["distance_cut"].strip()
        if cut:
            try:
                float(cut)
            except ValueError:
                raise ValueError(
                    f"RAG_DISTANCE_CUT={cut!r} is not a number: give a cosine distance such as "
                    "0.675, or leave it empty for the calibrated cut"
                ) from None
        s = cls(**values)
        if s.chunk_strategy.upper() not in "ABCDEF" or len(s.chunk_strategy) != 1:
            raise ValueError(f"RAG_CHUNK_STRATEGY must be one of A-F, not {s.chunk_strategy!r}")
        if s.failed_policy not in ("keep", "drop"):
            raise ValueError(f"RAG_FAILED_POLICY must be keep or drop, not {s.failed_policy!r}")
        return replace(s, chunk_strategy=s.chunk_strategy.upper())

    def __post_init__(self) -> None:
        if not self.work_dir:  # issue 31: the working folder belongs to the index
            object.__setattr__(self, "work_dir", index_work_dir(self.index_uri))

    @property
    def work_dir_given(self) -> bool:
        """Whether ``RAG_WORK_DIR`` (or the caller) named the working folder, rather than it
        being the index's own (:func:`index_work_dir`)."""
        return self.work_dir != index_work_dir(self.index_uri)

    @property
    def shared_work_dir(self) -> str:
        """The working folder of work that belongs to no index (``rag-assets eval``'s indexes,
        ``questions``' model replies): ``RAG_WORK_DIR`` when given, else the per-user
        ``~/.cache/rag-assets/work/shared``, never the current directory."""
        return self.work_dir if self.work_dir_given else str(user_work_root() / "shared")

    def with_index(self, index_uri: str) -> Settings:
        """These settings for another index: its own working folder comes along, unless
        ``RAG_WORK_DIR`` named one (``dataclasses.replace`` would keep the old index's)."""
        work = self.work_dir if self.work_dir_given else ""
        return replace(self, index_uri=index_uri, work_dir=work)

    @property
    def allowed_host_list(self) -> list[str]:
        """``RAG_ALLOWED_HOSTS`` as lower-case names (no ports)."""
        return [h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip()]

    @property
    def cut_override(self) -> float | None:
        return float(self.distance_cut) if self.distance_cut else None


#: The working folder of a local index, inside it (issue 31): extracted text, chunk Parquet, model
#: caches and the Dagster instance of ``rag-assets index`` (``dagster/``) live with the index
WORK_SUBDIR = ".rag-work"


def index_work_dir(index_uri: str) -> str:
    """The working folder of an index when ``RAG_WORK_DIR`` does not name one: ``<index>/
    .rag-work`` for a local index, and for an object-store index (``s3://…``) a local folder per
    user and index, ``~/.cache/rag-assets/work/<first 16 hex of sha256(URI)>``. Never the
    current directory, so a run from anywhere writes nothing where it was started."""
    uri = str(index_uri)
    if "://" in uri:
        key = hashlib.sha256(uri.encode("utf-8")).hexdigest()[:16]
        return str(user_work_root() / key)
    return str(Path(uri).expanduser() / WORK_SUBDIR)


def user_work_root() -> Path:
    """``~/.cache/rag-assets/work``: the per-user place of the working folders that cannot live
    in an index (object-store indexes, work that belongs to no index)."""
    return Path.home() / ".cache" / "rag-assets" / "work"
