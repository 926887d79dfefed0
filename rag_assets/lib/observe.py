"""Hooks through which the core reports its stage timings and events, for whoever listens.

The core does not know about metrics or traces: where a stage ends it calls :func:`stage_done`
(or times a block with :func:`timed`), and where something worth counting happens it calls
:func:`event`. Both do nothing unless an :class:`Observer` was installed (:func:`install`): the
service installs the one of ``rag_assets/serve/observe.py`` (Prometheus histograms and counters,
OpenTelemetry child spans), a notebook or the CLI none. The cost without an observer is one
global read per call; the module imports only the standard library.

Stages (``name``): ``embed``, ``dense``, ``bm25``, ``fuse``, ``rewrite+fuse``, ``rerank``,
``cite``, ``judge``, ``ground spans`` (:class:`rag_assets.lib.query.retrieve.Timings`),
``generate`` (:func:`rag_assets.lib.query.generate.generate_answer`); an answer check of its
own (a verifier) reports ``verify`` with :func:`timed`. Events: ``model_server_error``
(``server``: the setting of the endpoint, ``kind``: http, timeout, connect, reset, protocol;
:func:`rag_assets.lib.models.http.send`), ``query_log_write_failed`` and
``query_log_dropped`` (``value``: entries; :class:`rag_assets.lib.query.log.LogWriter`).
Labels are names from the code, never text a user sent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Protocol


class Observer(Protocol):
    """What an installed observer receives. Called from the thread doing the work (a request's,
    or a background writer's); must not raise and must be quick."""

    def stage(self, name: str, seconds: float) -> None:
        """Stage ``name`` just ended after ``seconds`` of wall time."""

    def event(self, name: str, value: float, labels: dict[str, str]) -> None:
        """Something countable happened ``value`` times (``labels``: names from the code)."""


_observer: Observer | None = None


def install(observer: Observer | None) -> Observer | None:
    """Make ``observer`` the process's observer (None: none); returns the one it replaces."""
    global _observer
    previous, _observer = _observer, observer
    return previous


def installed() -> Observer | None:
    return _observer


def stage_done(name: str, seconds: float) -> None:
    """Report that stage ``name`` took ``seconds`` (nothing without an observer)."""
    observer = _observer
    if observer is not None:
        with contextlib.suppress(Exception):  # observing never fails the work
            observer.stage(name, seconds)


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    """Time the block as stage ``name`` (reported also when it raises)."""
    if _observer is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        stage_done(name, time.perf_counter() - started)


def event(name: str, value: float = 1.0, **labels: str) -> None:
    """Report ``value`` occurrences of ``name`` with ``labels`` (nothing without an observer)."""
    observer = _observer
    if observer is not None:
        with contextlib.suppress(Exception):
            observer.event(name, value, labels)
