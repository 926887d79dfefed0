"""The service's Prometheus series (issue 52), served by ``GET /metrics`` in the text format.

Every series is named ``rag_*`` and labelled only with names from the code or the index (a
route template, a status code, a stage, a gate, a verdict, a table and its model): never a
question, a document name or a raw path.

- ``rag_requests_total{route,status}``, ``rag_request_seconds{route}`` (histogram) and
  ``rag_requests_in_progress``: every HTTP request, by route template (``/documents/{document_id}``,
  ``unmatched`` for a path no route serves);
- ``rag_ask_outcomes_total{outcome,gate}``: each ``/ask`` (and MCP ``ask``) answered (gate
  ``none``) or refused by the gate that said no (``distance``, ``judge``, ``verification``);
- ``rag_stage_seconds{stage}`` (histogram): embed, dense, bm25, fuse, rewrite, rerank, cite,
  judge, generate, ground, verify, timed where the stages run (:mod:`rag_assets.lib.observe`);
- ``rag_index_info{table,version,model}``: 1 for the version each worker serves (0 once it
  serves another);
- ``rag_feedback_total{verdict}``, ``rag_query_log_write_failures_total``,
  ``rag_query_log_dropped_total`` (entries), ``rag_model_server_errors_total{server,kind}``
  (failed requests to RAG_EMBED_URL, RAG_RERANK_URL, RAG_LLM_URL: ``embed``, ``rerank``,
  ``llm``), ``rag_ready`` (1 when the last readiness check passed, see
  :mod:`rag_assets.serve.ready`).

``rag-assets serve --workers N`` runs the client library's multiprocess mode: each worker writes
its values to files in ``PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary folder the command makes
and removes, or the operator's, emptied at start), and a scrape of any worker adds them all up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

MULTIPROC_VAR = "PROMETHEUS_MULTIPROC_DIR"
"""The client library's own variable: where the workers' values are kept (multiprocess mode)."""

GATES = frozenset({"distance", "judge", "verification"})
"""The gates an answer can be refused by (``refused_by`` of the answer); others are ``other``."""

STAGES = {"rewrite+fuse": "rewrite", "ground spans": "ground", "verification": "verify"}
"""Stage names of the core that are spelled otherwise as a label (the rest are kept)."""

SERVERS = {"RAG_EMBED_URL": "embed", "RAG_RERANK_URL": "rerank", "RAG_LLM_URL": "llm"}
"""Model-server errors by the setting that names the server: the label (others: ``other``)."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)


def prepare_workers(env: dict[str, str] | Any = os.environ, make: bool = True) -> Path | None:
    """Before ``serve --workers N`` starts its workers: a folder for their values (the
    operator's ``PROMETHEUS_MULTIPROC_DIR``, emptied of old values, or, with ``make``, a new
    temporary one), set in ``env`` for the workers to inherit. Returns the folder to remove at
    exit (None: the operator's, kept)."""
    given = env.get(MULTIPROC_VAR, "")
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.db"):  # a previous run's values would be added to ours
            old.unlink(missing_ok=True)
        return None
    if not make:
        return None
    made = Path(tempfile.mkdtemp(prefix="rag-assets-metrics-"))
    env[MULTIPROC_VAR] = str(made)
    return made


def remove_folder(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_VAR))


def _client() -> Any:
    """``prometheus_client``, its value store matching this process's mode (the library picks
    it when first imported: imported earlier without the variable, it is picked again)."""
    import prometheus_client
    from prometheus_client import values

    if multiprocess() and values.ValueClass is values.MutexValue:
        values.ValueClass = values.get_value_class()
    return prometheus_client


