"""Embeddings from a model server (OpenAI-compatible ``/v1/embeddings``), stamped and
fingerprinted (issue 35).

``RAG_EMBED_URL`` (the server's base URL, e.g. ``http://127.0.0.1:8080/v1``), ``RAG_EMBED_MODEL``
(a model the server lists at ``/v1/models``; empty = its only one) and ``RAG_EMBED_API_KEY``
(a bearer token, never printed) replace the local sentence-transformers model for documents and
queries alike. :class:`EndpointEmbedder` is an :class:`~rag_assets.lib.index.embed.Embedder`
with the same interface (``encode``, ``encode_query``, ``stamps``, the query cache), so every
place that takes the local encoder takes it too.

**Requests.** Texts go ``RAG_EMBED_BATCH_SIZE`` to a request, at most ``RAG_EMBED_CONCURRENCY``
requests in flight, each within ``RAG_EMBED_TIMEOUT`` seconds (time queued at the server
included); a 429, a 5xx or a dropped connection is tried again up to ``RAG_EMBED_RETRIES`` times
with exponential backoff, waiting what a ``Retry-After`` header asks
(:mod:`rag_assets.lib.models.http`). A timeout is not retried: a slow server is not helped by
being sent the same work again (llama.cpp goes on computing an abandoned request). Vectors are
truncated to ``RAG_EMBED_DIMS`` when set (Matryoshka, as sentence-transformers does) and
L2-normalised here, whatever the server does (llama.cpp's Python server does not normalise).

**Prompts.** ``RAG_QUERY_PROMPT`` / ``RAG_DOCUMENT_PROMPT`` as for local models; empty = the
served model family's own prefixes where :data:`KNOWN_PROMPTS` knows them (nomic-embed-text:
``search_query: `` / ``search_document: ``), else none. Both are stamps.

**The fingerprint.** The model behind a URL can change under the same name. Every connection
embeds the fixed :data:`PROBES` in one request (always the same batch: some servers' vectors
depend on what they are batched with, by ~1e-5 relative on llama.cpp) and compares them with the
fingerprints recorded in the index (``endpoints/fingerprints.json``, a file or a ``_rag_files``
row) and in ``RAG_WORK_DIR``: the served model *is* a recorded one when the cosine of every probe
vector to the recorded one is at least :data:`FINGERPRINT_MIN_COSINE` (same name and size too).
A match keeps its id; anything else is a new fingerprint whose id hashes its probe vectors
rounded to :data:`FINGERPRINT_DECIMALS` decimals. The id is the stamps' ``revision``, so, like a
changed model, a changed fingerprint is another table name and another ``code_version`` of
``chunk_embeddings`` (exactly the downstream assets are stale), and the query side refuses a
table whose fingerprint the served model no longer matches (:class:`EndpointChanged`), in one
line, instead of mixing vector spaces. Index runs, CLI queries and the service re-probe on every
start; the service also every ``RAG_EMBED_PROBE_INTERVAL`` seconds (:meth:`EndpointEmbedder.watch`).

**The window.** A server either refuses an over-long input (llama.cpp's ``llama-server``: "input
is too large to process"; OpenAI: "maximum context length") or cuts it silently
(llama-cpp-python's server at ``--n_batch`` tokens; text-embeddings-inference with
``--auto-truncate``). A refusal fails the run in one line naming the text and what to change. A
silent cut is reported like the local encoder's window (``chunks_within_encoder_window``): the
window is ``RAG_EMBED_WINDOW`` or what the server says (text-embeddings-inference ``/info``
``max_input_length``), token counts come from the server's tokenize route (llama.cpp
``/tokenize``, llama-cpp-python ``/extras/tokenize``, text-embeddings-inference ``/tokenize``).
Without both, the report says the window is unknown instead of guessing.

No GPU is assumed anywhere: the server runs wherever it runs; this side only speaks HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_assets.lib.index.embed import (
    _CACHE_LOCK,
    DOCUMENT_PROMPT_NAMES,
    QUERY_PROMPT_NAMES,
    Embedder,
    ModelSpec,
    _resolve_prompt,
)
from rag_assets.lib.index.fingerprint import (
    FINGERPRINT_MIN_COSINE,
    FINGERPRINT_PREFIX,
    PROBES,
    Fingerprint,
    read_registry,
    record,
    resolve,
    unit_rows,
)
from rag_assets.lib.index.store.schema import StampMismatch
from rag_assets.lib.models.http import HttpError, JsonEndpoint, RetryLog, redact, with_retries

if TYPE_CHECKING:
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.versioning import Stamps
    from rag_assets.lib.types import Chunk
    from rag_assets.settings import Settings

SETTING_URL = "RAG_EMBED_URL"
SETTING_MODEL = "RAG_EMBED_MODEL"
SETTING_KEY = "RAG_EMBED_API_KEY"
ENCODER = "endpoint"
"""What ``query_embedder`` reports as the query encoder when ``RAG_EMBED_URL`` is set."""

ORDER_MIN_COSINE = 0.99
"""Issue 43: a text embedded alone and in a batch without ``index`` fields must give vectors at
least this close for the batch's order to be trusted (batching moves a vector by far less)."""

