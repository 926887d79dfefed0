"""BM25 lexical retrieval over chunk texts (bm25s, Lucene variant), persisted with stamps.

The design's definition (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25
and Beyond", 2009; idf as in Lucene's ``BM25Similarity``):

* tokens: lowercase ``[a-z0-9]+`` runs of ``text.lower()``; no stemming, no stopwords;
* ``score(q, d) = Σ_{t ∈ q} idf(t) · tf·(k1+1) / (tf + k1·(1 − b + b·dl/avgdl))`` summed over
  the query's tokens as they occur (a repeated query token counts twice, as in Lucene);
* ``idf(t) = ln(1 + (N − n_t + 0.5) / (n_t + 0.5))``, always positive;
* ``k1 = 1.2``, ``b = 0.75`` (Lucene's defaults; Robertson & Zaragoza §3.4 recommend
  ``1.2 ≤ k1 ≤ 2``, ``b = 0.75``).

bm25s ``method="lucene"`` computes exactly this except that its tf part omits the ``(k1+1)``
numerator factor; since that is a constant for fixed ``k1`` the ranking is identical and
:meth:`BM25Index.search` multiplies it back so scores match the definition. The index is
built once (eagerly precomputed sparse scores) and loaded, never rebuilt per query.

Searching a subset (issue 34: a metadata filter, the caller's groups): ``search(q, k, mask)``
scores only the documents of ``mask`` and takes ``N``, ``n_t`` and ``avgdl`` from that subset,
as if the index held nothing else: the term frequencies are recovered exactly from the stored
scores (``tf = K·x / (1 − x)`` with ``x = score / idf`` and ``K`` from the document's length,
saved beside the matrix), so a hidden document moves no score, no idf and no rank of what the
caller sees, and ``k`` hits come back whenever ``k`` documents of the subset hold a query term.
LanceDB's native index (:class:`NativeFTS`) filters during its search too (``prefilter``), with
its own corpus-wide statistics.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from rag_assets.lib.index.due import index_due
from rag_assets.lib.index.store.records import replace_dir

BM25_K1 = 1.2  # Lucene BM25Similarity default; Robertson & Zaragoza 2009 §3.4
BM25_B = 0.75  # Lucene BM25Similarity default; Robertson & Zaragoza 2009 §3.4
TOKENIZER = "lower-[a-z0-9]+-v1"  # changes whenever tokenize() changes meaning
_TOKEN_RE = re.compile(r"[a-z0-9]+")
_META = "bm25_meta.json"
_LENGTHS = "doc_lengths.npy"  # tokens per document (issue 34)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into the design's BM25 tokens: lowercase ASCII ``[a-z0-9]+`` runs."""
    return _TOKEN_RE.findall(text.lower())


