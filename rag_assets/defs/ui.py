"""The Dagster UI of an index (issue 31): where its runs are recorded, the command that shows
them, and the ``dagster dev`` behind ``rag-assets ui`` and ``make dev``, stopped on Ctrl-C or
SIGTERM with its webserver, daemon and code servers within a bounded time.

An index's runs live with the index: ``rag-assets index`` records them in the Dagster instance
``<working folder>/dagster`` (:func:`dagster_home`), where the working folder is the index's own
(``<index>/.rag-work``, or per user for an object-store index; ``RAG_WORK_DIR`` overrides) and
``DAGSTER_HOME``, when set, overrides both. ``rag-assets status`` prints :func:`ui_command`,
which starts the UI on exactly that instance and index. Nothing here imports Dagster.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings

#: the code location ``dagster dev`` loads (the one ``dg dev`` finds in pyproject.toml)
CODE_LOCATION_MODULE = "rag_assets.definitions"

STOP_GRACE_S = 10.0
"""Seconds ``dagster dev`` gets, after the first Ctrl-C or SIGTERM, to stop its webserver, daemon
and code servers itself (it asks each over a pipe or gRPC); what is left of its process group
then gets SIGTERM, and :data:`KILL_AFTER_S` later SIGKILL. Dagster's own waits are up to 60 s per
process, and a code server that misses the shutdown request lives on until its heartbeat
times out (45 s); a second Ctrl-C skips the grace."""
KILL_AFTER_S = 3.0


def dagster_home(settings: Settings, env: Mapping[str, str]) -> Path:
    """The Dagster instance of this index's runs: ``$DAGSTER_HOME`` when set, else
    ``<working folder>/dagster`` (``<index>/.rag-work/dagster`` for a local index)."""
    given = env.get("DAGSTER_HOME", "")
    return Path(given).expanduser() if given else Path(settings.work_dir) / "dagster"


def absolute_uri(uri: str) -> str:
    """A local index path made absolute (an object-store URI unchanged)."""
    return uri if "://" in uri else str(Path(uri).expanduser().resolve())


def ui_command(settings: Settings, env: Mapping[str, str]) -> str:
    """The command that starts the Dagster UI on this index and the instance its runs are in,
    runnable from any directory: ``rag-assets ui --index /abs/index`` (plus ``DAGSTER_HOME=…``
    or ``RAG_WORK_DIR=…`` in front when those are set, since they decide the instance)."""
    prefix = []
    if env.get("DAGSTER_HOME"):
        prefix.append(f"DAGSTER_HOME={shlex.quote(str(dagster_home(settings, env).resolve()))}")
    elif settings.work_dir_given:
        prefix.append(f"RAG_WORK_DIR={shlex.quote(str(Path(settings.work_dir).resolve()))}")
    index = shlex.quote(absolute_uri(settings.index_uri))
    return " ".join([*prefix, "rag-assets", "ui", "--index", index])


def dagster_dev_env(settings: Settings, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of the ``dagster dev`` that shows this index: ``DAGSTER_HOME`` (the
    index's instance), ``RAG_INDEX_URI`` (absolute, so the code location opens the same index
    whatever its working directory) and ``RAG_WORK_DIR`` when it was given."""
    out = dict(env)
    out["DAGSTER_HOME"] = str(dagster_home(settings, env).resolve())
    out["RAG_INDEX_URI"] = absolute_uri(settings.index_uri)
    if settings.work_dir_given:
        out["RAG_WORK_DIR"] = str(Path(settings.work_dir).resolve())
    return out


def recorded_runs(home: Path, job: str = "index_job") -> int | None:
    """How many runs of ``job`` the instance at ``home`` holds (None: no instance there yet).
    Read from its SQLite run storage directly, so ``status`` needs no Dagster import."""
    db = home / "history" / "runs.db"
    if not db.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0) as conn:
            row = conn.execute("SELECT COUNT(*) FROM runs WHERE pipeline_name = ?", (job,))
            return int(row.fetchone()[0])
    except sqlite3.Error:  # another storage layout: say nothing rather than guess
        return None


def runs_report(settings: Settings, env: Mapping[str, str]) -> dict[str, Any]:
    """``status``'s ``runs``: the instance, how many index runs it holds, the UI command."""
    home = dagster_home(settings, env)
    return {
        "dagster_home": str(home.resolve()),
        "index_runs": recorded_runs(home),
        "ui_command": ui_command(settings, env),
    }


def dev_command(args: Sequence[str] = ()) -> list[str]:
    """``dagster dev`` on the project's code location, with ``args`` (``--port``, ``--host``)."""
    return [sys.executable, "-m", "dagster", "dev", "-m", CODE_LOCATION_MODULE, *args]