PROBE_TTL_S = 10.0
"""A probe this recent is reused within one process (one ``rag-assets index`` computes the
stamps twice before its run starts); the asset that writes rows always probes afresh."""

RECHECK_S = 2.0
"""A query against a table the latest probe does not match probes again when that probe is older
than this (at most one probe at a time): a table published after a swap serves at once, not
after the next periodic probe."""

KNOWN_PROMPTS: dict[str, dict[str, str]] = {
    "nomic-embed-text": {"query": "search_query: ", "document": "search_document: "},
    "embeddinggemma": {
        "query": "task: search result | query: ",
        "document": "title: none | text: ",
    },
    "e5-small": {"query": "query: ", "document": "passage: "},
    "e5-base": {"query": "query: ", "document": "passage: "},
    "e5-large": {"query": "query: ", "document": "passage: "},
    "bge-small-en-v1.5": {"query": "Represent this sentence for searching relevant passages: "},
    "bge-base-en-v1.5": {"query": "Represent this sentence for searching relevant passages: "},
    "bge-large-en-v1.5": {"query": "Represent this sentence for searching relevant passages: "},
    "mxbai-embed-large": {"query": "Represent this sentence for searching relevant passages: "},
}
"""Query/document prefixes of model families, from their model cards, looked up by substring of
the served model's name (lower case) when RAG_QUERY_PROMPT / RAG_DOCUMENT_PROMPT are empty."""

TOO_LONG = re.compile(
    r"too (large|long)|exceed|context length|context size|maximum.{0,40}(token|length)"
    r"|input.{0,20}(length|tokens)|batch size",
    re.I,
)
"""How servers say an input is over their window (llama.cpp "input is too large to process.
increase the physical batch size", OpenAI "maximum context length", TEI "must have less than
512 tokens")."""


class EndpointError(RuntimeError):
    """The embedding server cannot be used as configured (one line naming the setting)."""


class EndpointChanged(StampMismatch):
    """The served model no longer matches the fingerprint a table was embedded with."""


@dataclass(frozen=True)
class EndpointConfig:
    """What ``RAG_EMBED_*`` say (and the shared embedding settings that apply)."""

    url: str
    model: str = ""
    api_key: str = ""
    batch_size: int = 16
    concurrency: int = 2
    timeout: float = 300.0
    retries: int = 4
    dims: int = 0
    query_prompt: str = ""
    document_prompt: str = ""
    window: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> EndpointConfig | None:
        """None when ``RAG_EMBED_URL`` is empty (the local model embeds)."""
        if not settings.embed_url.strip():
            return None
        if settings.embedding_model.strip():
            raise ValueError(
                f"RAG_EMBEDDING_MODEL={settings.embedding_model!r} and {SETTING_URL} are both "
                f"set: unset one (a local model, or the server at {SETTING_URL})"
            )
        if (settings.embed_precision or "fp32").strip().lower() != "fp32":
            raise ValueError(
                f"RAG_EMBED_PRECISION={settings.embed_precision!r} applies to a local model; the "
                f"server at {SETTING_URL} computes in its own precision (it is fingerprinted): "
                "unset RAG_EMBED_PRECISION"
            )
        return cls(
            url=settings.embed_url.strip(),
            model=settings.embed_model.strip(),
            api_key=settings.embed_api_key,
            batch_size=settings.embed_batch_size,
            concurrency=settings.embed_concurrency,
            timeout=settings.embed_timeout,
            retries=settings.embed_retries,
            dims=settings.embed_dims,
            query_prompt=settings.query_prompt,
            document_prompt=settings.document_prompt,
            window=settings.embed_window,
        )

    @property
    def key(self) -> str:
        """Identity of the endpoint for the probe cache (the API key only as a digest)."""
        digest = hashlib.sha256(self.api_key.encode()).hexdigest()[:12]
        return f"{self.url}|{self.model}|{digest}"


def v1_base(url: str) -> str:
    """The ``…/v1`` base of ``RAG_EMBED_URL`` (given as the base, ``…/v1/embeddings`` or the
    server's root)."""
    base = url.strip().rstrip("/")
    if base.endswith("/embeddings"):
        base = base[: -len("/embeddings")]
    return base if base.endswith("/v1") else base + "/v1"


def server_root(url: str) -> str:
    """The server's root (the base without ``/v1``): where tokenize and info routes live."""
    base = v1_base(url)
    return base[: -len("/v1")]


