"""Settings, with working defaults. ``Settings.from_env`` is pure: it is handed a mapping.

``rag_assets/definitions.py`` (for Dagster) and ``rag_assets/cli.py`` (for the command line)
are the places that pass ``os.environ`` in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

ENV = {
    "documents_dir": ("RAG_DOCUMENTS_DIR", "data/documents"),
    "index_uri": ("RAG_INDEX_URI", "data/index"),
    "work_dir": ("RAG_WORK_DIR", "data/work"),
    "chunk_strategy": ("RAG_CHUNK_STRATEGY", "E"),
    "chunk_target": ("RAG_CHUNK_TARGET", "512"),
    "embedding_model": ("RAG_EMBEDDING_MODEL", ""),
    "embed_batch_size": ("RAG_EMBED_BATCH_SIZE", "16"),
    "embed_threads": ("RAG_EMBED_THREADS", "0"),
    "rerank_model": ("RAG_RERANK_MODEL", ""),
    "distance_cut": ("RAG_DISTANCE_CUT", ""),
    "eval_dir": ("RAG_EVAL_DIR", "data/eval"),
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
    "query_encoder": ("RAG_QUERY_ENCODER", "torch"),
    # extraction (issue 14)
    "ocr_min_confidence": ("RAG_OCR_MIN_CONFIDENCE", "0.80"),
}


@dataclass(frozen=True)
class Settings:
    documents_dir: str = "data/documents"
    index_uri: str = "data/index"
    work_dir: str = "data/work"
    chunk_strategy: str = "E"
    chunk_target: int = 512
    embedding_model: str = ""  # "" = packaged all-MiniLM-L6-v2
    embed_batch_size: int = 16
    embed_threads: int = 0  # 0 = torch default
    rerank_model: str = ""  # "" = rerank off
    distance_cut: str = ""  # "" = calibrated cut, else 0.675
    eval_dir: str = "data/eval"
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
    query_encoder: str = "torch"  # serve/mcp: "onnx-int8" = int8 ONNX query vectors (checked)
    ocr_min_confidence: float = 0.80

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
            except ValueError as e:
                raise ValueError(f"{var}={raw!r} is not a valid {kind}") from e
        s = cls(**values)
        if s.chunk_strategy.upper() not in "ABCDEF" or len(s.chunk_strategy) != 1:
            raise ValueError(f"RAG_CHUNK_STRATEGY must be one of A-F, not {s.chunk_strategy!r}")
        if s.failed_policy not in ("keep", "drop"):
            raise ValueError(f"RAG_FAILED_POLICY must be keep or drop, not {s.failed_policy!r}")
        return replace(s, chunk_strategy=s.chunk_strategy.upper())

    @property
    def cut_override(self) -> float | None:
        return float(self.distance_cut) if self.distance_cut else None