class BM25Index:
    """An immutable BM25 index over ``ids``/``texts``; see the module docstring for scoring."""

    def __init__(
        self,
        ids: list[str],
        engine: bm25s.BM25 | None,
        k1: float,
        b: float,
        stamps: dict[str, Any],
    ) -> None:
        self.ids = ids
        self.k1 = k1
        self.b = b
        self.stamps = stamps
        self._engine = engine
        # tokens per document (what avgdl averages): saved beside the matrix since issue 34;
        # None for an index saved before (a subset search then keeps corpus-wide statistics
        # unless the caller supplies them, see set_doc_lengths)
        self.doc_lengths: np.ndarray | None = None
        # rank of each document's id in ascending id order, for deterministic tie-breaking
        order = sorted(range(len(ids)), key=ids.__getitem__)
        self._id_rank = np.empty(len(ids), dtype=np.int64)
        self._id_rank[np.asarray(order, dtype=np.int64)] = np.arange(len(ids), dtype=np.int64)

    @property
    def size(self) -> int:
        """Number of indexed documents."""
        return len(self.ids)

    @property
    def definition(self) -> dict[str, Any]:
        """The scoring definition this index was built with (saved and checked on load)."""
        return {"tokenizer": TOKENIZER, "k1": self.k1, "b": self.b, "idf": "lucene"}

    @classmethod
    def build(
        cls,
        ids: Sequence[str],
        texts: Sequence[str],
        k1: float = BM25_K1,
        b: float = BM25_B,
        stamps: dict[str, Any] | None = None,
    ) -> BM25Index:
        """Tokenize ``texts`` and precompute the BM25 index; ``ids[i]`` names ``texts[i]``."""
        ids = [str(i) for i in ids]
        if len(ids) != len(texts):
            raise ValueError(f"bm25: {len(ids)} ids but {len(texts)} texts")
        if len(set(ids)) != len(ids):
            raise ValueError("bm25: ids must be unique")
        engine = None
        tokens = [tokenize(t) for t in texts]
        if any(tokens):  # bm25s needs one token at least (avgdl > 0); else nothing can match
            engine = bm25s.BM25(k1=k1, b=b, method="lucene", dtype="float64")
            engine.index(tokens, show_progress=False)
        index = cls(ids, engine, k1, b, dict(stamps or {}))
        index.doc_lengths = np.asarray([len(t) for t in tokens], dtype=np.float64)
        return index

    def set_doc_lengths(self, texts: Sequence[str]) -> None:
        """Tokens per document from the indexed ``texts`` (in ``ids`` order), for an index
        saved before they were stored."""
        self.doc_lengths = np.asarray([len(tokenize(t)) for t in texts], dtype=np.float64)

    def search(
        self, query: str, k: int = 20, mask: np.ndarray | None = None
    ) -> list[tuple[str, float]]:
        """Top ``k`` ``(id, score)`` by score descending, ties by id ascending; no zero scores.
        With ``mask`` (bool per id): only those documents, scored with the subset's own
        statistics (see the module docstring)."""
        if k <= 0 or self._engine is None:
            return []
        token_ids = self._engine.get_tokens_ids(tokenize(query))
        if not token_ids:
            return []
        if mask is None or bool(mask.all()):  # the whole index: its own statistics
            raw = self._engine.get_scores_from_ids(token_ids)
        elif not mask.any():
            return []
        elif self.doc_lengths is None:  # an old index: filtered, corpus-wide statistics
            raw = np.where(mask, self._engine.get_scores_from_ids(token_ids), 0.0)
        else:
            raw = self._subset_scores(token_ids, mask)
        hits = np.flatnonzero(raw > 0)
        if len(hits) > k:
            # keep every document tied with the k-th score so the id tie-break is exact
            kth = np.partition(raw[hits], len(hits) - k)[len(hits) - k]
            hits = hits[raw[hits] >= kth]
        order = np.lexsort((self._id_rank[hits], -raw[hits]))[:k]
        scale = self.k1 + 1.0  # bm25s omits the constant (k1+1) factor of the tf part
        return [(self.ids[i], float(raw[i]) * scale) for i in hits[order]]

    def _subset_scores(self, token_ids: list[int], mask: np.ndarray) -> np.ndarray:
        """BM25 (without the ``k1+1`` factor, as bm25s stores it) of the documents in ``mask``,
        with ``N``, ``n_t`` and ``avgdl`` of that subset; 0 elsewhere."""
        assert self._engine is not None and self.doc_lengths is not None
        matrix = self._engine.scores
        data, indices, indptr = matrix["data"], matrix["indices"], matrix["indptr"]
        dl = self.doc_lengths
        n_all, avg_all = len(self.ids), float(dl.mean())
        n_sub, avg_sub = int(mask.sum()), float(dl[mask].mean())
        k1, b = self.k1, self.b
        out = np.zeros(n_all, dtype=np.float64)
        for t in token_ids:  # a repeated query token counts twice, as in get_scores_from_ids
            lo, hi = int(indptr[t]), int(indptr[t + 1])
            docs = np.asarray(indices[lo:hi])
            keep = mask[docs]
            n_t = int(keep.sum())
            if not n_t:
                continue
            docs = docs[keep]
            idf_all = np.log(1.0 + (n_all - (hi - lo) + 0.5) / ((hi - lo) + 0.5))
            x = np.asarray(data[lo:hi], dtype=np.float64)[keep] / idf_all  # tf / (tf + K)
            k_all = k1 * (1.0 - b + b * dl[docs] / avg_all)
            tf = np.rint(k_all * x / (1.0 - x))
            idf = np.log(1.0 + (n_sub - n_t + 0.5) / (n_t + 0.5))
            k_sub = k1 * (1.0 - b + b * dl[docs] / avg_sub)
            out[docs] += idf * tf / (tf + k_sub)
        return out

    def save(self, directory: Path) -> None:
        """Write the index to ``directory`` atomically (temp dir, then rename into place).

        A crash leaves either the previous complete index, the new complete one, or (only
        between the two renames that replace an existing index) none; never a partial one.
        """
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
        try:
            if self._engine is not None:
                self._engine.save(tmp, show_progress=False)
            if self.doc_lengths is not None:  # issue 34: subset statistics
                np.save(tmp / _LENGTHS, self.doc_lengths.astype(np.int32), allow_pickle=False)
            meta = {
                "format": 1,
                "definition": self.definition,
                "bm25s_version": bm25s.__version__,
                "stamps": self.stamps,
                "ids": self.ids,
                "matrix": self._engine is not None,
            }
            with open(tmp / _META, "w", encoding="utf-8") as f:
                json.dump(meta, f, ensure_ascii=False, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            replace_dir(tmp, directory)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, directory: Path, expect_stamps: dict[str, Any] | None = None) -> BM25Index:
        """Load a saved index; refuse when its stamps or scoring definition differ."""
        directory = Path(directory)
        meta_path = directory / _META
        if not meta_path.is_file():
            raise FileNotFoundError(f"bm25: no index at {directory} (missing {_META})")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        stamps = meta["stamps"]
        if expect_stamps is not None and _canon(_scored(stamps)) != _canon(_scored(expect_stamps)):
            raise ValueError(
                f"bm25: index at {directory} is stale: stored stamps {_canon(stamps)} "
                f"differ from expected {_canon(expect_stamps)}; rebuild it"
            )
        ids: list[str] = meta["ids"]
        definition = meta["definition"]
        k1, b = float(definition["k1"]), float(definition["b"])
        index = cls(ids, None, k1, b, stamps)
        if definition != index.definition:
            raise ValueError(
                f"bm25: index at {directory} was built with {definition}, "
                f"this code scores with {index.definition}; rebuild it"
            )
        if meta["matrix"]:
            engine = bm25s.BM25.load(directory, show_progress=False)
            if int(engine.scores["num_docs"]) != len(ids):
                raise ValueError(f"bm25: index at {directory} is inconsistent (ids vs matrix)")
            index._engine = engine
        lengths = directory / _LENGTHS
        if lengths.is_file():
            dl = np.load(lengths, allow_pickle=False).astype(np.float64)
            if len(dl) == len(ids):
                index.doc_lengths = dl
        return index

    def to_files(self) -> dict[str, bytes]:
        """The files :meth:`save` writes, by name: what an object store keeps as rows keyed by
        table version (``IndexStore.save_bm25``); :meth:`from_files` reads them back."""
        with tempfile.TemporaryDirectory(prefix="bm25-") as tmp:
            out = Path(tmp) / "index"
            self.save(out)
            return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}

    @classmethod
    def from_files(
        cls, files: dict[str, bytes], where: str, expect_stamps: dict[str, Any] | None = None
    ) -> BM25Index:
        """Load an index from :meth:`to_files`' output (``where`` names it in errors)."""
        if _META not in files:
            raise FileNotFoundError(f"bm25: no index at {where} (missing {_META})")
        with tempfile.TemporaryDirectory(prefix="bm25-") as tmp:
            for name, data in files.items():
                if "/" in name or name.startswith("."):
                    raise ValueError(f"bm25: index at {where} holds a bad file name {name!r}")
                (Path(tmp) / name).write_bytes(data)
            try:
                return cls.load(Path(tmp), expect_stamps)
            except (ValueError, FileNotFoundError) as exc:
                raise type(exc)(str(exc).replace(tmp, where)) from None


