"""The fingerprint of a served embedding model, and the index's record of them (issue 35).

A model behind a URL can change under the same name. Its fingerprint is what it makes of the
fixed :data:`PROBES`: the vectors, compared at :data:`FINGERPRINT_MIN_COSINE`, and an id naming
them (the stamps' ``revision``). The index records every fingerprint a table of it was embedded
with, probe vectors included (:data:`REGISTRY_NAME`), so any machine querying it can compare its
own probe; ``RAG_WORK_DIR`` keeps those a worker saw before it wrote anything
(:data:`WORK_REGISTRY`). :mod:`rag_assets.lib.index.endpoint` probes and resolves.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_assets.lib.models.http import redact

if TYPE_CHECKING:
    from rag_assets.lib.index.store import IndexStore

PROBES = (
    "How do I roll back to the previous embedding model?",
    "stale assets",
    "The first asset is an observable source: it never copies files, it only hashes them.",
    "ValueError: expected sequence of length 128 at dim 1 (got 97)",
    "What is the boiling point of tungsten?",
    "ok",
)
"""Fixed probe texts (a question, keywords, a documentation sentence, an error message, an
unrelated question, one word), embedded as they are (no prompt) in one request in this order.
Changing them changes every fingerprint: bump :data:`PROBE_VERSION` with them."""

PROBE_VERSION = "1"

FINGERPRINT_MIN_COSINE = 0.9999
"""Two probe sets come from the same served model when every probe's cosine is at least this.
Measured: llama.cpp (nomic-embed-text-v1.5 f16, CPU) gives cosine 0.9999999 for the same
request sent twice and differs by ~1e-5 relative when a text is batched with others; the same
weights with CLS instead of mean pooling give 0.96 on sentences and 0.889 on the lowest probe; a
q8_0 quantisation of an f16 model is typically 0.999-0.9999, so it counts as another model (its
vectors are not the table's)."""

FINGERPRINT_DECIMALS = 3
"""Decimals the probe vectors are rounded to before a *new* fingerprint's id is hashed (an id
only names a fingerprint; whether two probes match is decided by the cosine above)."""

FINGERPRINT_PREFIX = "fp-"
REGISTRY_NAME = "endpoints/fingerprints.json"
"""The fingerprints recorded in an index (a file under a local index, a ``_rag_files`` row on
object storage): every fingerprint a table of this index was embedded with, probe vectors
included, so any machine querying the index can compare its own probe."""

WORK_REGISTRY = "endpoint-fingerprints.json"
"""The same, under ``RAG_WORK_DIR``: fingerprints seen by this worker before they embedded
anything (the code location's), so the run that follows resolves the same id."""


@dataclass(frozen=True)
class Fingerprint:
    """The served model as its probe vectors show it: name, native size, the vectors (unit
    length, as returned before any truncation) and the id naming them."""

    id: str
    model: str
    dims: int
    vectors: np.ndarray = field(compare=False, repr=False)
    first_seen: str = ""
    url: str = ""

    @classmethod
    def of(cls, model: str, vectors: np.ndarray, url: str = "") -> Fingerprint:
        vecs = unit_rows(np.asarray(vectors, dtype=np.float32))
        rounded = np.round(vecs.astype(np.float64), FINGERPRINT_DECIMALS)
        rounded += 0.0  # -0.0 and 0.0 hash alike
        h = hashlib.sha256(f"{PROBE_VERSION}|{model}|{vecs.shape[1]}|".encode())
        h.update(np.ascontiguousarray(rounded).tobytes())
        fid = FINGERPRINT_PREFIX + h.hexdigest()[:12]
        seen = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return cls(fid, model, int(vecs.shape[1]), vecs, seen, redact(url) if url else "")

    def min_cosine(self, other: Fingerprint) -> float:
        """The lowest per-probe cosine to ``other`` (-1 when their sizes differ)."""
        if self.vectors.shape != other.vectors.shape:
            return -1.0
        return float(np.min(np.sum(self.vectors * other.vectors, axis=1)))

    def matches(self, other: Fingerprint) -> bool:
        """Same model name and size, every probe at cosine >= FINGERPRINT_MIN_COSINE."""
        return (
            self.model == other.model
            and self.dims == other.dims
            and self.min_cosine(other) >= FINGERPRINT_MIN_COSINE
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "dims": self.dims,
            "first_seen": self.first_seen,
            "url": self.url,
            "vectors": [[round(float(x), 6) for x in row] for row in self.vectors],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fingerprint:
        vecs = np.asarray(d["vectors"], dtype=np.float32)
        return cls(
            str(d["id"]),
            str(d["model"]),
            int(d["dims"]),
            vecs,
            str(d.get("first_seen", "")),
            str(d.get("url", "")),
        )


# -- the registry -------------------------------------------------------------------
def read_registry(
    store: IndexStore | None = None, work_dir: str | Path | None = None
) -> list[Fingerprint]:
    """The recorded fingerprints: the index's first (in the order recorded), then the work
    directory's that the index lacks. A damaged file counts as empty (it is rewritten whole)."""
    out: list[Fingerprint] = []
    texts: list[str | None] = []
    if store is not None:
        texts.append(store.read_text(REGISTRY_NAME))
    if work_dir:
        f = Path(work_dir) / WORK_REGISTRY
        texts.append(f.read_text(encoding="utf-8") if f.is_file() else None)
    seen: set[str] = set()
    for text in texts:
        for fp in _parse_registry(text):
            if fp.id not in seen:
                seen.add(fp.id)
                out.append(fp)
    return out


def record(
    fp: Fingerprint, store: IndexStore | None = None, work_dir: str | Path | None = None
) -> None:
    """Add ``fp`` to the index's and/or the work directory's registry (no-op where present)."""
    if store is not None:
        have = _parse_registry(store.read_text(REGISTRY_NAME))
        if fp.id not in {f.id for f in have}:
            store.write_file(REGISTRY_NAME, _registry_text([*have, fp]))
    if work_dir:
        from rag_assets.lib.index.store.records import atomic_write_bytes

        path = Path(work_dir) / WORK_REGISTRY
        have = _parse_registry(path.read_text(encoding="utf-8") if path.is_file() else None)
        if fp.id not in {f.id for f in have}:
            atomic_write_bytes(path, _registry_text([*have, fp]).encode("utf-8"))


def resolve(
    probe: Fingerprint, known: Sequence[Fingerprint], prefer: str | None = None
) -> Fingerprint:
    """The recorded fingerprint ``probe`` matches (``prefer``, e.g. the published table's, first
    when it matches), else ``probe`` itself: a fingerprint not seen before."""
    matching = [k for k in known if probe.matches(k)]
    for k in matching:
        if k.id == prefer:
            return k
    return matching[0] if matching else probe


def _parse_registry(text: str | None) -> list[Fingerprint]:
    if not text:
        return []
    try:
        data = json.loads(text)
        if data.get("probe_version") != PROBE_VERSION:
            return []  # other probe texts: nothing here is comparable
        return [Fingerprint.from_dict(d) for d in data.get("fingerprints", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def _registry_text(fps: Sequence[Fingerprint]) -> str:
    return json.dumps(
        {
            "probe_version": PROBE_VERSION,
            "probes": list(PROBES),
            "match": f"every probe at cosine >= {FINGERPRINT_MIN_COSINE}, same model and size",
            "fingerprints": [f.as_dict() for f in fps],
        },
        indent=1,
    )


def unit_rows(vecs: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length (float32; a zero row stays zero)."""
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return np.asarray(vecs / np.maximum(norms, 1e-12), dtype=np.float32)
