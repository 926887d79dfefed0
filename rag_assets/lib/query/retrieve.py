"""The query side: ``Index.open(uri).search(q)`` / ``.ask(q)``.

Retrievers: ``dense`` (LanceDB cosine search), ``bm25`` (persisted lexical index), ``hybrid``
(reciprocal rank fusion of the two), ``rerank`` (a cross-encoder over the hybrid top 25).
Every hit carries its cosine distance (computed from the stored vector for BM25-only hits)
so the refusal gate can say no before any generator is called.

Issue 34: ``search`` and ``ask`` take a :class:`~rag_assets.lib.query.filters.Scope` (a metadata
filter and the caller's groups). It is applied during the search, never after it: the dense
side scans or probes only the matching rows (a numpy mask, or LanceDB's ``prefilter`` on the
exact scan and the ANN index, falling back to the exact filtered scan when the index returns
fewer than ``k`` of at least ``k`` matching rows), the lexical side scores only them with their
own statistics (bm25s) or prefilters (LanceDB's full-text index), and fusion, the reranker, the
gate and the citations see nothing else. A hidden document moves no distance, score or rank.

A version of :data:`RESIDENT_MAX_ROWS` rows or more is not held in memory (its rows and vectors
stay in LanceDB, read per query for the hits only; its documents are read when cited), so a
million-row service needs the ANN and full-text indexes' memory, not a copy of the table.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_assets.lib import observe
from rag_assets.lib.index.ann import FILTER_EXACT_MAX_ROWS, dense_search, search_mode
from rag_assets.lib.index.embed import Embedder, resolve_model
from rag_assets.lib.index.lexical import NATIVE_FTS_MIN_ROWS, BM25Index, NativeFTS, uses_native_fts
from rag_assets.lib.index.store import (
    DOCUMENTS_TABLE,
    POINTER_FILE,
    IndexStore,
    Published,
    StampMismatch,
    scan,
    sql_in,
    vectors,
)
from rag_assets.lib.index.views import load_views, pool_dense
from rag_assets.lib.query.cite import (
    DEFAULT_DISTANCE_CUT,
    Context,
    build_context,
    gate,
    ground_spans,
)
from rag_assets.lib.query.filters import DocumentFacts, Plan, Scope, positions, take
from rag_assets.lib.query.fusion import Fusion, parse_fusion
from rag_assets.lib.query.rerank import Reranker, load_reranker
from rag_assets.lib.types import Hit, Locator, locators_from_json
from rag_assets.settings import index_work_dir

RETRIEVERS = ("dense", "bm25", "hybrid", "rerank")
RESIDENT_MAX_ROWS = NATIVE_FTS_MIN_ROWS
"""Rows from which an :class:`Index` leaves its rows, vectors and document texts in LanceDB
(issue 34; read per query for the hits, per citation for the documents) instead of holding
them: from there the table has its ANN index and its native full-text index, which the
queries use anyway."""
HIT_ROWS_CACHE = 4096
"""Rows a non-resident :class:`Index` keeps from earlier queries (the same hits come back)."""
RERANK_DEPTH = 25  # shortlist the cross-encoder scores (the design's affordable depth)
CANDIDATE_DEPTH = 50  # per-retriever depth fed into fusion
_ROW_COLUMNS = [
    "chunk_id",
    "document_id",
    "document_title",
    "section",
    "from",
    "to",
    "page",
    "content",
    "text",
    "model",
    "model_revision",
    "dims",
    "pipeline_version",
    "extractor_version",
]


def require_index(uri: str | Path) -> None:
    """Refuse, in one line, a local index directory that does not exist: a query opens what is
    there and never creates anything (an object-store URI is checked by LanceDB itself)."""
    text = str(uri)
    if "://" in text:
        return
    path = Path(text).expanduser()
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise FileNotFoundError(
            f"no index at {path}: the directory {what} (pass --index DIR or set RAG_INDEX_URI "
            "to an indexed directory; `rag-assets index` builds one)"
        )


def require_published(uri: str | Path) -> None:
    """Refuse an index with nothing published before any model is loaded or exported (a query
    encoder export needs torch: not worth paying for an answer that is an error)."""
    require_index(uri)
    if IndexStore(uri).published() is None:
        raise FileNotFoundError(
            f"nothing is published in {uri}: run `rag-assets index` (or materialise the graph) "
            "first"
        )


@dataclass
class Timings:
    """Per-stage wall time of the last query, in milliseconds; each stage is also reported to
    the installed observer (:mod:`rag_assets.lib.observe`: the service's metrics and traces)."""

    stages: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + (now - since) * 1000
        observe.stage_done(stage, now - since)
        return now


class Index:
    """A published (or explicitly chosen) table version, ready to query."""

    @functools.cached_property
    def index_version(self) -> int | None:
        """The index's own version of this table version (issue 39/51: 1 for the first publish,
        as ``status``, the summary, the page and ``/healthz`` say it); None when the history
        does not list it."""
        from rag_assets.lib.index.store.records import index_versions

        return index_versions(self.store.history_records()).get(self.published.key)

    def __init__(
        self,
        store: IndexStore,
        published: Published,
        embedder: Embedder,
        reranker: Reranker | None = None,
        distance_cut: float | None = None,
        fusion: Fusion | None = None,
    ):
        self.fusion = fusion or Fusion()  # RAG_FUSION: how "hybrid" combines dense and BM25
        self.store = store
        self.published = published
        self.embedder = embedder
        self.reranker = reranker
        self.distance_cut = (
            distance_cut
            if distance_cut is not None
            else (published.threshold if published.threshold is not None else DEFAULT_DISTANCE_CUT)
        )
        self.table = store.open_table(published.table, published.version)
        stamps = published.stamps
        check = getattr(embedder, "check_table", None)  # issue 35: a served model's fingerprint
        if check is not None:
            check(stamps, store)  # one line when the served model is no longer the table's
        query_stamps = embedder.stamps(stamps.pipeline, stamps.extractor)
        diff = [d for d in stamps.differences(query_stamps) if not d.startswith("normalized")]
        if diff:
            raise StampMismatch(
                f"index table {published.table} was embedded with {stamps.model} "
                f"(rev {stamps.revision}, {stamps.dims} dims) but queries would be embedded with "
                f"{query_stamps.model} (rev {query_stamps.revision}, {query_stamps.dims} dims): "
                f"{'; '.join(diff)}. Set RAG_EMBEDDING_MODEL (and RAG_EMBED_DIMS, "
                "RAG_QUERY_PROMPT, RAG_DOCUMENT_PROMPT, RAG_EMBED_PRECISION) to the table's or "
                "re-index."
                + (  # issue 35: the table's vectors came from a model server
                    " It was embedded by a model server: set RAG_EMBED_URL and RAG_EMBED_MODEL."
                    if stamps.revision.startswith("fp-") and check is None
                    else ""
                )
            )
        self.bm25: BM25Index | NativeFTS
        if uses_native_fts(self.table, published.rows):  # issue 23: LanceDB's own index
            self.bm25 = NativeFTS(self.table)
        else:  # a directory, or _rag_bm25 rows (issue 13)
            self.bm25 = store.load_bm25(
                published.table,
                published.version,
                expect_stamps={
                    **stamps.as_dict(),
                    "table": published.table,
                    "version": published.version,
                },
            )
        # issue 34: below RESIDENT_MAX_ROWS the rows, vectors and texts are held (as before);
        # above, they stay in LanceDB and hits read theirs
        self.resident = published.rows < RESIDENT_MAX_ROWS
        self._rows: Any
        self._docs: Any
        self._vectors: np.ndarray | None = None
        self._vector_of: dict[str, int] = {}
        if self.resident:
            rows = scan(self.table, [*_ROW_COLUMNS, "vector"])
            self._rows = {r["chunk_id"]: r for r in rows.select(_ROW_COLUMNS).to_pylist()}
            self._vector_of = {cid: i for i, cid in enumerate(rows["chunk_id"].to_pylist())}
            self._vectors = vectors(rows["vector"], stamps.dims)
            self._docs = store.canonical_texts(published.documents_version)
        else:
            self._rows = _TableRows(self.table, stamps.dims)
            self._docs = _TableDocuments(store, published.documents_version)
        self.timings = Timings()
        self.judge: Any = None  # rag_assets.lib.query.judge.Judge when RAG_ANSWER_CHECK=llm
        # issue 15: doc2query views of this table version (None when it was not expanded)
        # and the query rewriter (rag_assets.lib.query.rewrite.QueryRewriter, RAG_QUERY_REWRITE)
        self.views = load_views(store, published.table, published.version, stamps.dims)
        self.rewriter: Any = None
        self.rewrite_weight: Any = None  # None = rewrite.REWRITE_WEIGHT; or (dense, bm25)
        self.last_rewrite: Any = None  # the Rewrite of the last query, if any
        # issue 10: the service ranks dense by an exact numpy scan of self._vectors (see
        # _dense_exact); only for a table without a vector index, where LanceDB scans too
        self.exact_dense = False
        # issue 49: a private object's citation as a presigned URL made when it is shown
        # (RAG_SOURCE_PRESIGN_SECONDS; rag_assets.lib.ingest.sources.objects.presigner)
        self.presign: Callable[[str], str | None] | None = None
        self._vector_ids = list(self._vector_of)  # row order of self._vectors
        self._ann_mode: tuple[bool, int] | None = None  # (use the ANN index, partitions), once
        # issue 34: the documents' metadata and access as arrays; which document each row,
        # each BM25 document and each view belongs to (positions in self.facts)
        self.facts = DocumentFacts.from_documents(self._docs if self.resident else self._docs.light)
        self._has_meta = "meta" in self.table.schema.names
        self._chunk_docs: dict[str, int] | None = None  # chunk id -> document (non-resident)
        self._doc_chunks: np.ndarray | None = None  # chunks per document (non-resident)
        self._row_doc = np.zeros(0, dtype=np.int64)
        if self.resident:
            ids = self._vector_ids
            self._row_doc = positions(self.facts, (self._rows[c]["document_id"] for c in ids))
            if isinstance(self.bm25, BM25Index) and self.bm25.doc_lengths is None:
                self.bm25.set_doc_lengths([self._rows[c]["text"] for c in self.bm25.ids])
        self._aligned: dict[str, np.ndarray] = {}  # "bm25", "views", "views-bm25"

    @classmethod
    def open(
        cls,
        uri: str | Path | None = None,
        *,
        model: str | None = None,
        rerank_model: str | None = None,
        distance_cut: float | None = None,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
    ) -> Index:
        """Open the published table version of an index directory.

        ``model`` / ``rerank_model`` / ``distance_cut`` default to ``RAG_EMBEDDING_MODEL``,
        ``RAG_RERANK_MODEL`` and ``RAG_DISTANCE_CUT`` (else the calibrated cut, else 0.675).
        """
        uri = uri or os.environ.get("RAG_INDEX_URI", "data/index")
        require_index(uri)
        store = IndexStore(uri)
        published = store.published()
        if published is None:
            raise FileNotFoundError(
                f"nothing is published in {uri}: run `rag-assets index` (or materialise the "
                "graph) first"
            )
        if embedder is None and os.environ.get("RAG_EMBED_URL"):  # issue 35: a model server
            from rag_assets.lib.index.endpoint import EndpointConfig, query_endpoint
            from rag_assets.settings import Settings

            settings = dataclasses.replace(Settings.from_env(os.environ), index_uri=str(uri))
            config = EndpointConfig.from_settings(settings)
            assert config is not None
            embedder = query_endpoint(settings, config)
        if embedder is None:
            env = os.environ
            spec = resolve_model(
                model or env.get("RAG_EMBEDDING_MODEL"),
                dims=int(env.get("RAG_EMBED_DIMS") or 0),
                query_prompt=env.get("RAG_QUERY_PROMPT", ""),
                document_prompt=env.get("RAG_DOCUMENT_PROMPT", ""),
                precision=env.get("RAG_EMBED_PRECISION", "fp32"),
            )
            # issue 32: a table embedded by an adapted model is queried with that model
            from rag_assets.lib.index.adapted import query_spec

            spec = query_spec(str(uri), spec, env.get("RAG_WORK_DIR", "data/work"))
            embedder = Embedder(spec, device=env.get("RAG_DEVICE", "auto"))
        if reranker is None:
            reranker = load_reranker(rerank_model or os.environ.get("RAG_RERANK_MODEL"))
        if distance_cut is None and os.environ.get("RAG_DISTANCE_CUT"):
            distance_cut = float(os.environ["RAG_DISTANCE_CUT"])
        fusion = parse_fusion(os.environ.get("RAG_FUSION"))
        index = cls(store, published, embedder, reranker, distance_cut, fusion)
        if os.environ.get("RAG_QUERY_REWRITE"):  # issue 15: off unless set
            from rag_assets.lib.query.rewrite import load_rewriter

            env = os.environ
            index.rewriter = load_rewriter(
                env["RAG_QUERY_REWRITE"],
                env.get("RAG_LLM_URL", ""),
                env.get("RAG_LLM_MODEL", ""),
                env.get("RAG_LLM_API_KEY", ""),
                Path(env.get("RAG_WORK_DIR") or index_work_dir(str(uri))) / "rewrite-cache",
            )
        return index

    # -- retrieval ------------------------------------------------------------------------
    def search(
        self,
        query: str,
        retriever: str = "hybrid",
        k: int = 20,
        *,
        scope: Scope | None = None,
    ) -> list[Hit]:
        """Ranked hits of one retriever, each with its cosine distance to the query; with a
        ``scope`` (issue 34) only chunks of the documents it matches and may see, filtered
        during the search (``k`` hits whenever ``k`` such chunks match; see the module doc).
        Raises :class:`~rag_assets.lib.query.filters.FilterError` for an unknown key."""
        if retriever not in RETRIEVERS:
            raise ValueError(f"retriever must be one of {RETRIEVERS}, not {retriever!r}")
        if retriever == "rerank" and self.reranker is None:
            raise RuntimeError("rerank: no model configured (set RAG_RERANK_MODEL)")
        plan = self.plan(scope)
        self.timings = Timings()
        t = time.perf_counter()
        check = getattr(self.embedder, "check_table", None)
        if check is not None:  # issue 35: the service re-probes; a changed model is refused
            check(self.published.stamps, self.store)
        qvec = self.embedder.encode_query(query)
        t = self.timings.add("embed", t)
        depth = max(k, self.fusion.depth) if retriever in ("hybrid", "rerank") else k
        dense: list[tuple[str, float]] = []
        lexical: list[tuple[str, float]] = []
        if retriever != "bm25":
            dense = self._dense_pooled(qvec, depth, plan)
            t = self.timings.add("dense", t)
        if retriever != "dense":
            lexical = self._lexical(query, depth, plan)
            t = self.timings.add("bm25", t)
        if retriever == "dense":
            ranked = [(cid, 1.0 - d) for cid, d in dense]
        elif retriever == "bm25":
            ranked = lexical
        elif self.rewriter is not None and self.fusion.method == "rrf":
            ranked = self._fuse_with_rewrite(query, dense, lexical, depth, plan)
            t = self.timings.add("rewrite+fuse", t)
        else:
            ranked = self.fusion.fuse([c for c, _ in dense], [c for c, _ in lexical])
            t = self.timings.add("fuse", t)
        if not self.resident:  # the rows of what is shown (and reranked), in one read
            short = getattr(self.reranker, "depth", RERANK_DEPTH) if retriever == "rerank" else 0
            self._rows.prefetch([cid for cid, _ in ranked[: max(k, short)]])
        if retriever == "rerank":
            assert self.reranker is not None
            short = ranked[: getattr(self.reranker, "depth", RERANK_DEPTH)]  # RAG_RERANK_DEPTH
            scored = self.reranker.rerank(query, short, text_of=lambda x: self._rows[x[0]]["text"])
            t = self.timings.add("rerank", t)
            # the shortlist in cross-encoder order, then the rest of the fused list unchanged;
            # a reranker that could not score (a /rerank server, issue 35) keeps hybrid order
            hits = [
                self._hit(cid, s, i + 1, retriever, qvec, rerank_score=s)
                if s is not None
                else self._hit(cid, fused, i + 1, "hybrid", qvec)
                for i, ((cid, fused), s) in enumerate(scored)
            ]
            tail = ranked[len(short) : k]
            kept = retriever if any(s is not None for _, s in scored) or not scored else "hybrid"
            hits += [
                self._hit(cid, s, len(hits) + i + 1, kept, qvec) for i, (cid, s) in enumerate(tail)
            ]
            return hits[:k]
        return [self._hit(cid, s, i + 1, retriever, qvec) for i, (cid, s) in enumerate(ranked[:k])]

    def ask(
        self,
        question: str,
        *,
        rerank: bool = True,
        base_url: str | None = None,
        show_nearest: bool = False,
        scope: Scope | None = None,
        hits_out: list[Hit] | None = None,
    ) -> Context:
        """Retrieve, gate by the distance cut, and build the cited context (no generation);
        with a ``scope``, from the documents it matches and may see only (issue 34).

        The context carries the nearest distance either way; ``show_nearest`` adds the closest
        sources that did not pass (``ctx.nearest``: below the bar, never in ``ctx.prompt``).
        ``hits_out`` receives the ranked hits the gate saw (the query log records them)."""
        retriever = "rerank" if (rerank and self.reranker is not None) else "hybrid"
        hits = self.search(question, retriever=retriever, k=RERANK_DEPTH, scope=scope)
        if hits_out is not None:
            hits_out.extend(hits)
        t = time.perf_counter()
        ctx = build_context(
            question,
            hits,
            threshold=self.distance_cut,
            canonical_text=lambda d: self._docs[d]["text"],
            base_url=base_url or os.environ.get("RAG_BASE_URL") or None,
            document_path=self.link_path,
            document_name=lambda d: Path(d).name,
            document_locators=self._locators,
            show_nearest=show_nearest,
        )
        self.timings.add("cite", t)  # gate, quotes verified, locators, pinpoint spans (issue 21)
        if self.judge is not None and not ctx.no_answer:  # RAG_ANSWER_CHECK: after the distance
            t = time.perf_counter()
            kept = gate(hits, self.distance_cut)
            verdict = self.judge.check(question, [h.text for h in kept])
            self.timings.add("judge", t)
            ctx.judge = verdict.to_dict()
            if not verdict.answers:
                ctx = ctx.refused_by_judge(verdict.to_dict(), show_nearest)
        return ctx

    def ground(self, ctx: Context, answer_text: str) -> Context:
        """``ctx`` with each cited chunk's span chosen again by the written answer's sentences
        that cite it (:func:`~rag_assets.lib.query.cite.ground_spans`); unchanged when refused."""
        if ctx.no_answer or not ctx.citations:
            return ctx
        t = time.perf_counter()
        cited = ground_spans(
            ctx.question,
            ctx.citations,
            answer_text,
            canonical_text=lambda d: self._docs[d]["text"],
            document_locators=self._locators,
        )
        self.timings.add("ground spans", t)
        return dataclasses.replace(ctx, citations=cited)

    def link_path(self, document_id: str) -> str:
        """The path a citation of ``document_id`` links (its stored path; a private object's
        presigned URL when :attr:`presign` is set, issue 49: made now, stored nowhere)."""
        path = str(self._docs[document_id]["path"])
        signed = self.presign(path) if self.presign is not None else None
        return signed or path

    def verify(self, ctx: Context, answer_text: str, second_opinion: Any = None) -> Any:
        """Issue 50: every sentence of ``answer_text`` checked against ``ctx``'s numbered
        sources (:func:`~rag_assets.lib.query.verify.verify_answer`); the time it took is the
        ``verify`` stage of :attr:`timings`. Only the sources of ``ctx`` are read: those the
        caller's scope retrieved."""
        from rag_assets.lib.query.verify import verify_answer

        t = time.perf_counter()
        result = verify_answer(
            answer_text, self.sources(ctx), question=ctx.question, second_opinion=second_opinion
        )
        self.timings.add("verify", t)
        return result

    def sources(self, ctx: Context) -> list[Any]:
        """``ctx``'s citations as the verifier reads them (issue 50: each chunk with its
        sentences, rows or cues and their locators)."""
        from rag_assets.lib.query.verify import sources_of

        return sources_of(ctx.citations, self._locators)

    def _locators(self, document_id: str) -> tuple[str, list[Locator]]:
        """(kind, locator map) of a published document, for its citations' locators."""
        doc = self._docs[document_id]
        return doc["kind"], locators_from_json(doc.get("locators_json"))

    @property
    def documents(self) -> dict[str, dict[str, Any]]:
        """document_id → {text, title, path, kind, page_starts} of the indexed version."""
        return self._docs

    def nearest_distances(self, qvecs: np.ndarray, block: int = 512) -> np.ndarray:
        """Per query vector, the cosine distance of the nearest chunk: the distance the gate
        decides on (a question is answered iff a retrieved chunk is under the cut, and the
        nearest one is retrieved). Issue 53: thousands of calibration questions in one matrix
        product on a resident table, one dense search each on a larger one."""
        qvecs = np.asarray(qvecs, dtype=np.float32).reshape(-1, self.published.stamps.dims)
        out = np.full(len(qvecs), 2.0, dtype=np.float64)
        if self._vectors is not None and len(self._vectors):
            for start in range(0, len(qvecs), block):
                sims = qvecs[start : start + block] @ self._vectors.T
                out[start : start + block] = 1.0 - sims.max(axis=1)
            return out
        for i, qvec in enumerate(qvecs):
            hits = self._dense(qvec, 1)
            if hits:
                out[i] = float(hits[0][1])
        return out

    def chunk_contents(self) -> list[str]:
        if not self.resident:
            return [str(c) for c in scan(self.table, ["content"])["content"].to_pylist()]
        return [r["content"] for r in self._rows.values()]

    # -- scopes (issue 34) ------------------------------------------------------------------
    def plan(self, scope: Scope | None) -> Plan | None:
        """``scope`` resolved against this version (None: everything, the fast path). Raises
        :class:`~rag_assets.lib.query.filters.FilterError` for an unknown key."""
        if scope is None or scope.unrestricted:
            return None
        docs = self.facts.mask(scope)
        if bool(docs.all()):
            return None  # sees everything: exactly the unrestricted search
        if self.resident:
            rows = take(docs, self._row_doc)
            count = int(rows.sum())
        else:
            rows, count = None, int(self._chunk_counts()[docs].sum())
        sql: str | None = scope.sql()
        if not self._has_meta:  # a version from before issue 34: by document id
            allowed = [self.facts.ids[i] for i in np.flatnonzero(docs).tolist()]
            sql = sql_in("document_id", allowed) if allowed else "false"
        return Plan(docs, rows, count, sql)

    def visible(self, document_id: str, groups: frozenset[str] | None) -> bool:
        """Whether a caller with ``groups`` (None: everything) may see ``document_id``."""
        i = self.facts.pos.get(document_id)
        if i is None:
            return groups is None and document_id in self._docs
        return bool(self.facts.visible(groups)[i])

    def facets(self, groups: frozenset[str] | None) -> dict[str, Any]:
        """The folders and metadata keys (with their values) of the documents ``groups`` see."""
        return self.facts.facets(groups)

    def _chunk_counts(self) -> np.ndarray:
        """Chunks per document (non-resident: one read of the document id column)."""
        if self._doc_chunks is None:
            col = scan(self.table, ["document_id"])["document_id"]
            counts = np.zeros(len(self.facts), dtype=np.int64)
            for item in col.value_counts().to_pylist():
                i = self.facts.pos.get(str(item["values"]))
                if i is not None:
                    counts[i] = int(item["counts"])
            self._doc_chunks = counts
        return self._doc_chunks

    def _doc_positions(self, chunk_ids: list[str]) -> np.ndarray:
        """The document position of each chunk id (-1: unknown)."""
        if self.resident:
            return np.asarray(
                [
                    self._row_doc[self._vector_of[c]] if c in self._vector_of else -1
                    for c in chunk_ids
                ],
                dtype=np.int64,
            )
        if self._chunk_docs is None:
            rows = scan(self.table, ["chunk_id", "document_id"])
            pos = positions(self.facts, rows["document_id"].to_pylist())
            self._chunk_docs = dict(zip(rows["chunk_id"].to_pylist(), pos.tolist(), strict=True))
        return np.asarray([self._chunk_docs.get(c, -1) for c in chunk_ids], dtype=np.int64)

    def _mask_for(self, name: str, chunk_ids: list[str], plan: Plan) -> np.ndarray:
        """``plan``'s documents over ``chunk_ids`` (the BM25 ids, the views' chunks), with the
        chunks' document positions computed once per name."""
        where = self._aligned.get(name)
        if where is None:
            where = self._aligned[name] = self._doc_positions(chunk_ids)
        return take(plan.docs, where)

    # -- internals ------------------------------------------------------------------------
    def _fuse_with_rewrite(
        self,
        query: str,
        dense: list[tuple[str, float]],
        lexical: list[tuple[str, float]],
        depth: int,
        plan: Plan | None = None,
    ) -> list[tuple[str, float]]:
        """Issue 15: the original's two rankings at the fusion's weights, plus the rewrite's
        two at ``REWRITE_WEIGHT`` times those (see rag_assets/lib/query/rewrite.py)."""
        from rag_assets.lib.query.rewrite import REWRITE_WEIGHT, fuse_with_rewrite

        rw = self.rewriter.rewrite(query)
        self.last_rewrite = rw
        d = self.fusion.depth
        wd, wb = self.fusion.weights["dense"], self.fusion.weights["bm25"]
        if not rw.text:
            return self.fusion.fuse([c for c, _ in dense], [c for c, _ in lexical])
        rvec = self.embedder.encode_query(rw.text)
        r_dense = self._dense_pooled(rvec, depth, plan)
        r_lex = self._lexical(rw.text, depth, plan)
        w = REWRITE_WEIGHT if self.rewrite_weight is None else self.rewrite_weight
        return fuse_with_rewrite(
            [[c for c, _ in dense[:d]], [c for c, _ in lexical[:d]]],
            [[c for c, _ in r_dense[:d]], [c for c, _ in r_lex[:d]]],
            weight=w,
            k=self.fusion.k,
            side_weights=(wd, wb),
        )

    def _dense_pooled(self, qvec: np.ndarray, k: int, plan: Plan | None) -> list[tuple[str, float]]:
        """The dense ranking, with the views' (a view hit is its chunk, at the view's
        distance) when the version has doc2query views."""
        dense = self._dense(qvec, k, plan)
        if self.views is not None:
            mask = None if plan is None else self._mask_for("views", self.views.chunk_ids, plan)
            dense = pool_dense(dense, self.views.dense(qvec, k, mask), k=k)
        return dense

    def _lexical(self, query: str, k: int, plan: Plan | None) -> list[tuple[str, float]]:
        """The BM25 ranking (the views' expanded BM25 when there are views), within ``plan``:
        bm25s scores only the plan's chunks, LanceDB's index prefilters (issue 34)."""
        source = self.views.bm25 if self.views is not None else self.bm25
        if plan is None:
            return source.search(query, k)
        if plan.count == 0:
            return []
        if isinstance(source, NativeFTS):
            return source.search(query, k, where=plan.sql)
        name = "views-bm25" if self.views is not None else "bm25"
        return source.search(query, k, mask=self._mask_for(name, source.ids, plan))

    def _dense(self, qvec: np.ndarray, k: int, plan: Plan | None = None) -> list[tuple[str, float]]:
        if plan is not None and plan.count == 0:
            return []
        if self.exact_dense and self._vectors is not None:
            return self._dense_exact(qvec, k, plan)
        # issue 13: LanceDB's exact scan below ann.ANN_MIN_ROWS, its IVF-SQ index above (once)
        if self._ann_mode is None:
            self._ann_mode = search_mode(self.table, self.published.rows)
        ann, partitions = self._ann_mode
        where = plan.sql if plan is not None else None
        share = 1.0
        if plan is not None and ann:  # issue 40: a selective filter scans, a wider one probes more
            ann = plan.count > FILTER_EXACT_MAX_ROWS
            share = plan.count / max(1, self.published.rows)
        hits = dense_search(
            self.table, qvec, k, ann=ann, partitions=partitions, where=where, share=share
        )
        if plan is not None and ann and len(hits) < min(k, plan.count):
            # the probed partitions held fewer matching rows than k: the exact filtered scan
            hits = dense_search(self.table, qvec, k, ann=False, where=where)
        return hits

    def _dense_exact(
        self, qvec: np.ndarray, k: int, plan: Plan | None = None
    ) -> list[tuple[str, float]]:
        """Exact cosine kNN over the held vectors (unit length, as stored): the same ranking as
        LanceDB's flat scan up to float32 rounding (course index, 114 queries: 112 identical
        top-50 orders, max |distance difference| 2.4e-7), in 0.4 ms instead of ~10-20 ms (six
        round trips to LanceDB's event-loop thread, which concurrent requests queue on)."""
        assert self._vectors is not None
        ids = self._vector_ids
        q = np.asarray(qvec, dtype=np.float32)
        if plan is not None and plan.rows is not None:  # only the plan's rows are scanned
            rows = np.flatnonzero(plan.rows)
            dist = 1.0 - self._vectors[rows] @ q
        else:
            rows = np.arange(len(ids))
            dist = 1.0 - self._vectors @ q
        k = min(k, len(rows))
        top = np.argpartition(dist, k - 1)[:k] if 0 < k < len(rows) else np.arange(k)
        return sorted(((ids[rows[i]], float(dist[i])) for i in top), key=lambda x: (x[1], x[0]))

    def _hit(
        self,
        chunk_id: str,
        score: float,
        rank: int,
        retriever: str,
        qvec: np.ndarray,
        rerank_score: float | None = None,
    ) -> Hit:
        r = self._rows[chunk_id]
        vec = (
            self._vectors[self._vector_of[chunk_id]]
            if self._vectors is not None
            else self._rows.vector(chunk_id)
        )
        return Hit(
            chunk_id=chunk_id,
            document_id=r["document_id"],
            section=r["section"],
            start=int(r["from"]),
            end=int(r["to"]),
            content=r["content"],
            text=r["text"],
            page=r["page"],
            score=float(score),
            rank=rank,
            retriever=retriever,
            cosine_distance=float(1.0 - float(np.dot(qvec, vec))),
            rerank_score=rerank_score,
            stamps={
                "model": r["model"],
                "revision": r["model_revision"],
                "dims": r["dims"],
                "pipeline": r["pipeline_version"],
                "extractor": r["extractor_version"],
                "table": self.published.table,
                "version": self.published.version,
            },
            title=r["document_title"],
        )


class _TableRows:
    """A non-resident version's rows (issue 34): read from LanceDB for the ids a query shows
    (:meth:`prefetch`, one read), kept for the next :data:`HIT_ROWS_CACHE` rows."""

    def __init__(self, table: Any, dims: int):
        import threading

        self.table = table
        self.dims = dims
        self._cache: dict[str, tuple[dict[str, Any], np.ndarray]] = {}
        self._lock = threading.Lock()  # the service queries from several threads

    def prefetch(self, chunk_ids: list[str]) -> None:
        with self._lock:
            missing = [c for c in dict.fromkeys(chunk_ids) if c not in self._cache]
        if not missing:
            return
        got = scan(self.table, [*_ROW_COLUMNS, "vector"], where=sql_in("chunk_id", missing))
        vecs = vectors(got["vector"], self.dims)
        with self._lock:
            for row, vec in zip(got.select(_ROW_COLUMNS).to_pylist(), vecs, strict=True):
                self._cache[row["chunk_id"]] = (row, vec)
            keep = set(missing)
            for old in [c for c in self._cache if c not in keep][
                : max(0, len(self._cache) - HIT_ROWS_CACHE)
            ]:
                del self._cache[old]

    def _get(self, chunk_id: str) -> tuple[dict[str, Any], np.ndarray]:
        found = self._cache.get(chunk_id)
        if found is None:
            self.prefetch([chunk_id])
            found = self._cache[chunk_id]
        return found

    def __getitem__(self, chunk_id: str) -> dict[str, Any]:
        return self._get(chunk_id)[0]

    def vector(self, chunk_id: str) -> np.ndarray:
        return self._get(chunk_id)[1]

    def values(self) -> list[dict[str, Any]]:
        cols = scan(self.table, _ROW_COLUMNS)
        return list(cols.to_pylist())


class _TableDocuments(Mapping[str, dict[str, Any]]):
    """A non-resident version's documents (issue 34): every document's title, path, kind and
    metadata are held (:attr:`light`); its text, pages and locators are read when it is cited
    or shown (the last 256 kept)."""

    _FULL = ("text", "page_starts", "locators_json")

    def __init__(self, store: IndexStore, version: int):
        import threading

        self.light = store.canonical_texts(version, text=False)
        self._lock = threading.Lock()
        self._store = store
        self._version = version
        self._full: dict[str, dict[str, Any]] = {}

    def __getitem__(self, document_id: str) -> dict[str, Any]:
        light = self.light[document_id]
        found = self._full.get(document_id)
        if found is None:
            tbl = self._store.open_table(DOCUMENTS_TABLE, self._version)
            cols = ["document_id", *(c for c in self._FULL if c in tbl.schema.names)]
            got = scan(tbl, cols, where=sql_in("document_id", [document_id])).to_pylist()
            found = {**light, **(got[0] if got else {})}
            with self._lock:
                self._full[document_id] = found
                for old in list(self._full)[: max(0, len(self._full) - 256)]:
                    del self._full[old]
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self.light)

    def __len__(self) -> int:
        return len(self.light)

    def __contains__(self, document_id: object) -> bool:
        return document_id in self.light

    def items(self) -> Any:  # type: ignore[override]
        """Every document in full, in one read of the documents table (an evaluation reads
        them all; one query instead of one per document), not kept."""
        tbl = self._store.open_table(DOCUMENTS_TABLE, self._version)
        cols = ["document_id", *(c for c in self._FULL if c in tbl.schema.names)]
        full = {r["document_id"]: r for r in scan(tbl, cols).to_pylist()}
        return [(d, {**light, **full.get(d, {})}) for d, light in self.light.items()]

    def values(self) -> Any:  # type: ignore[override]
        return [r for _, r in self.items()]