# -- the HTTP client ------------------------------------------------------------------------------
class EmbeddingsClient:
    """``/v1/embeddings`` (and ``/v1/models``, tokenize, info) of one server."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self.api = JsonEndpoint(config.url, SETTING_URL, config.api_key or None, config.timeout)
        self.v1 = v1_base(self.api.base)
        self.root = server_root(self.api.base)
        self.log = RetryLog()
        self.requests = 0
        self.inputs = 0
        self._lock = threading.Lock()
        self._tokenize: tuple[str, str] | None | bool = False  # False = not looked for yet
        self._window: int | None | bool = False
        self._order: str | None | bool = False  # issue 43: replies without "index" fields:
        # False = not checked yet, None = checked (inputs come back in order), str = why not

    @property
    def where(self) -> str:
        return self.api.where

    # -- what the server serves ---------------------------------------------------------------
    def served_model(self) -> str:
        """``RAG_EMBED_MODEL`` checked against ``/v1/models`` (empty: the only model listed).
        A server without ``/v1/models`` takes ``RAG_EMBED_MODEL`` as given."""
        try:
            data = self._once(self.v1 + "/models", None)
        except HttpError as exc:
            if exc.kind == "http" and exc.status in (404, 405):
                if self.config.model:
                    return self.config.model
                raise EndpointError(
                    f"{self.where} lists no models (/v1/models: HTTP {exc.status}): set "
                    f"{SETTING_MODEL} to the model it serves"
                ) from None
            raise self._error(exc) from None
        try:
            ids = [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError) as exc:
            raise EndpointError(
                f"{self.where} is not an OpenAI-compatible server: /v1/models returned "
                f"{self.api.scrub(json.dumps(data))[:200]}"
            ) from exc
        if self.config.model:
            if ids and self.config.model not in ids:
                raise EndpointError(
                    f"{SETTING_MODEL}={self.config.model!r} is not served at {self.where}, which "
                    f"lists: {', '.join(ids[:10])}; set {SETTING_MODEL} to one of them"
                )
            return self.config.model
        if len(ids) == 1:
            return ids[0]
        shown = ", ".join(ids[:10]) if ids else "none"
        raise EndpointError(
            f"{self.where} serves {len(ids)} models ({shown}): set {SETTING_MODEL} to one"
        )

    def probe(self, model: str) -> Fingerprint:
        """The probe vectors of ``model`` (one request, the fixed batch); a server that is down
        is not retried (it fails at once, naming the setting)."""
        vecs = self.embed(list(PROBES), model, retry_connect=False)
        return Fingerprint.of(model, vecs, self.config.url)

    # -- embeddings -----------------------------------------------------------------------------
    def embed(self, texts: Sequence[str], model: str, *, retry_connect: bool = True) -> np.ndarray:
        """Raw vectors of one request's ``texts`` (float32, in input order), retried on
        transient failures; a too-long input is found and named."""
        body = {"input": list(texts), "model": model, "encoding_format": "float"}
        try:
            data = with_retries(
                lambda: self._once(self.v1 + "/embeddings", body),
                retries=self.config.retries,
                retryable=lambda e: (
                    e.transient
                    and e.kind != "timeout"  # a slow server is not helped by more work
                    and not _too_long(e)
                    and (retry_connect or e.kind != "connect")
                ),
                log=self.log,
            )
        except HttpError as exc:
            if _too_long(exc):
                self._name_too_long(texts, model, exc)
            raise self._error(exc) from None
        vecs, indexed = self._vectors(data, len(texts))
        if not indexed and len(texts) > 1:
            self._check_order(texts, vecs, model)
        return vecs

    def _check_order(self, texts: Sequence[str], vecs: np.ndarray, model: str) -> None:
        """Issue 43: a reply without ``index`` fields is trusted to be in input order only
        once the first batch (the probe texts) was seen in order: its first and last texts
        embedded alone must give the same vectors as in the batch."""
        if self._order is False:
            self._order = None
            for i in (0, len(texts) - 1):
                try:
                    body = {"input": [texts[i]], "model": model, "encoding_format": "float"}
                    one = self._once(self.v1 + "/embeddings", body)
                except HttpError as exc:
                    self._order = False  # not checked: checked again with the next batch
                    raise self._error(exc) from None
                alone = self._vectors(one, 1)[0][0]
                cos = float(alone @ vecs[i]) / float(
                    np.linalg.norm(alone) * np.linalg.norm(vecs[i]) or 1.0
                )
                if cos < ORDER_MIN_COSINE:
                    self._order = (
                        f"{self.where} returns embeddings without data[].index and not in the "
                        f"order of the inputs (text {i} of a batch of {len(texts)} came back as "
                        "another's vector): vectors would land on the wrong chunks; use a "
                        "server that sends data[].index"
                    )
                    break
        if isinstance(self._order, str):
            raise EndpointError(self._order)

    def embed_all(
        self,
        texts: Sequence[str],
        model: str,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Every text's raw vector: ``batch_size`` per request, ``concurrency`` in flight."""
        size = max(1, self.config.batch_size)
        batches = [list(texts[i : i + size]) for i in range(0, len(texts), size)]
        if not batches:
            return np.zeros((0, 0), np.float32)
        done = 0
        out: list[np.ndarray] = []
        workers = max(1, min(self.config.concurrency, len(batches)))
        if workers == 1:
            for b in batches:
                out.append(self.embed(b, model))
                done += len(b)
                if progress is not None:
                    progress(done, len(texts))
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="rag-embed") as pool:
                results = pool.map(lambda b: self.embed(b, model), batches)
                for b, vecs in zip(batches, results, strict=True):
                    out.append(vecs)
                    done += len(b)
                    if progress is not None:
                        progress(done, len(texts))
        dims = {v.shape[1] for v in out}
        if len(dims) != 1:
            raise EndpointError(
                f"{self.where} returned vectors of different sizes ({sorted(dims)}) for one "
                f"run: the server changed while indexing; check {SETTING_URL} and run again"
            )
        return np.concatenate(out)

    # -- tokens and window ------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int] | None:
        """Token ids of ``text`` from the server's tokenize route (llama.cpp ``/tokenize``,
        llama-cpp-python ``/extras/tokenize``, TEI ``/tokenize``), None where it has none."""
        route = self._tokenize_route()
        if route is None:
            return None
        path, field_name = route
        try:
            data = self._once(self.root + path, {field_name: text})
        except HttpError as exc:
            raise self._error(exc) from None
        return _token_ids(data)

    def window(self) -> int | None:
        """``RAG_EMBED_WINDOW``, else what the server reports (TEI ``/info``), else None."""
        if self.config.window:
            return self.config.window
        if self._window is False:
            found: int | None = None
            try:
                info = self._once(self.root + "/info", None)
                value = info.get("max_input_length") if isinstance(info, dict) else None
                found = int(value) if value else None
            except (HttpError, ValueError, TypeError):
                found = None
            self._window = found
        return self._window if isinstance(self._window, int) else None

    def _tokenize_route(self) -> tuple[str, str] | None:
        if self._tokenize is False:
            found: tuple[str, str] | None = None
            for path, name in (
                ("/extras/tokenize", "input"),
                ("/tokenize", "content"),
                ("/tokenize", "inputs"),
            ):
                try:
                    ids = _token_ids(self._once(self.root + path, {name: "ok"}))
                except HttpError:
                    continue
                if ids:
                    found = (path, name)
                    break
            self._tokenize = found
        return self._tokenize if isinstance(self._tokenize, tuple) else None

    # -- internals ----------------------------------------------------------------------------
    def _once(self, url: str, body: Any) -> Any:
        with self._lock:
            self.requests += 1
            if isinstance(body, dict) and isinstance(body.get("input"), list):
                self.inputs += len(body["input"])
        return self.api.request(url, body)

    def _vectors(self, data: Any, n: int) -> tuple[np.ndarray, bool]:
        """The reply's vectors in input order, and whether it carried ``index`` fields (they
        must be exactly 0..n-1, each once; without them the order is the reply's)."""
        try:
            items = list(data["data"])
            indices = [d.get("index") for d in items]
            vecs = [r["embedding"] for r in items]
            sizes = sorted({len(v) for v in vecs})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            shown = self.api.scrub(json.dumps(data) if not isinstance(data, bytes) else "")
            raise EndpointError(
                f"{self.where} is not an OpenAI-compatible embeddings server: no "
                f"data[].embedding of numbers in its reply ({shown[:160]})"
            ) from exc
        if len(sizes) > 1:
            raise EndpointError(
                f"{self.where} returned vectors of unequal size ({sizes[0]} to {sizes[-1]} "
                f"numbers) for one batch: check {SETTING_URL} and {SETTING_MODEL}"
            )
        indexed = any(i is not None for i in indices)
        if indexed:
            ok = all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
            if not ok or sorted(indices) != list(range(len(items))):
                shown_ix = [i if isinstance(i, int) else repr(i) for i in indices[:6]]
                raise EndpointError(
                    f"{self.where} returned data[].index {shown_ix}"
                    f"{'…' if len(indices) > 6 else ''} for {n} texts: each of 0..{n - 1} must "
                    "appear once (vectors would land on the wrong chunks); check "
                    f"{SETTING_URL}"
                )
            order = sorted(range(len(items)), key=lambda k: indices[k])
            vecs = [vecs[k] for k in order]
        try:
            arr = np.asarray(vecs, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EndpointError(
                f"{self.where} is not an OpenAI-compatible embeddings server: no "
                "data[].embedding of numbers in its reply"
            ) from exc
        if arr.ndim != 2 or arr.shape[0] != n:
            got = arr.shape[0] if arr.ndim >= 1 else 0
            raise EndpointError(
                f"{self.where} returned {got} vectors for {n} texts (or vectors of unequal "
                f"size): check {SETTING_URL} and {SETTING_MODEL}"
            )
        if not np.all(np.isfinite(arr)) or np.any(np.linalg.norm(arr, axis=1) == 0):
            raise EndpointError(f"{self.where} returned a zero or non-finite vector")
        return arr, indexed

    def _name_too_long(self, texts: Sequence[str], model: str, exc: HttpError) -> None:
        """Raise naming the first input the server refuses alone (one request per input)."""
        culprit = texts[0] if len(texts) == 1 else None
        if culprit is None:
            for t in texts:
                try:
                    self._once(self.v1 + "/embeddings", {"input": [t], "model": model})
                except HttpError as one:
                    if _too_long(one):
                        culprit = t
                        break
        shown = " ".join((culprit or "").split())[:60]
        raise EndpointError(
            f"{self.where} refused an input as longer than its window ({len(culprit or '')} "
            f"characters: {shown!r}…; it said: {exc.body[:120]}): raise the server's input limit "
            "(llama.cpp: --ubatch-size and --batch-size; text-embeddings-inference: "
            "--auto-truncate) or lower RAG_CHUNK_TARGET"
        )

    def _error(self, exc: HttpError) -> EndpointError:
        """One line for a failed request, naming the setting to change."""
        msg = self.api.scrub(str(exc))
        if exc.kind == "http" and exc.status in (401, 403):
            sent = "the key in" if self.config.api_key else "no key: set"
            return EndpointError(
                f"{self.where} refused the request (HTTP {exc.status}): it sent {sent} "
                f"{SETTING_KEY}; set {SETTING_KEY} to a key the server accepts"
            )
        if exc.kind == "connect":
            return EndpointError(f"{msg}: start the embedding server, or fix {SETTING_URL}")
        if exc.kind == "timeout":
            return EndpointError(
                f"{msg}: raise RAG_EMBED_TIMEOUT or lower RAG_EMBED_CONCURRENCY (a server that "
                "runs one request at a time queues the others)"
            )
        if exc.kind == "http" and exc.status == 404:
            return EndpointError(
                f"{msg}: {SETTING_URL} must be the base URL of an OpenAI-compatible server (e.g. "
                f"http://127.0.0.1:8080/v1) and {SETTING_MODEL} a model it serves"
            )
        if exc.kind == "http" and exc.status in (429, 500, 502, 503, 504):
            return EndpointError(f"{msg}: the server is overloaded or failing (raise "
                                 "RAG_EMBED_RETRIES, or lower RAG_EMBED_CONCURRENCY)")  # fmt: skip
        return EndpointError(f"{msg} (check {SETTING_URL} and {SETTING_MODEL})")


def _too_long(exc: HttpError) -> bool:
    return (
        exc.kind == "http"
        and exc.status in (400, 413, 422, 500)
        and bool(TOO_LONG.search(exc.body))
    )


def _token_ids(data: Any) -> list[int] | None:
    """Token ids from the tokenize routes' replies: ``{"tokens": [ids]}`` (llama.cpp and its
    Python server; llama.cpp may give ``{"id": …, "piece": …}`` objects), TEI's
    ``[[{"id": …}, …]]``."""
    if isinstance(data, dict) and isinstance(data.get("tokens"), list):
        toks = data["tokens"]
    elif isinstance(data, list) and data and isinstance(data[0], list):
        toks = data[0]
    else:
        return None
    out = []
    for t in toks:
        if isinstance(t, int):
            out.append(t)
        elif isinstance(t, dict) and isinstance(t.get("id"), int):
            out.append(int(t["id"]))
        else:
            return None
    return out


# -- probes, cached briefly within a process --------------------------------------------------
_probe_cache: dict[str, tuple[float, str, Fingerprint]] = {}
_probe_lock = threading.Lock()


def probe_endpoint(
    client: EmbeddingsClient, max_age: float = PROBE_TTL_S
) -> tuple[str, Fingerprint]:
    """(served model, its probe fingerprint), reusing a probe younger than ``max_age`` s."""
    key = client.config.key
    now = time.monotonic()
    with _probe_lock:
        hit = _probe_cache.get(key)
    if hit is not None and max_age > 0 and now - hit[0] <= max_age:
        return hit[1], hit[2]
    model = client.served_model()
    fp = client.probe(model)
    with _probe_lock:
        _probe_cache[key] = (time.monotonic(), model, fp)
    return model, fp


# -- the embedder ------------------------------------------------------------------------------
@dataclass(frozen=True)
class EndpointSpec(ModelSpec):
    """A :class:`ModelSpec` whose model is served: ``revision`` is the fingerprint id."""

    url: str = ""  # RAG_EMBED_URL, redacted


def known_prompts(model: str) -> dict[str, str]:
    """The :data:`KNOWN_PROMPTS` entry whose key is in ``model`` (lower case), else {}."""
    name = model.lower()
    for key, prompts in KNOWN_PROMPTS.items():
        if key in name:
            return dict(prompts)
    return {}


def endpoint_spec(config: EndpointConfig, model: str, fp: Fingerprint) -> EndpointSpec:
    if config.dims < 0 or config.dims > fp.dims:
        raise EndpointError(
            f"RAG_EMBED_DIMS={config.dims} is not possible for {model} at {SETTING_URL}="
            f"{redact(config.url)} ({fp.dims} dims): use 0 for the served size or a smaller "
            f"Matryoshka size (e.g. {fp.dims // 2})"
        )
    prompts = known_prompts(model)
    return EndpointSpec(
        model_id=model,
        path=Path("."),
        revision=fp.id,
        dims=config.dims or fp.dims,
        query_prompt=_resolve_prompt(config.query_prompt, prompts, QUERY_PROMPT_NAMES),
        document_prompt=_resolve_prompt(config.document_prompt, prompts, DOCUMENT_PROMPT_NAMES),
        native_dims=fp.dims,
        precision="fp32",
        url=redact(config.url),
    )


class EndpointEmbedder(Embedder):
    """An :class:`Embedder` whose vectors come from ``RAG_EMBED_URL``.

    ``spec.revision`` is the fingerprint id the served model resolved to; :attr:`probe` is the
    latest probe. ``store`` and ``work_dir`` are where recorded fingerprints are read when a
    table with another id is checked (:meth:`check_table`)."""

    spec: EndpointSpec

    def __init__(
        self,
        config: EndpointConfig,
        client: EmbeddingsClient,
        model: str,
        probe: Fingerprint,
        fingerprint: Fingerprint,
        *,
        store: IndexStore | None = None,
        work_dir: str | Path | None = None,
    ) -> None:
        super().__init__(endpoint_spec(config, model, fingerprint), batch_size=config.batch_size)
        self.config = config
        self.client = client
        self.served = model
        self.probe = probe
        self.fingerprint = fingerprint
        self.store = store
        self.work_dir = work_dir
        self.probed_at = time.time()
        self.probe_error: str | None = None
        self.changes = 0  # fingerprint changes seen by re-probes
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()
        self._probing = threading.Lock()

    # -- the Embedder interface ---------------------------------------------------------------
    @property  # type: ignore[override]
    def model(self) -> Any:
        """The HTTP client (there is no local model to load)."""
        return self.client

    @property
    def device(self) -> str:
        return ENCODER

    @property
    def max_seq_length(self) -> int:
        """The server's window in tokens (0 = unknown)."""
        return self.client.window() or 0

    def encode(
        self, texts: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """Document-side vectors; ``progress(n)`` (issue 31) is told as each request returns,
        so the requests in flight are not cut into slices."""
        if progress is None:
            return self._encode(texts, self.spec.document_prompt)
        told = [0]

        def tell(done: int, _total: int) -> None:
            progress(done - told[0])
            told[0] = done

        return self._encode(texts, self.spec.document_prompt, tell)

    def _encode(
        self,
        texts: Sequence[str],
        prompt: str,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        raw = self.client.embed_all([prompt + t for t in texts], self.served, progress)
        if raw.shape[1] != self.fingerprint.dims:
            raise EndpointError(
                f"{self.client.where} returned {raw.shape[1]}-dim vectors, but its probe gave "
                f"{self.fingerprint.dims}: the served model changed; run again (it is probed "
                f"afresh) or check {SETTING_URL}"
            )
        if self.spec.dims < raw.shape[1]:  # Matryoshka: truncate, then normalise
            raw = raw[:, : self.spec.dims]
        return unit_rows(raw)

    def token_counts(self, texts: Sequence[str], prompt: str = "") -> list[int]:
        """Tokens per text (``prompt`` prepended) from the server's tokenize route."""
        counts = []
        for t in texts:
            ids = self.client.tokenize(prompt + t)
            if ids is None:
                raise EndpointError(
                    f"{self.client.where} has no tokenize route: token counts are unknown"
                )
            counts.append(len(ids))
        return counts

    def dropped_chars(self, text: str, prompt: str = "") -> int:
        """Characters past the window, estimated from the share of tokens past it."""
        window = self.max_seq_length
        if not window:
            return 0
        n = self.token_counts([text], prompt)[0]
        if n <= window:
            return 0
        return min(len(text), round(len(prompt + text) * (n - window) / n))

    def window_report(self, chunk_list: Sequence[Chunk]) -> dict[str, Any]:
        """The encoder-window report (the keys of :func:`~rag_assets.lib.index.embed.
        window_report`, plus ``note``) for a server: only texts that can be over the window
        (more UTF-8 bytes than tokens allow) are tokenized, by the server."""
        window = self.max_seq_length
        base: dict[str, Any] = {
            "window": window,
            "over": 0,
            "dropped_chars": 0,
            "worst_md": "none",
            "worst": [],
            "header_token_share": 0.0,
            "note": "",
        }
        if not chunk_list:
            return base
        if not window:
            base["note"] = (
                f"window unknown: set RAG_EMBED_WINDOW to the server's input limit in tokens "
                f"({SETTING_URL} reports none); a server that refuses long inputs fails the run"
            )
            return base
        if self.client._tokenize_route() is None:
            base["note"] = (
                f"{self.client.where} has no tokenize route: texts over the window cannot be "
                "counted; a server that refuses long inputs fails the run"
            )
            return base
        prompt = self.spec.document_prompt
        suspects = [c for c in chunk_list if len((prompt + c.text).encode()) + 4 > window]
        counts = self.token_counts([c.text for c in suspects], prompt) if suspects else []
        over = [(n, c) for n, c in zip(counts, suspects, strict=True) if n > window]
        dropped = {
            c.chunk_id: min(len(c.text), round(len(prompt + c.text) * (n - window) / n))
            for n, c in over
        }
        worst = sorted(over, key=lambda x: -x[0])[:5]
        lines = ["| chunk | document | tokens | chars dropped (est.) |", "|---|---|---|---|"]
        lines += [
            f"| {c.chunk_id[:12]} | {c.document_id} | {n} | {dropped[c.chunk_id]} |"
            for n, c in worst
        ]
        base.update(
            over=len(over),
            dropped_chars=sum(dropped.values()),
            worst_md="\n".join(lines) if over else "none",
            worst=[  # issue 31: what the command line names (document, section, size)
                {
                    "document": c.document_id,
                    "section": c.section,
                    "word_pieces": n,
                    "dropped_chars": dropped[c.chunk_id],
                }
                for n, c in worst
            ],
            note=f"{len(suspects)} of {len(chunk_list)} texts long enough to be over were "
            "tokenized by the server",
        )
        return base

    # -- the fingerprint ----------------------------------------------------------------------
    def known(self) -> list[Fingerprint]:
        return read_registry(self.store, self.work_dir)

    def reprobe(self) -> bool:
        """Probe again; True when the served model's fingerprint changed (the stamps then say
        the new id, and cached query vectors are dropped). A failed probe keeps the old state
        and is reported by :meth:`status`."""
        try:
            model, probe = probe_endpoint(self.client, max_age=0)
        except (EndpointError, HttpError) as exc:
            self.probe_error = str(exc)
            return False
        self.probe_error = None
        self.probed_at = time.time()
        self.probe = probe
        if model == self.served and probe.matches(self.fingerprint):
            return False
        fp = resolve(probe, self.known(), prefer=self.fingerprint.id)
        self._adopt(model, fp)
        self.changes += 1
        return True

    def check_table(self, stamps: Stamps, store: IndexStore | None = None) -> None:
        """Refuse, in one line, queries against a table whose vectors the served model no
        longer makes (:class:`EndpointChanged`); adopt the table's recorded fingerprint when the
        latest probe matches it within the tolerance."""
        spec = self.spec
        if stamps.revision == spec.revision and stamps.model == spec.model_id:
            return
        where = f"{SETTING_URL}={spec.url}"
        if not stamps.revision.startswith(FINGERPRINT_PREFIX):
            raise EndpointChanged(
                f"table was embedded by the local model {stamps.model} (rev {stamps.revision}), "
                f"but {SETTING_URL} is set: queries would be embedded by {spec.model_id} at "
                f"{where}; unset {SETTING_URL} to query this table, or re-index"
            )
        if stamps.model != self.served:
            raise EndpointChanged(
                f"table was embedded by {stamps.model!r} from a model server; {where} serves "
                f"{self.served!r}: set {SETTING_MODEL}={stamps.model!r}, or re-index"
            )
        known = read_registry(store or self.store, self.work_dir)
        recorded = next((f for f in known if f.id == stamps.revision), None)
        if recorded is not None and not self.probe.matches(recorded) and self._recheck():
            pass  # the served model may have changed since the last probe: probed again
        if recorded is not None and self.probe.matches(recorded):
            self._adopt(self.served, recorded)
            return
        if recorded is None:
            why = f"{stamps.revision} is not recorded in this index"
        else:
            cos = self.probe.min_cosine(recorded)
            why = f"probe cosine {cos:.4f} < {FINGERPRINT_MIN_COSINE}"
        raise EndpointChanged(
            f"the model {where} serves as {self.served!r} is not the one this table was "
            f"embedded with (fingerprint {stamps.revision}, served now {self.probe.id}: {why}): "
            "queries are refused rather than mixed; re-index (`rag-assets index`: the new table "
            "serves once it passes the gate) or serve the previous model again"
        )

    def _recheck(self) -> bool:
        """Probe again now, unless the last probe is under :data:`RECHECK_S` old or another
        thread is probing (a table that does not match may be one embedded with a model
        served since the last probe: a publish after a swap is then served at once)."""
        if time.time() - self.probed_at < RECHECK_S or not self._probing.acquire(blocking=False):
            return False
        try:
            self.reprobe()
        finally:
            self._probing.release()
        return True

    def watch(self, interval: float) -> threading.Thread | None:
        """Re-probe every ``interval`` seconds in a daemon thread (0: never); see :meth:`status`."""
        if interval <= 0 or self._watch is not None:
            return self._watch

        def run() -> None:
            while not self._stop.wait(interval):
                self.reprobe()

        self._watch = threading.Thread(target=run, name="rag-embed-probe", daemon=True)
        self._watch.start()
        return self._watch

    def stop(self) -> None:
        self._stop.set()

    def status(self) -> dict[str, Any]:
        """For ``/healthz``: the endpoint, the fingerprint in use and the last probe."""
        return {
            "url": self.spec.url,
            "model": self.served,
            "dims": self.spec.dims,
            "fingerprint": self.spec.revision,
            "probe": self.probe.id,
            "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.probed_at)),
            "probe_ok": self.probe_error is None,
            "probe_error": self.probe_error,
            "fingerprint_changes": self.changes,
            "requests": self.client.requests,
            "retries": dict(self.client.log.retries),
        }

    def register(self, store: IndexStore | None, work_dir: str | Path | None = None) -> None:
        """Record the fingerprint in use in ``store``'s registry (and the work dir's) before
        rows stamped with it are written there."""
        record(self.fingerprint, store, work_dir or self.work_dir)

    def _adopt(self, model: str, fp: Fingerprint) -> None:
        self.served = model
        self.fingerprint = fp
        self.spec = endpoint_spec(self.config, model, fp)
        with _CACHE_LOCK:
            self.__dict__.pop("_query_cache", None)  # vectors of the previous model


# -- from settings ------------------------------------------------------------------------------
def connect(
    config: EndpointConfig,
    *,
    store: IndexStore | None = None,
    work_dir: str | Path | None = None,
    prefer: str | None = None,
    record_work: bool = False,
    record_index: bool = False,
    max_age: float = 0.0,
) -> EndpointEmbedder:
    """Probe the server and resolve its fingerprint against the recorded ones (``store``'s and
    ``work_dir``'s). ``record_work`` / ``record_index``: remember it there (the write side);
    the query side records nothing. ``max_age``: a probe of the last seconds will do (default:
    probe now). Fails in one line (:class:`EndpointError`) when the server
    is down, refuses the key, does not serve the model or returns unusable vectors."""
    client = EmbeddingsClient(config)
    model, probe = probe_endpoint(client, max_age)
    known = read_registry(store, work_dir)
    fp = resolve(probe, known, prefer)
    embedder = EndpointEmbedder(config, client, model, probe, fp, store=store, work_dir=work_dir)
    if record_work or record_index:
        record(fp, store if record_index else None, work_dir if record_work else None)
    return embedder


def configured_embedder(
    settings: Settings,
    *,
    threads: int | None = None,
    store: IndexStore | None = None,
    record_work: bool = False,
) -> Embedder:
    """The encoder ``settings`` name: the model server at ``RAG_EMBED_URL`` when set, else the
    local model (``RAG_EMBEDDING_MODEL``, the packaged MiniLM by default)."""
    config = EndpointConfig.from_settings(settings)
    if config is not None:
        return connect(config, store=store, work_dir=settings.work_dir, record_work=record_work)
    from rag_assets.lib.index.embed import configured_model

    return Embedder(
        configured_model(settings),
        batch_size=settings.embed_batch_size,
        threads=threads or settings.embed_threads or None,
        device=settings.device,
    )


def query_endpoint(settings: Settings, config: EndpointConfig) -> EndpointEmbedder:
    """The query side's embedder: probes the server, resolves the fingerprint against the
    index's records (the published table's first), writes nothing."""
    from rag_assets.lib.index.store import IndexStore, is_remote

    store = None
    uri = settings.index_uri
    if is_remote(uri) or Path(uri).expanduser().is_dir():
        store = IndexStore(uri if is_remote(uri) else Path(uri).expanduser())
    prefer = None
    if store is not None:
        pub = store.published(strict=False)
        prefer = pub.stamps.revision if pub is not None else None
    return connect(config, store=store, work_dir=settings.work_dir, prefer=prefer)