def _scored(stamps: dict[str, Any]) -> dict[str, Any]:
    """The stamps a lexical index must match: all but the extractor suite's version, which
    changes with a rag_assets upgrade while ``table@version`` still pins the exact texts.
    Indexes saved before precision was stamped (issue 23) were fp32."""
    return {k: v for k, v in {"precision": "fp32", **stamps}.items() if k != "extractor"}


def _canon(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, ensure_ascii=False, default=str)


# -- LanceDB's own inverted index (issue 23) ---------------------------------------------------
NATIVE_FTS_CONFIG: dict[str, Any] = {
    "base_tokenizer": "simple",
    "lower_case": True,
    "stem": False,
    "remove_stop_words": False,
    "ascii_folding": False,
    "max_token_length": None,
    "with_position": False,
}
"""``lancedb.index.FTS`` options that make LanceDB's native BM25 the design's: lower-cased
alphanumeric runs, no stemming, no stop words; Lance scores with Lucene's BM25 (k1 1.2, b 0.75),
so on ASCII text its scores equal :class:`BM25Index`'s (``test_native_fts.py``). It differs
only on non-ASCII letters, which Lance keeps inside tokens and :func:`tokenize` splits on."""


class NativeFTS:
    """BM25 over a LanceDB table's own full-text index (stored with the table, wherever the
    table lives), with :meth:`BM25Index.search`'s contract: top ``k`` ``(id, score)``, score
    descending, ties by id ascending, no zero scores."""

    def __init__(self, table: Any, id_column: str = "chunk_id", text_column: str = "text"):
        self.table = table
        self.id_column = id_column
        self.text_column = text_column

    @classmethod
    def build(cls, table: Any, text_column: str = "text", id_column: str = "chunk_id") -> NativeFTS:
        """Create (or replace) the native index on ``text_column``: one index commit."""
        from lancedb.index import FTS

        table.create_index(text_column, config=FTS(**NATIVE_FTS_CONFIG), replace=True)
        return cls(table, id_column, text_column)

    def search(self, query: str, k: int = 20, where: str | None = None) -> list[tuple[str, float]]:
        """``where`` (a LanceDB SQL filter, issue 34) is applied during the search
        (``prefilter``): ``k`` hits whenever ``k`` matching rows hold a query term."""
        if k <= 0 or not tokenize(query):
            return []
        q = self.table.search(query, query_type="fts", fts_columns=self.text_column)
        if where:
            q = q.where(where, prefilter=True)
        rows = (
            q.select([self.id_column, "_score"])
            .limit(k + NATIVE_TIE_SLACK)  # ties at the k-th score are broken by id below
            .to_list()
        )
        hits = sorted(
            ((str(r[self.id_column]), float(r["_score"])) for r in rows if r["_score"] > 0),
            key=lambda h: (-h[1], h[0]),
        )
        return hits[:k]


