"""What the HTTP app and the MCP tools both call: validated search / ask / span / status.

One :class:`Service` per process holds the embedder (loaded once) and a
:class:`~rag_assets.lib.query.retrieve.PublishedIndex` that follows the publish pointer. Every
operation takes the current ``Index`` once and answers from it alone, so a publish in the middle
of a request cannot mix two versions. Bad input raises :class:`BadRequest` /
:class:`NotFound` with one line naming the cause and what to change.

Importing this module is cheap (no LanceDB, no model): the CLI reads :data:`MAX_K` from here to
parse ``-k``, and ``rag-assets mcp`` answers the MCP handshake before :meth:`Service.load` has
opened anything (``Service.open(settings, lazy=True)``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_assets.lib.query.output import answered_by, ask_json, search_json
from rag_assets.serve import observe
from rag_assets.serve.access import log_name
from rag_assets.serve.bounds import BadRequest, check_k  # the names routes use
from rag_assets.settings import Settings

if TYPE_CHECKING:
    from rag_assets.lib.query.filters import Filter
    from rag_assets.lib.query.retrieve import Index, PublishedIndex
    from rag_assets.serve.access import Access, Caller

RETRIEVER_NAMES = ("dense", "bm25", "hybrid", "rerank")
"""The retrievers a request may name (``rag_assets.lib.query.retrieve.RETRIEVERS``, spelled out
here so that the CLI and the MCP schema get them without importing LanceDB; a test keeps the two
equal)."""

MAX_QUERY_CHARS = 2000
"""Longest question or query accepted (characters). all-MiniLM-L6-v2 reads 256 tokens, about
1,000 characters of English; anything past 2,000 is not a question but a paste."""

QUERY_THREADS = 1
"""ONNX Runtime (and torch) threads for query embedding unless ``RAG_EMBED_THREADS`` says
otherwise: one short query needs no intra-op parallelism, and on 2 busy cores two torch threads
made a cold query embed ~10x slower (1,260 ms vs 132 ms p50) than one."""

HEALTH_FIELDS = frozenset(
    {"model", "dims", "fingerprint", "probe", "probed_at", "probe_ok", "fingerprint_changes",
     "requests", "retries", "fallbacks", "depth", "timeout_s"}
)  # fmt: skip
"""What ``/healthz`` (no token) shows of a model server (issue 35): ids and counters, never its
URL or the text of its errors (a server may echo what it was sent: a user's question)."""

MAX_SPAN_CHARS = 20_000
"""Longest span ``get_document_span`` returns (a chunk is ~512 characters)."""


class NotFound(LookupError):
    """No such document in the published version (HTTP 404)."""


def _shown(value: str, limit: int = 80) -> str:
    """A client-supplied id in an error, cut short (a 404 never echoes 60,000 characters)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_retriever(retriever: str) -> str:
    if retriever not in RETRIEVER_NAMES:
        raise BadRequest(
            f"unknown retriever {_shown(retriever)}: use one of {', '.join(RETRIEVER_NAMES)}"
        )
    return retriever


def has_vector_index(index: Index) -> bool:
    """Whether the table has an ANN index on ``vector`` (then LanceDB's search is the one that
    uses it; without one LanceDB scans every row, as :meth:`Index._dense_exact` does)."""
    try:
        return any("vector" in cfg.columns for cfg in index.table.list_indices())
    except Exception:  # unknown: keep LanceDB's own search
        return True


def check_text(value: str | None, what: str) -> str:
    """The stripped question/query, or :class:`BadRequest` when empty or too long."""
    if value is None or not value.strip():
        raise BadRequest(f"{what} is empty: send a non-blank {what}")
    if len(value) > MAX_QUERY_CHARS:
        raise BadRequest(
            f"{what} is {len(value)} characters; at most {MAX_QUERY_CHARS} are accepted"
        )
    from rag_assets.lib.ingest.validate import text_problem

    problem = text_problem(value, what)  # issue 25: lone surrogates, control characters
    if problem:
        raise BadRequest(problem)
    return value.strip()


@dataclass
class Service:
    """The warm state of ``rag-assets serve`` / ``rag-assets mcp``.

    ``holder`` is None until :meth:`load` (``open(settings, lazy=True)`` defers it: ``rag-assets
    mcp`` answers the handshake first and loads in the background right after).
    """

    settings: Settings
    holder: PublishedIndex | None = None
    query_encoder: str = ""  # RAG_QUERY_ENCODER in effect (onnx, onnx-int8 or torch), once loaded
    log: Any = None  # issue 33: serve.feedback.ServiceLog; None with RAG_QUERY_LOG=off
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _access: Access | None = field(default=None, repr=False, compare=False)
    # issue 34: who `rag-assets mcp` over stdio answers as (None: the local operator); a token
    # given (RAG_TOKEN, --token) is checked again on every call, so a revoke takes effect
    stdio_token: str = field(default="", repr=False, compare=False)
    _sessions: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, settings: Settings, *, lazy: bool = False) -> Service:
        """The service of ``settings.index_uri``; loaded now (models, published version) unless
        ``lazy``, when the first operation (or :meth:`load_in_background`) does it."""
        from rag_assets.serve.feedback import ServiceLog

        service = cls(settings, log=ServiceLog.open(settings))  # issue 33: the query log
        if not lazy:
            service.load()
        return service

    def load(self) -> PublishedIndex:
        """Load the models once and open the published version of ``settings.index_uri``
        (thread-safe; a failure is raised to each caller and retried by the next).

        The query settings are the CLI's (``rag-assets ask`` / ``search``): ``RAG_FUSION``,
        ``RAG_QUERY_REWRITE`` (at ``RAG_LLM_URL`` / ``RAG_LLM_MODEL``), ``RAG_RERANK_MODEL``,
        ``RAG_ANSWER_CHECK`` and ``RAG_DISTANCE_CUT``, applied to every version it opens.
        ``RAG_QUERY_ENCODER`` (default ``onnx``, the exact fp32 export; ``onnx-int8``; ``torch``)
        embeds queries (rag_assets/lib/index/onnx_encoder.py, :func:`query_embedder`); documents
        are embedded by the configured torch encoder.
        """
        holder = self.holder
        if holder is not None:
            return holder
        with self._lock:
            if self.holder is None:
                self.holder, self.query_encoder = _open_holder(self.settings)
            return self.holder

    def load_in_background(self) -> threading.Thread:
        """Start :meth:`load` in a daemon thread (its error, if any, comes back on first use)."""

        def run() -> None:
            with contextlib.suppress(Exception):  # raised again by the first operation
                self.load()

        thread = threading.Thread(target=run, name="rag-assets-load", daemon=True)
        thread.start()
        return thread

    def index(self) -> Index:
        return self.load().current()

    # -- who is asking (issue 34, rag_assets/serve/access.py) ------------------------------
    def access(self) -> Access:
        """The credentials of this index (``RAG_API_TOKEN`` and its tokens); no model load."""
        if self._access is None:
            from rag_assets.lib.index.store import IndexStore
            from rag_assets.serve.access import Access

            store = (
                self.holder.store
                if self.holder is not None
                else IndexStore(self.settings.index_uri)
            )
            self._access = Access(store, self.settings.api_token)
        return self._access

    def caller_of(self, request: Any) -> Caller | None:
        """The caller of an HTTP request (None: refused), or of a stdio MCP call (``request``
        None): the local operator, or the token it was started with."""
        from rag_assets.serve.access import OPERATOR, credential

        if request is None:
            if not self.stdio_token:
                return OPERATOR
            who = self.access().resolve(self.stdio_token)  # a real token, never the operator
            if who is None:
                raise BadRequest(
                    "the token given to `rag-assets mcp` (RAG_TOKEN or --token) is not valid "
                    "or was revoked"
                )
            return who
        access = self.access()
        secret = credential(request)
        if secret or not access.required():
            return access.caller(secret)
        from rag_assets.serve.session import COOKIE

        cookie = request.cookies.get(COOKIE, "")  # the page's signed session (issue 30)
        session = self.sessions().check(cookie, access.session_hash) if cookie else None
        return None if session is None else access.by_session(session.token_name)

    def sessions(self) -> Any:
        """The page's login sessions (issue 30): their secret and revocations are kept in
        ``<RAG_WORK_DIR>/serve/``, which every worker of this service shares."""
        if self._sessions is None:
            from rag_assets.serve.session import Sessions

            folder = Path(self.settings.work_dir) / "serve"
            self._sessions = Sessions(folder, self.settings.session_ttl_s)
        return self._sessions

    # -- operations -----------------------------------------------------------------------
    def search(
        self,
        query: str | None,
        retriever: str = "hybrid",
        k: int = 20,
        *,
        base_url: str | None = None,
        caller: Caller | None = None,
        filter: Filter | None = None,
    ) -> tuple[Index, list[dict[str, Any]]]:
        q = check_text(query, "query")
        check_retriever(retriever)
        check_k(k)
        index = self.index()
        if retriever == "rerank" and index.reranker is None:
            raise BadRequest("rerank: no model configured (set RAG_RERANK_MODEL), use hybrid")
        scope = _scope(caller, filter)  # issue 34: filtered during the search
        hits = _scoped(lambda: index.search(q, retriever=retriever, k=k, scope=scope))
        _noted(index, query=q, retriever=retriever, k=k, hits=len(hits))  # issue 52
        return index, search_json(hits, index, q, self.settings.base_url or base_url)

    def logged_search(
        self,
        query: str | None,
        retriever: str = "hybrid",
        k: int = 20,
        *,
        base_url: str | None = None,
        interface: str = "http/search",
        caller: Caller | None = None,
        filter: Filter | None = None,
    ) -> tuple[Index, list[dict[str, Any]], str | None]:
        """:meth:`search`, recorded in the query log: also its query id (None: log off)."""
        started = time.perf_counter()
        index, hits = self.search(
            query, retriever, k, base_url=base_url, caller=caller, filter=filter
        )
        if self.log is None:
            return index, hits, None
        qid = self.log.record_search(
            str(query).strip(),
            hits,
            index,
            retriever=retriever,
            k=k,
            interface=interface,
            caller=log_name(caller),
            started=started,
        )
        observe.note(query_id=qid)
        return index, hits, qid

    def ask(
        self,
        question: str | None,
        *,
        rerank: bool = True,
        base_url: str | None = None,
        show_nearest: bool = False,
        interface: str = "http/ask",
        caller: Caller | None = None,
        filter: Filter | None = None,
    ) -> tuple[Index, dict[str, Any]]:
        """``ask --json``'s object; ``show_nearest`` adds the closest sources below the bar
        (issue 31: listed apart, never numbered, never sent to the model). Recorded in the query
        log (issue 33: ``query_id`` in the answer, what ``POST /feedback`` takes; None with the
        log off), with ``interface`` and the caller's token name (None: the administrator)."""
        started = time.perf_counter()
        q = check_text(question, "question")
        index = self.index()
        scope = _scope(caller, filter)  # issue 34: the model is sent visible sources only
        base = self.settings.base_url or base_url
        hits: list[Any] = []
        ctx = _scoped(
            lambda: index.ask(
                q,
                rerank=rerank,
                base_url=base,
                show_nearest=show_nearest,
                scope=scope,
                hits_out=hits,
            )
        )
        answer = verification = None
        if not ctx.no_answer and self.settings.llm_url:
            from rag_assets.lib.query.generate import generate_answer

            answer = generate_answer(
                ctx,
                self.settings.llm_url,
                model=self.settings.llm_model or None,
                api_key=self.settings.llm_api_key or None,  # as `rag-assets ask` sends it
            )
            ctx = index.ground(ctx, answer.text)  # as `rag-assets ask` does (issue 21)
            ctx, answer, verification = self._verify_answer(index, ctx, answer, show_nearest)
        from rag_assets.lib.query.rerank_http import take_note

        note = take_note(index.reranker)  # issue 35: a /rerank server that failed
        out = ask_json(
            ctx,
            answer,
            index.published,
            [note] if note else None,
            verification,
            index_version=index.index_version,
        )
        if caller is not None and not caller.admin:
            from rag_assets.serve.access import without_cut

            out = without_cut(out)  # issue 43: the cut is the administrator's
        out["query_id"] = (
            self.log.record_ask(
                q,
                ctx,
                hits,
                index,
                interface=interface,
                caller=log_name(caller),
                started=started,
            )
            if self.log is not None
            else None
        )
        # issue 52: the span's attributes and the answered/refused count by gate
        from rag_assets.lib.query.retrieve import RERANK_DEPTH

        retriever = "rerank" if rerank and index.reranker is not None else "hybrid"
        _noted(index, query=q, retriever=retriever, k=RERANK_DEPTH, hits=len(hits))
        observe.note(refused=bool(out["no_answer"]), gate=out.get("refused_by"))
        observe.note(query_id=out["query_id"])
        observe.outcome(out.get("refused_by") if out["no_answer"] else None)
        return index, out

    def _verify_answer(self, index: Index, ctx: Any, answer: Any, show_nearest: bool) -> Any:
        """Issue 50: the generated answer checked against its sources and
        ``RAG_ANSWER_VERIFY`` applied, as ``rag-assets ask`` does (the ``verify`` stage of
        ``index.timings``; a refusal's ``refused_by`` is "verification")."""
        from rag_assets.lib.query.verify import second_opinion_of, verify_generated

        return verify_generated(
            index,
            ctx,
            answer,
            self.settings.answer_verify,
            second_opinion_of(self.settings),
            show_nearest,
        )

    def verify(
        self,
        question: str | None,
        answer: Any,
        *,
        rerank: bool = True,
        base_url: str | None = None,
        caller: Caller | None = None,
        filter: Filter | None = None,
    ) -> tuple[Index, dict[str, Any]]:
        """Issue 50: ``POST /verify`` and the MCP ``verify_answer`` tool. The question's sources
        are retrieved as ``ask`` retrieves them for this caller (its scope: a document it may
        not see is never a source, so a marker can only name what it sees), then every sentence
        of ``answer`` is checked against them. An answer that cannot be verified is a
        :class:`BadRequest` (one line). Not recorded in the query log: it is no question."""
        from rag_assets.lib.query.verify import VerifyInputError, check_answer, verify_question

        q = check_text(question, "question")
        try:
            check_answer(answer)  # before any search
        except VerifyInputError as e:
            raise BadRequest(str(e)) from None
        index = self.index()
        scope = _scope(caller, filter)
        from rag_assets.lib.query.verify import second_opinion_of

        def run() -> dict[str, Any]:
            try:
                return verify_question(
                    index,
                    q,
                    answer,
                    rerank=rerank,
                    scope=scope,
                    base_url=self.settings.base_url or base_url,
                    second_opinion=second_opinion_of(self.settings),
                )
            except VerifyInputError as e:
                raise BadRequest(str(e)) from None

        out: dict[str, Any] = _scoped(run)
        return index, out | {"published": answered_by(index.published)}

    def feedback(
        self,
        body: Any,
        caller: Caller | None = None,
        *,
        interface: str = "http",
        entry: dict[str, Any] | None | bool = False,
    ) -> dict[str, Any]:
        """Issue 33: one verdict on a logged answer (``POST /feedback``, the MCP tool). A token
        judges only its own queries, and a ``missed`` verdict may name only a document it sees
        (another is unknown, with the same answer as one that does not exist)."""
        if self.log is None:
            raise NotFound("the query log is off (RAG_QUERY_LOG=off): no feedback is kept")
        index = self.index()
        docs = index.documents
        if caller is not None and not caller.admin:
            docs = {d: docs[d] for d in docs if index.visible(d, caller.groups)}
        out: dict[str, Any] = self.log.feedback(
            body, docs, caller=log_name(caller), interface=interface, entry=entry
        )
        observe.verdict(str(body.get("verdict")))  # issue 52: rag_feedback_total
        return out

    def document(
        self, document_id: str, caller: Caller | None = None
    ) -> tuple[Index, dict[str, Any]]:
        """The stored document record, looked up by id in the published version only; one the
        caller may not see is missing, with the same answer (issue 34)."""
        index = self.index()
        groups = caller.groups if caller is not None else None
        doc = index.documents.get(document_id) if index.visible(document_id, groups) else None
        if doc is None:
            raise NotFound(f"no document {_shown(document_id)} in the published index")
        return index, doc

    def media_file(self, media_id: str, caller: Caller | None = None) -> Path | None:
        """The media file a transcript the caller may see cites, or None."""
        from rag_assets.serve.documents import media_owner

        index = self.index()
        groups = caller.groups if caller is not None else None
        docs = index.documents
        seen = {d: docs[d] for d in docs if index.visible(d, groups) and _maybe_transcript(docs, d)}
        return media_owner(seen, media_id)

    def facets(self, caller: Caller | None = None) -> dict[str, Any]:
        """The folders and metadata keys (with values) of the documents the caller may see."""
        index = self.index()
        return index.facets(caller.groups if caller is not None else None)

    def span(
        self, document_id: str, start: int, end: int, caller: Caller | None = None
    ) -> dict[str, Any]:
        """The exact canonical text ``[start, end)`` of a published document."""
        index, doc = self.document(document_id, caller)
        text = doc["text"]
        if start > end:  # issue 30: reversed, not "outside"
            raise BadRequest(
                f"span {start}..{end} is reversed: start must not be after end (use the "
                f"from/to of a citation, e.g. start={end}, end={start})"
            )
        if not 0 <= start <= end <= len(text):
            raise BadRequest(
                f"span {start}..{end} is outside {_shown(document_id)} (0..{len(text)}): "
                "use the from/to of a citation"
            )
        if end - start > MAX_SPAN_CHARS:
            raise BadRequest(f"span of {end - start} characters; at most {MAX_SPAN_CHARS}")
        return {
            "document_id": document_id,
            "from": start,
            "to": end,
            "text": text[start:end],
            "published": answered_by(index.published, index.index_version),
        }

    def status(self, caller: Caller | None = None) -> dict[str, Any]:
        """``status --json``; for a token, only what concerns the documents it may see
        (:func:`rag_assets.serve.access.restricted_status`)."""
        from rag_assets.serve.status import status_report

        report = status_report(self.settings)
        if caller is None or caller.admin:
            return report
        from rag_assets.serve.access import restricted_status

        return restricted_status(report, self.index(), caller)

    def health(self) -> dict[str, Any]:
        # issue 52: liveness answers from memory (an object-store pointer read could hang)
        index = self.load().held() or self.index()
        out: dict[str, Any] = {"ok": True, **answered_by(index.published, index.index_version)}
        out["query_encoder"] = self.query_encoder
        # issue 43: no refusal cut here: /healthz needs no token, and the cut is calibrated on
        # every document (an authenticated caller finds it in /status and in each answer)
        if self.load().last_error:  # issue 30: unauthenticated: no paths, no source files
            from rag_assets.serve.limits import client_text

            out["last_error"] = client_text(str(self.load().last_error))
        for key, part in (("embedding_endpoint", index.embedder), ("rerank", index.reranker)):
            report = getattr(part, "status", None)  # issue 35: model servers, their counters
            if report is not None:  # no URL, no server text: /healthz needs no token
                out[key] = {k: v for k, v in report().items() if k in HEALTH_FIELDS}
        return out


def _noted(index: Index, **attrs: Any) -> None:
    """What a request's span carries of an answer (issue 52), and the version it came from."""
    observe.note(table=index.published.table, table_version=index.published.version, **attrs)
    observe.served(index)


def _scope(caller: Caller | None, flt: Filter | None) -> Any:
    """The search scope of a request: its filter and the caller's groups (None: everything)."""
    from rag_assets.lib.query.filters import Filter, Scope

    return Scope(flt or Filter(), caller.groups if caller is not None else None)


def _scoped(run: Any) -> Any:
    """``run()``, an unknown filter key (FilterError) as a one-line 400."""
    from rag_assets.lib.query.filters import FilterError

    try:
        return run()
    except FilterError as e:
        raise BadRequest(str(e)) from None


def parse_filter(items: Any = None, mapping: Any = None, **flags: Any) -> Filter:
    """A request's filter (``?filter=key=value`` items, a JSON object, ``document``/``folder``),
    a malformed one as a one-line :class:`BadRequest`."""
    from rag_assets.lib.query.filters import Filter, FilterError

    try:
        out = Filter.parse(items or (), **flags)
        if mapping is not None:
            extra = Filter.from_mapping(mapping)
            out = Filter.parse(
                [f"{c.key}{c.op}{v}" for c in (*out.clauses, *extra.clauses) for v in c.values]
            )
        return out
    except FilterError as e:
        raise BadRequest(str(e)) from None


def _maybe_transcript(docs: Any, document_id: str) -> bool:
    light = getattr(docs, "light", None)
    kind = (light[document_id] if light is not None else docs[document_id]).get("kind")
    return kind in ("vtt", "srt")


def _open_holder(settings: Settings) -> tuple[PublishedIndex, str]:
    """The :class:`PublishedIndex` of ``settings`` (models loaded, the published version open)
    and the query encoder in effect."""
    import sys

    from rag_assets.lib.index.onnx_encoder import follow_published, query_embedder
    from rag_assets.lib.query.fusion import parse_fusion
    from rag_assets.lib.query.judge import apply_judge, llm_options
    from rag_assets.lib.query.rerank import load_reranker
    from rag_assets.lib.query.retrieve import PublishedIndex, require_published
    from rag_assets.lib.query.rewrite import load_rewriter

    require_published(settings.index_uri)  # never creates it; no model for nothing published
    embedder, encoder = query_embedder(
        settings,
        threads=settings.embed_threads or QUERY_THREADS,
        warn=lambda m: print(f"rag-assets: warning: {m}", file=sys.stderr, flush=True),
    )
    if embedder.query_encoder is None:
        _ = embedder.model  # torch: load now, not on the first request
    watch = getattr(embedder, "watch", None)  # issue 35: re-probe the model server's fingerprint
    if watch is not None:
        watch(settings.embed_probe_interval)
    fusion = parse_fusion(settings.fusion)
    rewriter = load_rewriter(
        settings.query_rewrite,
        settings.llm_url,
        settings.llm_model,
        settings.llm_api_key,
        Path(settings.work_dir) / "rewrite-cache",  # the cache Index.open uses
    )

    def prepare(index: Index) -> None:  # what Index.open + apply_judge do for the CLI
        index.fusion = fusion
        index.rewriter = rewriter
        apply_judge(index, settings)
        index.exact_dense = not has_vector_index(index)  # ms, not LanceDB's ~10-20 ms

    holder = PublishedIndex(
        settings.index_uri,
        embedder=embedder,
        reranker=load_reranker(settings.rerank_model or None, **llm_options(settings)),
        distance_cut=settings.cut_override,
        prepare=prepare,
        # issue 32: a newly published table of an adapted model brings its query encoder
        embedder_for=follow_published(
            settings,
            threads=settings.embed_threads or QUERY_THREADS,
            warn=lambda m: print(f"rag-assets: warning: {m}", file=sys.stderr, flush=True),
        ),
    )
    holder.current()  # fails here, with its reason, when nothing is published
    return holder, encoder