class Metrics:
    """The series, made once per process (:func:`metrics`)."""

    def __init__(self) -> None:
        pc = _client()
        self.requests = pc.Counter(
            "rag_requests",
            "HTTP requests answered, by route template and status",
            ["route", "status"],
        )
        self.request_seconds = pc.Histogram(
            "rag_request_seconds",
            "Time to answer an HTTP request (seconds), by route template",
            ["route"],
            buckets=LATENCY_BUCKETS,
        )
        self.in_progress = pc.Gauge(
            "rag_requests_in_progress",
            "HTTP requests being answered now",
            multiprocess_mode="livesum",
        )
        self.outcomes = pc.Counter(
            "rag_ask_outcomes",
            "Questions answered or refused (gate: the one that refused; none when answered)",
            ["outcome", "gate"],
        )
        self.stage_seconds = pc.Histogram(
            "rag_stage_seconds",
            "Time of one stage of a search or an answer (seconds)",
            ["stage"],
            buckets=STAGE_BUCKETS,
        )
        self.index_info = pc.Gauge(
            "rag_index_info",
            "1 for the table version served (model: the embedding model of its vectors)",
            ["table", "version", "model"],
            multiprocess_mode="livemax",
        )
        self.feedback = pc.Counter("rag_feedback", "Verdicts received, by verdict", ["verdict"])
        self.log_failures = pc.Counter(
            "rag_query_log_write_failures", "Query log batch writes that failed"
        )
        self.log_dropped = pc.Counter(
            "rag_query_log_dropped", "Query log entries dropped (written neither time)"
        )
        self.model_errors = pc.Counter(
            "rag_model_server_errors",
            "Failed requests to a model server (server: embed, rerank, llm; kind: http, "
            "timeout, connect, reset, protocol)",
            ["server", "kind"],
        )
        self.ready = pc.Gauge(
            "rag_ready",
            "1 when the latest readiness check (GET /ready, each scrape) passed, else 0",
            multiprocess_mode="livemostrecent",
        )
        self._served: tuple[str, str, str] | None = None

    # -- what the observer and the middleware record -----------------------------------------
    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def stage(self, name: str, seconds: float) -> None:
        self.stage_seconds.labels(name).observe(seconds)

    def event(self, name: str, value: float, labels: dict[str, str]) -> None:
        if name == "model_server_error":
            server = SERVERS.get(labels.get("server", ""), "other")
            self.model_errors.labels(server, labels.get("kind", "other")).inc(value)
        elif name == "query_log_write_failed":
            self.log_failures.inc(value)
        elif name == "query_log_dropped":
            self.log_dropped.inc(value)

    def outcome(self, refused_by: str | None) -> None:
        if refused_by is None:
            self.outcomes.labels("answered", "none").inc()
        else:
            gate = "verification" if refused_by in ("verify", "verifier") else refused_by
            self.outcomes.labels("refused", gate if gate in GATES else "other").inc()

    def verdict(self, verdict: str) -> None:
        from rag_assets.lib.query.feedback import VERDICTS

        self.feedback.labels(verdict if verdict in VERDICTS else "other").inc()

    def serving(self, table: str, version: int, model: str) -> None:
        """``rag_index_info`` of the version served now (the previous one set to 0)."""
        key = (table, str(version), model)
        if key == self._served:
            return
        if self._served is not None:
            self.index_info.labels(*self._served).set(0)
        self.index_info.labels(*key).set(1)
        self._served = key

    # -- the scrape ---------------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """The text format of every series (all workers' in multiprocess mode), its type."""
        pc = _client()
        if multiprocess():
            from prometheus_client import multiprocess as mp

            registry = pc.CollectorRegistry()
            mp.MultiProcessCollector(registry)
            return pc.generate_latest(registry), pc.CONTENT_TYPE_LATEST
        return pc.generate_latest(pc.REGISTRY), pc.CONTENT_TYPE_LATEST


_metrics: Metrics | None = None


def metrics() -> Metrics:
    """The process's series (made on first use: a registry accepts each name once)."""
    global _metrics
    if _metrics is None:
        _metrics = Metrics()
    return _metrics


def worker_exit() -> None:
    """A worker stopping: its live gauges leave the sums (multiprocess mode)."""
    if multiprocess():
        from prometheus_client import multiprocess as mp

        mp.mark_process_dead(os.getpid())