NATIVE_FTS_MIN_ROWS = 500_000
"""Rows from which a chunk table's lexical index is LanceDB's own full-text index
(:class:`NativeFTS`, stored with the table, wherever it lives) instead of bm25s files. Measured
(``python -m rag_assets.bench.fts``, docs/measurements.md): the two rank alike on course-dev,
SciFact and NFCorpus (sign tests p = 1.0), and at 1 M chunks bm25s must hold the whole corpus
and its sparse matrix in memory, where Lance builds its index from the table in a fraction of
the memory. Below this, bm25s stays: its queries take well under a millisecond."""

NATIVE_FTS_REINDEX_FRACTION = 0.1
"""Rebuild the native index when more than this share of the rows is outside it (rows added
since are still found, by a flat search beside the index, only slower)."""


def fts_index(table: Any, text_column: str = "text") -> Any | None:
    """The native full-text index on ``text_column`` of ``table`` (its checked-out version),
    or None."""
    for idx in table.list_indices():
        if text_column in list(idx.columns) and str(idx.index_type).upper() in ("FTS", "INVERTED"):
            return idx
    return None


def uses_native_fts(table: Any, rows: int) -> bool:
    """Whether queries on this table version search its native index (:data:`NATIVE_FTS_MIN_ROWS`
    rows or more, and the index exists in the version)."""
    return rows >= NATIVE_FTS_MIN_ROWS and fts_index(table) is not None


def ensure_fts_index(table: Any, min_rows: int | None = None) -> bool:
    """Build (or rebuild) the native index when ``table`` has ``min_rows`` rows or more
    (default :data:`NATIVE_FTS_MIN_ROWS`) and has none, or more than
    :data:`NATIVE_FTS_REINDEX_FRACTION` of its rows are outside it; a new table version.
    Returns whether it built."""
    least = NATIVE_FTS_MIN_ROWS if min_rows is None else min_rows
    if not index_due(table, fts_index(table), least, NATIVE_FTS_REINDEX_FRACTION):
        return False
    NativeFTS.build(table)
    return True


NATIVE_TIE_SLACK = 16
"""Extra rows fetched past ``k`` so that documents tied with the k-th score can be ordered by
id (Lance orders ties arbitrarily); more than 16 ties at one cut are left to Lance's order."""
