"""Progress of long steps as Dagster log lines (issue 31).

An asset reports counted work (files extracted, texts embedded, evaluation searches) through
:class:`StepProgress`: at most one ``progress: STAGE DONE/TOTAL UNIT (what)`` line a second in
the run's event log (the UI shows them), always the first and the last. ``rag-assets index``
follows the same lines through its event listener (:mod:`rag_assets.defs.run_progress`) and
draws them as bars with a rate and an ETA.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

PROGRESS = re.compile(r"^progress: (\w+)(?:/([\w-]+))? (\d+)/(\d+) ([\w-]+)(?: \((.*)\))?$")
"""A progress line: stage (with its phase after a slash, e.g. ``evaluate/self-queries``), done,
total, unit, and what is being worked on (optional)."""

MIN_INTERVAL_S = 1.0
"""Seconds between two progress lines of one step (the first and the last always go out)."""


def progress_line(stage: str, done: int, total: int, unit: str, what: str = "") -> str:
    """``progress: embed 160/790 texts``, or ``… (03-versions.md)`` with what is underway;
    ``stage`` may name a phase: ``evaluate/unrelated-questions``."""
    return f"progress: {stage} {done}/{total} {unit}" + (f" ({what})" if what else "")


@dataclass
class Progress:
    """One parsed progress line."""

    stage: str
    phase: str
    done: int
    total: int
    unit: str
    what: str = ""


def parse_progress(message: str) -> Progress | None:
    m = PROGRESS.match(message)
    if m is None:
        return None
    return Progress(m[1], m[2] or "", int(m[3]), int(m[4]), m[5], m[6] or "")


class StepProgress:
    """Throttled progress lines of one stage through ``context.log``."""

    def __init__(self, context: Any, stage: str, unit: str) -> None:
        self.context = context
        self.stage = stage
        self.unit = unit
        self._last = 0.0
        self._sent: tuple[int, int] | None = None

    def __call__(self, done: int, total: int, what: str = "") -> None:
        now = time.monotonic()
        edge = done in (0, total) and (done, total) != self._sent
        if not edge and now - self._last < MIN_INTERVAL_S:
            return
        self._last, self._sent = now, (done, total)
        self.context.log.info(progress_line(self.stage, done, total, self.unit, what))


class SearchCounter:
    """Counts an evaluation's searches, phase by phase (``questions``, ``other-topics``), as
    progress lines of the stage ``evaluate``: it wraps ``index.search``."""

    def __init__(self, context: Any, index: Any) -> None:
        self.context = context
        self.report: StepProgress | None = None
        self.done = 0
        self.total = 0
        search = index.search

        def counted(*args: Any, **kwargs: Any) -> Any:
            hits = search(*args, **kwargs)
            self.done += 1
            if self.report is not None:
                self.report(min(self.done, self.total), self.total)
            return hits

        index.search = counted

    def finish(self) -> None:
        """The phase's work was done without searches (issue 53: one batch): report it done."""
        if self.report is not None and self.total:
            self.report(self.total, self.total)

    def start(self, phase: str, total: int) -> None:
        """A new phase of ``total`` searches."""
        self.report = StepProgress(self.context, f"evaluate/{phase}", "searches")
        self.done, self.total = 0, max(0, total)
        if total:
            self.report(0, total)
