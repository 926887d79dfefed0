"""The day-0 refusal cut (issue 53): how close questions about other topics come to a folder.

Most folders arrive with no question set and no model to write one, and their refusal cut must
still refuse what they do not answer. The cut this module feeds
(:func:`~rag_assets.lib.evaluate.calibrate.choose_day0_cut`) comes from
:func:`other_topics`: 3,082 questions across 83 domains (software in many languages, data,
operations, science, business, everyday life, chit-chat, other languages), shipped with the
package (``rag_assets/data/other_topics_questions.txt``, CC0). Whatever a folder is about, the
questions of the neighbouring domains are among them (for a C library's manual: C, Go and Rust
questions; for a course on transformers: deep learning and NLP), so the largest cut at which
only a small share of them finds a source sits where this folder's near-misses begin. The
shipped everyday questions alone (``unrelated_questions.txt``) sit far from any technical
folder: on an 18-page C manual their 10 % cut was 0.83, and half of every other folder's
questions were answered (docs/measurements.md, "Day-0 refusal across folders").

A question is answered iff a retrieved chunk is under the cut, and the nearest chunk is always
retrieved, so one distance per question decides: the nearest chunk's
(:meth:`~rag_assets.lib.query.retrieve.Index.nearest_distances`), for all 3,082 questions in
one batch. Their vectors depend only on the query encoder: :func:`other_topics_distances`
keeps them in ``cache_dir`` per encoder (a file of 4.7 MB for 384 dimensions), so a folder's
next version, or another folder on the same model, embeds nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

OTHER_TOPICS_FILE = "data/other_topics_questions.txt"


@dataclass(frozen=True)
class OtherTopic:
    """One question of the shipped set and the domain it is about."""

    domain: str
    text: str


@lru_cache(maxsize=1)
def other_topics() -> tuple[OtherTopic, ...]:
    """The shipped questions about other topics, in file order, each with its domain (the
    ``# -- domain`` line above it)."""
    text = resources.files("rag_assets").joinpath(OTHER_TOPICS_FILE).read_text("utf-8")
    out = []
    domain = ""
    for line in text.splitlines():
        if line.startswith("# -- "):
            domain = line[5:].strip()
        elif line.strip() and not line.startswith("#"):
            out.append(OtherTopic(domain, line.strip()))
    return tuple(out)


@lru_cache(maxsize=1)
def other_topics_digest() -> str:
    """sha256 of the questions (what an evaluation's fingerprint and the vector cache key on)."""
    joined = "\n".join(f"{q.domain}\t{q.text}" for q in other_topics())
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()


def day0_cache_dir() -> Path:
    """Where the questions about other topics keep their vectors, per encoder (issue 53): the
    per-user folder of work that belongs to no index, so every index on one model shares them."""
    from rag_assets.settings import user_work_root

    return user_work_root() / "shared" / "other-topics"


def other_topics_distances(index: Any, cache_dir: str | Path | None = None) -> list[Any]:
    """Every question of :func:`other_topics` as the gate sees it on ``index`` (a
    :class:`~rag_assets.lib.query.retrieve.Index`): a
    :class:`~rag_assets.lib.evaluate.calibrate.QueryDistances` of kind ``unrelated`` whose one
    distance is the nearest chunk's, named ``<domain>/<n>``. The questions' vectors are read
    from ``cache_dir`` when an earlier call embedded them with the same encoder."""
    from rag_assets.lib.evaluate.calibrate import QueryDistances

    questions = other_topics()
    vecs = _vectors(index.embedder, [q.text for q in questions], cache_dir)
    nearest = index.nearest_distances(vecs)
    return [
        QueryDistances(f"{q.domain}/{i}", (float(d),), frozenset(), "unrelated")
        for i, (q, d) in enumerate(zip(questions, nearest, strict=True), start=1)
    ]


def encoder_key(embedder: Any) -> str:
    """What the query vectors depend on: the encoder's stamps (model, revision: an adapted
    encoder is its own; dimensions, query prompt, precision) and an int8 query side (the fp32
    ONNX export embeds as torch does, within 2.4e-7: one file serves both)."""
    stamps = embedder.stamps("", "").as_dict()
    parts = [f"{k}={stamps[k]}" for k in ("model", "revision", "dims", "query_prompt", "precision")]
    parts.append(str(getattr(getattr(embedder, "query_encoder", None), "kind", "") == "onnx-int8"))
    parts.append(type(embedder).__name__)
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:24]


def _vectors(embedder: Any, texts: list[str], cache_dir: str | Path | None) -> np.ndarray:
    path = None
    if cache_dir is not None:
        key = hashlib.sha256(f"{encoder_key(embedder)}|{other_topics_digest()}".encode())
        path = Path(cache_dir) / f"other-topics-{key.hexdigest()[:24]}.npy"
        if path.is_file():
            try:
                cached = np.load(path)
                if cached.shape[0] == len(texts):
                    return cached
            except (OSError, ValueError):
                pass  # a damaged cache file is embedded again and replaced
    vecs = np.asarray(embedder.encode_queries(texts), dtype=np.float32)
    if path is not None:
        from rag_assets.lib.index.store.records import atomic_write_bytes

        buf = io.BytesIO()
        np.save(buf, vecs)
        # readers see the old file or the new one; a cache that cannot be written costs time,
        # not the calibration
        with contextlib.suppress(OSError):
            atomic_write_bytes(path, buf.getvalue())
    return vecs
