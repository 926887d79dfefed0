"""Version stamps: what an index row was made with, and the names derived from it.

A stamp set names the embedding model (id + a hash of its weights), the vector size and
normalisation, the chunking pipeline version, the extractor suite version and the prompts put
before queries and documents (another prompt is another vector space). The LanceDB
table name and the Dagster ``code_version`` of the embedding asset both derive from it, so a
change of model or chunker builds a new table and marks exactly the embedding asset stale.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Files that don't change what a model computes; left out of its revision hash.
_IGNORED_MODEL_FILES = {"README.md", ".gitattributes", "LICENSE", "data_config.json"}


@dataclass(frozen=True)
class Stamps:
    """Provenance carried by every row, the table schema metadata and the BM25 index."""

    model: str  # embedding model id, e.g. "sentence-transformers/all-MiniLM-L6-v2"
    revision: str  # sha256 (first 16 hex) over the model directory's files
    dims: int
    normalized: bool
    pipeline: str  # chunker version + parameters, e.g. "chunk1:E:t512:o0:hdr1:bnd1"
    extractor: str  # extractor suite version, e.g. "text-1+pymupdf-1/mupdf-1.28.5"
    query_prompt: str = ""  # prefix before every query, e.g. "task: search result | query: "
    document_prompt: str = ""  # prefix before every indexed text, e.g. "title: none | text: "
    # RAG_EMBED_PRECISION: the encoder's float type ("fp32", "fp16", "bf16"). The device is no
    # stamp (CPU and CUDA fp32 vectors agree within the tests' tolerance); a precision is one
    precision: str = "fp32"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def schema_metadata(self) -> dict[str, str]:
        return {f"rag_assets.{k}": str(v) for k, v in self.as_dict().items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Stamps:
        return cls(
            model=str(d["model"]),
            revision=str(d["revision"]),
            dims=int(d["dims"]),
            normalized=str(d["normalized"]).lower() in ("true", "1"),
            pipeline=str(d["pipeline"]),
            extractor=str(d["extractor"]),
            # stamps written before prompts were stamped had none
            query_prompt=str(d.get("query_prompt", "")),
            document_prompt=str(d.get("document_prompt", "")),
            precision=str(d.get("precision", "fp32")),  # stamps before issue 23 were fp32
        )

    @classmethod
    def from_schema_metadata(cls, md: dict[bytes, bytes] | None) -> Stamps | None:
        if not md:
            return None
        d = {
            k.decode()[len("rag_assets.") :]: v.decode()
            for k, v in md.items()
            if k.decode().startswith("rag_assets.")
        }
        try:
            return cls.from_dict(d)
        except KeyError:
            return None

    @property
    def table_name(self) -> str:
        """One LanceDB table per (model, revision, dims, prompts, pipeline): readable and unique.

        The prompts enter the key only when set, so tables of prompt-less models keep the names
        they had before prompts were stamped."""
        key = f"{self.model}|{self.revision}|{self.dims}|{self.normalized}|{self.pipeline}"
        if self.query_prompt or self.document_prompt:
            key += f"|q={self.query_prompt}|d={self.document_prompt}"
        if self.precision != "fp32":  # fp32 tables keep the names they had before issue 23
            key += f"|p={self.precision}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:10]
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.model.split("/")[-1]).strip("-").lower()
        pipe = re.sub(r"[^A-Za-z0-9]+", "-", self.pipeline).strip("-").lower()
        return f"chunks_{slug}_{self.dims}d_{pipe}_{digest}"

    @property
    def code_version(self) -> str:
        """The embedding asset's Dagster code_version (model + dims + prompts + pipeline)."""
        base = (
            f"model={self.model};rev={self.revision};dims={self.dims};"
            f"pipeline={self.pipeline};extractor={self.extractor}"
        )
        if self.query_prompt or self.document_prompt:
            # digests: the prompts' text may hold ';' or '=' and can be long
            q = hashlib.sha256(self.query_prompt.encode()).hexdigest()[:8]
            d = hashlib.sha256(self.document_prompt.encode()).hexdigest()[:8]
            base += f";qprompt={q};dprompt={d}"
        if self.precision != "fp32":
            base += f";precision={self.precision}"
        return base

    def differences(self, other: Stamps) -> list[str]:
        """Human-readable list of fields that differ (empty when compatible)."""
        a, b = self.as_dict(), other.as_dict()
        return [f"{k}: {a[k]!r} != {b[k]!r}" for k in a if a[k] != b[k]]


_revision_cache: dict[tuple[str, float, int], str] = {}


def model_revision(model_dir: Path) -> str:
    """Content hash of a local model directory (weights, configs, tokenizer), cached by mtime."""
    # ".cache" is looked for inside the model directory only (a hub download's lock files):
    # a model that itself lives under ~/.cache must still hash its weights
    files = sorted(
        p
        for p in model_dir.rglob("*")
        if p.is_file()
        and p.name not in _IGNORED_MODEL_FILES
        and ".cache" not in p.relative_to(model_dir).parts
    )
    key = (
        str(model_dir.resolve()),
        max((p.stat().st_mtime for p in files), default=0.0),
        sum(p.stat().st_size for p in files),
    )
    if key in _revision_cache:
        return _revision_cache[key]
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(model_dir).as_posix().encode() + b"\0")
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    _revision_cache[key] = h.hexdigest()[:16]
    return _revision_cache[key]
