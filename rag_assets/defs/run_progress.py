"""What ``rag-assets index`` shows while the graph runs (issue 31).

It follows the run's events through the instance's event listener: each asset step's start and
end, and the ``progress:`` lines the assets log (:mod:`rag_assets.defs.progress`: files being
extracted, texts embedded out of those to embed, evaluation searches phase by phase).

- On a terminal (``live``): a bar of the stages and, below it, one of the current stage's
  counted work with its rate and ETA (tqdm); a line per stage stays above them as it ends.
- Otherwise (``lines``: a log file, CI): one line per stage as it ends, with its own time,
  written and flushed as it happens, not at the end of the run; a stage of :data:`NARRATED`
  (the encoder's training) also gets a line each tenth of its counted work, with the time so
  far and an estimate of what is left (issue 44: a training said nothing for 28 minutes).

``rag-assets adapt`` shows its run the same way, its lines named ``adapt:``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rag_assets.defs.progress import parse_progress

#: asset steps outside ``run.STAGES`` that still get a line (the optional doc2query step)
EXTRA_STAGES = {"chunk_questions": "expand"}
#: asset steps whose counted work gets lines off a terminal too (long: minutes to an hour)
NARRATED = frozenset({"adapted_encoder"})
#: lines per phase of a narrated step off a terminal: one each tenth of the work (and the first)
NARRATED_LINES = 10
#: characters of a document name shown beside the work bar
WHAT_WIDTH = 40
#: the bars' screen (columns, rows) when the terminal does not say its own
DEFAULT_SCREEN = (100, 24)


@dataclass
class _Stage:
    label: str
    started: float | None = None
    materialized: bool = False  # a materialisation or observation was recorded
    counts: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # phase → done, total
    narrated: set[tuple[str, int]] = field(default_factory=set)  # (phase, tenth) lines written
    # issue 51: (time, done) of each progress line of a phase, for an estimate that holds
    points: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def work(self) -> str:
        """``9 files``, ``79 texts``, ``467 searches``: what the stage counted, if anything."""
        if not self.counts:
            return ""
        units = {unit for _, _, unit in self.counts.values()}
        done = sum(d for d, _, _ in self.counts.values())
        if len(units) != 1:
            return ""
        unit = units.pop()
        return f"{done} {unit[:-1] if done == 1 and unit.endswith('s') else unit}"


class RunProgress:
    """Stage lines and, on a terminal, live bars for one run (see the module docstring)."""

    def __init__(
        self,
        stream: IO[str],
        stages: Sequence[tuple[str, str]],
        *,
        live: bool = False,
        lines: bool = False,
        name: str = "index",
    ) -> None:
        self.stream = stream
        self.name = name  # the command the lines are of (``index``, ``adapt``)
        self.live = live
        self.lines = lines or live  # a terminal keeps a line per finished stage too
        self.labels = {key: label for label, key in stages} | EXTRA_STAGES
        self.counted = {key for _, key in stages}  # what the stage bar counts
        self.stages: dict[str, _Stage] = {}
        self.stage_bar: Any = None
        self.work_bar: Any = None
        self._work_key: tuple[str, str] | None = None
        self.width = max(len(label) for label in self.labels.values())
        self.failed = False  # a step (or a blocking check) failed earlier in the run
        self.ncols, self.nrows = _screen(stream)
        if live:
            from tqdm import tqdm

            self.stage_bar = tqdm(
                total=len(stages),
                desc=name,
                unit="stage",
                file=stream,
                leave=False,
                position=0,
                ncols=self.ncols,
                nrows=self.nrows,
                bar_format="{desc} {n_fmt}/{total_fmt} stages |{bar:16}| {elapsed}{postfix}",
            )

    # -- events -------------------------------------------------------------------------------
    def on_event(self, entry: Any) -> None:
        """One event log entry of the run (from ``instance.add_event_listener``)."""
        step = getattr(entry, "step_key", None)
        ev = entry.dagster_event
        if ev is not None and ev.event_type_value == "STEP_FAILURE":
            self.failed = True
        if step not in self.labels:
            return
        stage = self.stages.setdefault(step, _Stage(self.labels[step]))
        if ev is None:
            p = parse_progress(entry.user_message or "")
            if p is not None:
                stage.counts[p.phase] = (p.done, p.total, p.unit)
                self._show_work(stage, p)
                self._narrate(step, stage, p, entry.timestamp)
            return
        kind = ev.event_type_value
        if kind == "STEP_START":
            stage.started = entry.timestamp
            if self.stage_bar is not None:
                self.stage_bar.set_postfix_str(stage.label)
        elif kind in ("ASSET_MATERIALIZATION", "ASSET_OBSERVATION"):
            stage.materialized = True
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED"):
            self._end(step, stage, kind, entry.timestamp)

    def _show_work(self, stage: _Stage, p: Any) -> None:
        if not self.live:
            return
        from tqdm import tqdm

        key = (stage.label, p.phase)
        desc = f"{stage.label}: {p.phase.replace('-', ' ')}" if p.phase else stage.label
        if self.work_bar is None:
            self.work_bar = tqdm(  # the assets send at most one line a second: draw each
                total=p.total,
                desc=desc,
                unit=p.unit,
                file=self.stream,
                leave=False,
                position=1,
                mininterval=0,
                ncols=self.ncols,
                nrows=self.nrows,
            )
        elif key != self._work_key:
            self.work_bar.reset(total=p.total)
            self.work_bar.set_description_str(desc, refresh=False)
            self.work_bar.unit = p.unit
        self._work_key = key
        if p.total != self.work_bar.total:
            self.work_bar.total = p.total
        self.work_bar.set_postfix_str(_shorten(p.what, WHAT_WIDTH), refresh=False)
        self.work_bar.update(max(0, p.done - self.work_bar.n))

    def _narrate(self, step: str, stage: _Stage, p: Any, at: float) -> None:
        """Off a terminal, a line each tenth of a :data:`NARRATED` step's counted work: what is
        done, the time so far and an estimate of what is left (:func:`time_left`)."""
        if step not in NARRATED or p.total <= 0:
            return
        stage.points.setdefault(p.phase, []).append((at, p.done))
        if self.live or not self.lines:
            return
        tenth = min(p.done, p.total) * NARRATED_LINES // p.total
        if (p.phase, tenth) in stage.narrated:
            return
        stage.narrated.add((p.phase, tenth))
        took = 0.0 if stage.started is None else max(0.0, at - stage.started)
        left = ""
        estimate = time_left(stage.points[p.phase], p.total)
        if estimate is not None and p.done < p.total:
            left = f", about {_duration(estimate)} left"
        what = f" ({p.what})" if p.what else ""
        phase = f"{p.phase.replace('-', ' ')} " if p.phase else ""
        line = (
            f"{self.name}: {stage.label:{self.width}} {took:6.1f} s  "
            f"{phase}{p.done}/{p.total} {p.unit}{what}{left}"
        )
        print(line, file=self.stream, flush=True)

    def _end(self, step: str, stage: _Stage, kind: str, at: float) -> None:
        if self.work_bar is not None:
            self.work_bar.close()
            self.work_bar, self._work_key = None, None
        took = "" if stage.started is None else f"{max(0.0, at - stage.started):6.1f} s"
        if kind == "STEP_SKIPPED":
            why = "a step or blocking check upstream failed" if self.failed else "nothing changed"
            text = f"skipped ({why})"
        elif kind == "STEP_FAILURE":
            text = f"FAILED after {took.strip()}"
        elif not stage.materialized:  # e.g. retrieval_eval with unchanged inputs
            text = f"{took}  not re-run (its inputs are unchanged)"
        else:
            text = f"{took}  {stage.work()}".rstrip()
        line = f"{self.name}: {stage.label:{self.width}} {text}"
        if self.live:
            from tqdm import tqdm

            tqdm.write(line, file=self.stream)
        elif self.lines:
            print(line, file=self.stream, flush=True)
        if self.stage_bar is not None and step in self.counted:
            self.stage_bar.update(1)

    def close(self) -> None:
        for bar in (self.work_bar, self.stage_bar):
            if bar is not None:
                bar.close()
        self.work_bar = self.stage_bar = None


RECENT_SHARE = 0.10
"""The recent window of :func:`time_left`: the last tenth of the work (at least 2 units)."""


def time_left(points: Sequence[tuple[float, int]], total: int) -> float | None:
    """Seconds the rest of a phase will take, from its progress lines ``(time, done)`` (issue
    51). The rate is measured from the phase's own first line, not from the step's start (a
    training's setup, loading the model and building its pairs, is not a step of it), and the
    slower of the whole phase's rate and the last tenth's is taken: when the machine gets busier
    the estimate follows the recent steps, and an early fast stretch does not promise a minute
    that the last steps then take ten times over. None until two lines a unit apart exist."""
    if len(points) < 2:
        return None
    (t0, d0), (t1, d1) = points[0], points[-1]
    if d1 <= d0 or t1 <= t0:
        return None
    per_unit = (t1 - t0) / (d1 - d0)
    window = max(2, int(total * RECENT_SHARE))
    recent = [(t, d) for t, d in points if d >= d1 - window]
    (rt, rd) = recent[0]
    if d1 - rd >= 2 and t1 > rt:
        per_unit = max(per_unit, (t1 - rt) / (d1 - rd))
    return per_unit * max(0, total - d1)


def _screen(stream: IO[str]) -> tuple[int, int]:
    """The terminal's columns and rows; :data:`DEFAULT_SCREEN` for what it does not say (tqdm
    draws nothing on one that reports 0 x 0, as a pseudo-terminal does until it is sized)."""
    try:
        size = os.get_terminal_size(stream.fileno())
        columns, rows = size.columns, size.lines
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        columns = rows = 0
    return (columns if columns > 0 else DEFAULT_SCREEN[0], rows if rows > 0 else DEFAULT_SCREEN[1])


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``1.5 h``: an estimate, said as roughly as it is known."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]