class PublishedIndex:
    """The published version for a long-running service, swapped atomically on publish.

    :meth:`current` reads the pointer (``IndexStore.published()``, one small JSON file) on every
    call; when it names another version it opens that version *fully* (rows, vectors, BM25,
    documents) with the same embedder and reranker (the models load once), then replaces the
    held ``(key, Index)`` pair in one assignment. A caller keeps the ``Index`` it got for the
    whole request, so every answer comes from one complete version. A version that cannot be
    opened (its BM25 files missing, another model) is retried on every request (issue 25: once
    its files are back it serves); until then the old one keeps answering and
    :attr:`last_error` says why. ``last_error`` clears as soon as the pointer names a version
    that is held (a repaired pointer, a rollback to it).
    """

    def __init__(
        self,
        uri: str | Path,
        *,
        embedder: Embedder,
        reranker: Any = None,  # whatever Index accepts as its reranker
        distance_cut: float | None = None,
        prepare: Any = None,  # called with each newly opened Index before it serves
        embedder_for: Any = None,  # stamps -> the Embedder of another model's table (issue 32)
    ):
        import threading

        require_index(uri)
        self.store = IndexStore(uri)
        self.embedder = embedder
        self.reranker = reranker
        self.distance_cut = distance_cut
        self.prepare = prepare
        # issue 32: a publish of a table embedded by another (adapted) model of the configured
        # one brings its own query encoder, made once per model (onnx_encoder.follow_published)
        self.embedder_for = embedder_for
        self._embedders: dict[tuple[str, str], Embedder] = {}
        self.swaps = 0  # versions opened after the first
        self.last_error: str | None = None
        self._held: tuple[tuple[Any, ...], Index] | None = None
        self._failed: tuple[Any, ...] | None = None
        self._lock = threading.Lock()
        self._seen: tuple[tuple[int, ...], Index] | None = None  # (pointer file stat, its Index)

    def _embedder_of(self, pub: Published) -> Embedder:
        """The embedder for ``pub``'s table: the held one when its model and revision match,
        else (with ``embedder_for``) the one made for that model, once per model."""
        want = pub.stamps
        have = self.embedder.stamps(want.pipeline, want.extractor)
        if self.embedder_for is None or (have.model, have.revision) == (want.model, want.revision):
            return self.embedder
        key = (want.model, want.revision)
        if key not in self._embedders:
            self._embedders[key] = self.embedder_for(want) or self.embedder
        return self._embedders[key]

    def _pointer_stat(self) -> tuple[int, ...] | None:
        """Identity of ``published.json`` as it is now (inode, size, mtime, ctime), or None
        where the pointer is not a local file (``_rag_meta`` rows: read every time). A publish
        renames a new file over it, so an unchanged stat is an unchanged pointer."""
        if self.store.meta != "files":
            return None
        try:
            st = os.stat(Path(self.store.uri) / POINTER_FILE)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def held(self) -> Index | None:
        """The version being served, without reading the pointer (None: none opened yet):
        what liveness reports, which must not wait on an object store (issue 52)."""
        held = self._held
        return held[1] if held is not None else None

    def current(self) -> Index:
        """The ``Index`` of the version the pointer names now (opened once per version).

        The pointer file is parsed again only when its stat changed (issue 20: a ``stat`` per
        request instead of a read and a JSON parse)."""
        stat = self._pointer_stat()
        seen = self._seen
        if stat is not None and seen is not None and seen[0] == stat:
            return seen[1]
        index = self._current()
        # not replaced while reading, and what it names was opened (issue 25: a version that
        # failed to open is retried on the next request, not remembered behind this shortcut)
        if stat is not None and self._pointer_stat() == stat and self._failed is None:
            self._seen = (stat, index)
        return index

    def _current(self) -> Index:
        pub = self.store.published()
        held = self._held
        if pub is None:
            if held is not None:
                return held[1]
            raise FileNotFoundError(
                f"nothing is published in {self.store.uri}: run `rag-assets index` first"
            )
        key = (pub.table, pub.version, pub.documents_version, pub.threshold)
        if held is not None and held[0] == key:
            if self.last_error is not None:  # the pointer names what we serve: nothing wrong
                self.last_error, self._failed = None, None
            return held[1]
        with self._lock:
            held = self._held
            if held is not None and held[0] == key:
                return held[1]
            try:
                embedder = self._embedder_of(pub)
                index = Index(self.store, pub, embedder, self.reranker, self.distance_cut)
                if self.prepare is not None:
                    self.prepare(index)
            except Exception as e:
                if held is None:
                    raise
                self._failed = key
                self.last_error = (
                    f"published {pub.table}@v{pub.version} could not be opened, still serving "
                    f"{held[1].published.table}@v{held[1].published.version}: {e}"
                )
                return held[1]
            if held is not None:
                self.swaps += 1
            self._held = (key, index)
            self.embedder = index.embedder  # the next versions are compared with this one
            self._failed = None
            self.last_error = None
            return index
