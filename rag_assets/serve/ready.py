"""``GET /ready`` (issue 52): whether this process can answer a question now.

Ready means, checked in this order: for an object-store index the store answers (a request
with short timeouts and no retries); for a local one the index folder is there; the published
pointer reads; the table version it names opens and is read; the query encoder encodes (or the
model server of ``RAG_EMBED_URL`` embeds, within :data:`PROBE_TIMEOUT_S`, still serving the
table's model). ``/ready`` answers 200 ``{"ready": true}``, or 503 ``{"ready": false, "error":
"<what is down>: <why>"}`` naming the first part that failed, in one line without paths, URLs
or a server's text (``/ready`` needs no token, as a probe sends none).

A result is kept :data:`CACHE_S` seconds, so probes and scrapes cost at most one check per two
seconds. A check runs in a thread and ``/ready`` waits at most :data:`WAIT_S` for it: a store
that hangs is reported as not answering, and the next check, after the cache, starts afresh
(at most :data:`MAX_RUNNING` checks wait on a hung part at once). ``/healthz`` stays liveness:
200 while the process is alive.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CACHE_S = 2.0
"""Seconds a readiness result is reused."""
WAIT_S = 2.0
"""Longest ``/ready`` waits for a check (a Kubernetes probe's ``timeoutSeconds`` must exceed
it; docs/service.md#operating-it)."""
PROBE_TIMEOUT_S = 1.5
"""Timeout of each request a check sends to the object store or the model server."""
MAX_RUNNING = 4
"""Checks that may wait on a hung part at once (each holds a thread until its request ends)."""
PROBE_TEXT = "readiness probe"
"""What the check encodes (a fixed text, never a user's question)."""

STORE_OPTIONS = {
    "timeout": f"{PROBE_TIMEOUT_S:g}s",
    "connect_timeout": f"{PROBE_TIMEOUT_S:g}s",
    "client_max_retries": "0",
    "client_retry_timeout": "1",
}
"""LanceDB object-store options of the check's own connection: a store that does not answer is
reported at once instead of after the retries a query would make."""


class NotReady(Exception):
    """A part is down: ``str()`` is ``"<part>: <why>"``, one line for a client."""


@dataclass
class Result:
    ready: bool
    down: str = ""  # "<part>: <why>" when not ready
    at: float = field(default_factory=time.monotonic)


@dataclass
class _Run:
    started: float = field(default_factory=time.monotonic)
    part: str = "index"  # what is being checked now
    done: threading.Event = field(default_factory=threading.Event)
    result: Result | None = None


class Readiness:
    """The readiness of one :class:`~rag_assets.serve.service.Service`, cached."""

    def __init__(self, service: Any, *, cache_s: float = CACHE_S, wait_s: float = WAIT_S):
        self.service = service
        self.cache_s, self.wait_s = cache_s, wait_s
        self._lock = threading.Lock()
        self._last: Result | None = None
        self._running: list[_Run] = []

    def state(self) -> Result:
        """The cached result, or a new check's (waiting at most ``wait_s`` for it)."""
        with self._lock:
            last = self._last
            if last is not None and time.monotonic() - last.at <= self.cache_s:
                return last
            fresh = [r for r in self._running if time.monotonic() - r.started < self.wait_s]
            if fresh:
                run = fresh[-1]  # another request started one: wait for it too
            elif len(self._running) >= MAX_RUNNING:
                hung = self._running[-1]
                return self._keep(Result(False, f"{hung.part}: no answer (checks still waiting)"))
            else:
                run = _Run()
                self._running.append(run)
                threading.Thread(target=self._check, args=(run,), daemon=True).start()
        if not run.done.wait(max(0.0, self.wait_s - (time.monotonic() - run.started))):
            return self._keep(Result(False, f"{run.part}: no answer within {self.wait_s:g} s"))
        assert run.result is not None
        return run.result

    def _keep(self, result: Result) -> Result:
        with self._lock:
            if self._last is None or self._last.at <= result.at:
                self._last = result
        return result

    def _check(self, run: _Run) -> None:
        try:
            check(self.service, run)
            result = Result(True, at=run.started)
        except NotReady as exc:
            result = Result(False, str(exc), at=run.started)
        except Exception as exc:  # noqa: BLE001 - an unforeseen failure is a part that is down
            result = Result(False, f"{run.part}: {type(exc).__name__}", at=run.started)
        run.result = result
        with self._lock:
            self._running.remove(run)
            if self._last is None or self._last.at <= result.at:
                self._last = result
        run.done.set()


def check(service: Any, run: _Run | None = None) -> None:
    """Raise :class:`NotReady` naming the first part of ``service`` that is down."""
    run = run or _Run()
    uri = str(service.settings.index_uri)
    run.part = "index"
    try:
        holder = service.load()
    except Exception as exc:  # noqa: BLE001
        raise NotReady(f"index: not loaded ({type(exc).__name__})") from None
    if "://" in uri:
        run.part = "object store"
        store = _probe_store(uri)
    else:
        run.part = "index folder"
        if not Path(uri).expanduser().is_dir():
            raise NotReady("index folder: missing")
        store = holder.store
    run.part = "published pointer"
    try:
        pub = store.published()
    except Exception as exc:  # noqa: BLE001
        raise NotReady(f"published pointer: cannot be read ({type(exc).__name__})") from None
    if pub is None:
        raise NotReady("published pointer: nothing is published")
    run.part = "table"
    try:
        store.open_table(pub.table, pub.version).count_rows()
    except Exception as exc:  # noqa: BLE001
        raise NotReady(
            f"table: {pub.table}@v{pub.version} cannot be opened ({type(exc).__name__})"
        ) from None
    index = holder.current()
    encoder(index, run)


def _probe_store(uri: str) -> Any:
    """A connection of its own to the object store (short timeouts, no retries), listed once."""
    from rag_assets.lib.index.store import IndexStore

    try:
        return IndexStore(uri, storage_options=dict(STORE_OPTIONS))
    except Exception as exc:  # noqa: BLE001
        text = str(exc)
        why = next((what for pattern, what in STORE_CAUSES if pattern.search(text)), "")
        raise NotReady(f"object store: {why or type(exc).__name__}") from None


STORE_CAUSES = (
    (re.compile(r"NoSuchBucket|bucket does not exist", re.I), "the bucket does not exist"),
    (
        re.compile(r"status: 40[13]\b|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch", re.I),
        "credentials refused",
    ),
    (re.compile(r"time[d ]?out|connect|refused|dns error|reset", re.I), "not answering"),
)
"""What an object-store error says, as ``/ready`` may say it (no URI, no endpoint)."""


def encoder(index: Any, run: _Run) -> None:
    """The query encoder encodes; a model server answers within :data:`PROBE_TIMEOUT_S` and
    still serves the table's model."""
    embedder = index.embedder
    client = getattr(embedder, "client", None)
    if client is None or not hasattr(embedder, "check_table"):
        run.part = "query encoder"
        try:
            embedder.encode_query(PROBE_TEXT)
        except Exception as exc:  # noqa: BLE001
            raise NotReady(f"query encoder: {type(exc).__name__}") from None
        return
    from rag_assets.lib.index.endpoint import SETTING_URL, v1_base
    from rag_assets.lib.models.http import HttpError, JsonEndpoint

    run.part = "model server"
    config = embedder.config
    api = JsonEndpoint(config.url, SETTING_URL, config.api_key or None, PROBE_TIMEOUT_S)
    body = {"input": [PROBE_TEXT], "model": embedder.served, "encoding_format": "float"}
    try:
        data = api.request(v1_base(api.base) + "/embeddings", body)
    except HttpError as exc:
        status = f" {exc.status}" if exc.status else ""
        raise NotReady(f"model server: not answering ({exc.kind}{status})") from None
    if not isinstance(data, dict) or not data.get("data"):
        raise NotReady("model server: answered without an embedding")
    try:
        embedder.check_table(index.published.stamps, index.store)
    except Exception:  # noqa: BLE001 - EndpointChanged: queries are refused (503)
        raise NotReady("model server: serves another model than the table's") from None