def run_ui(
    settings: Settings,
    env: Mapping[str, str],
    args: Sequence[str] = (),
    *,
    announce: Any = None,
) -> int:
    """Run ``dagster dev`` for this index until it exits or is stopped.

    It runs in a process group of its own, so that what it starts (webserver, daemon, code
    servers, a run it launched) can be found and stopped as one: on Ctrl-C or SIGTERM it is
    asked to stop (it stops its webserver and daemon itself), given :data:`STOP_GRACE_S`, then
    what is left of its group gets SIGTERM and, :data:`KILL_AFTER_S` later, SIGKILL. Returns
    ``dagster dev``'s exit status, or 128 + the signal that stopped it."""
    from rag_assets.defs.run import ensure_instance_config

    child_env = dagster_dev_env(settings, env)
    home = Path(child_env["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    ensure_instance_config(home)  # no telemetry, no "no dagster.yaml" notice
    if announce is not None:
        announce(f"Dagster UI of {child_env['RAG_INDEX_URI']}; runs in {home}")
    # SIGTERM to `rag-assets ui` when its parent ends, however it ends: a `make dev` killed
    # without passing the signal on still stops the UI (a SIGKILL to `rag-assets ui` itself
    # cannot be helped: dagster dev, sent SIGTERM then, ends without its webserver and daemon)
    _death_signal()()
    # The handlers come first: a child inherits ignored signals across exec, and a launcher
    # that ignores SIGINT and SIGTERM (a background job of a script ignores SIGINT; Dagster's
    # in-process runs then give SIGTERM the same handler) would leave dagster dev deaf to the
    # stop below. Handled signals are reset to the default in the child. A launcher may also
    # have left them blocked (the mask is inherited too).
    stop = _Stop()
    previous = {s: signal.signal(s, stop.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    since = time.time()  # the runs created from now on are this UI's
    try:
        proc = subprocess.Popen(dev_command(args), env=child_env, process_group=0)
    except BaseException:
        for s, handler in previous.items():
            signal.signal(s, handler)
        raise
    stop.started(proc)
    try:
        while proc.poll() is None:
            if stop.deadline is not None and time.monotonic() >= stop.deadline:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        stop_group(proc)
        # issue 51: a run the UI's webserver or daemon started ended with it: none stays STARTED
        ended = end_runs_left(home, since)
        if ended and announce is not None:
            announce(
                f"the UI was stopped during {len(ended)} run{'' if len(ended) == 1 else 's'}: "
                f"{', '.join(ended)} (marked CANCELED, with the reason, in {home})"
            )
    if stop.signum is not None:
        return 128 + stop.signum
    return int(proc.returncode or 0)


UNFINISHED = ("STARTING", "STARTED", "CANCELING")
"""Run states that a stopped UI would leave as they are (a run worker it started is gone)."""
STOPPED_UI = (
    "the Dagster UI (rag-assets ui) was stopped while this run was in progress; its process "
    "ended with the UI (issue 51: marked CANCELED so that no run stays STARTED)"
)


def end_runs_left(home: Path, since: float) -> list[str]:
    """Mark CANCELED, with :data:`STOPPED_UI` as the reason, every run of the instance at
    ``home`` created at ``since`` or later that is still starting or started while no process
    that ran it is alive (its webserver, daemon and run workers are gone with the UI). A run
    another process is running (a ``rag-assets index`` beside the UI) is left as it is.
    Returns the short ids (``ab12cd34 index_job``) of the runs it ended."""
    import datetime as dt

    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRunStatus

    if not (home / "dagster.yaml").is_file():
        return []
    try:
        instance = dg.DagsterInstance.from_config(str(home))
    except Exception:  # noqa: BLE001 - an instance that cannot be opened has nothing to end
        return []
    ended = []
    with instance:
        runs = instance.get_runs(
            filters=dg.RunsFilter(
                statuses=[DagsterRunStatus(s) for s in UNFINISHED],
                created_after=dt.datetime.fromtimestamp(since - 1, dt.UTC),
            )
        )
        for run in runs:
            events = instance.all_logs(run.run_id)
            pids = {e.dagster_event.pid for e in events if e.dagster_event and e.dagster_event.pid}
            if any(_alive(pid) for pid in pids):
                continue
            instance.report_run_canceled(run, message=STOPPED_UI)
            ended.append(f"{run.run_id[:8]} {run.job_name}")
    return ended


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _death_signal() -> Any:
    """Linux: a function that asks for SIGTERM to the calling process when its parent ends,
    however it ends (``prctl(PR_SET_PDEATHSIG)``); elsewhere one that does nothing. Resolved
    here, in the parent, so that a forked child only calls it (no library loading after fork)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            return lambda: None
        return lambda: prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    return lambda: None


class _Stop:
    """The signal handler of :func:`run_ui`: the first signal asks ``dagster dev`` to stop and
    starts the grace period; a second one ends it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[Any] | None = None
        self.signum: int | None = None
        self.deadline: float | None = None

    def started(self, proc: subprocess.Popen[Any]) -> None:
        """``dagster dev`` is running; a signal that came while it started is passed on now."""
        self.proc = proc
        if self.signum is not None:
            self._ask_to_stop()

    def handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:  # a second Ctrl-C: no more waiting
            self.deadline = time.monotonic()
            return
        self.signum = signum
        self.deadline = time.monotonic() + STOP_GRACE_S
        if self.proc is not None:
            self._ask_to_stop()

    def _ask_to_stop(self) -> None:
        # dagster dev handles SIGINT and SIGTERM alike: it stops its webserver and daemon
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGINT)  # type: ignore[union-attr]


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """End what is left of ``proc``'s process group: SIGTERM, then SIGKILL after
    :data:`KILL_AFTER_S` (each bounded; processes that already left are not waited for)."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, KILL_AFTER_S)):
        if not _group_alive(pgid, proc):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait_s
        while time.monotonic() < end and _group_alive(pgid, proc):
            time.sleep(0.1)


def _group_alive(pgid: int, proc: subprocess.Popen[Any]) -> bool:
    proc.poll()  # reap our own child, so it does not count as alive as a zombie
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
