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
