# mypy: disable-error-code="union-attr,index,arg-type"
"""`rag-assets backfill` through Dagster's run queue (issue 23): refused in one line without an
instance or a daemon, and the helpers of the queue's end-to-end test, which runs in
``test_many_machines.py`` (issue 42): a model-upgrade backfill dequeued two batch runs at a time
over two worker machines into one table on S3, one worker killed mid-batch and the batch retried
by running the command again, the published table equal to the single run's."""

from __future__ import annotations

import sys
from pathlib import Path

import dagster as dg

from rag_assets_tests.test_backfill import _docs as _notes

DAGSTER_YAML = """\
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: 2
    dequeue_interval_seconds: 1
telemetry:
  enabled: false
"""
DAEMON = Path(sys.executable).parent / "dagster-daemon"


def _step_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of the run's embedding step process, while the step has not finished."""
    logs = instance.all_logs(run_id)
    done = any(e.dagster_event and e.dagster_event.is_step_success for e in logs)
    for e in logs:
        ev = e.dagster_event
        if ev is not None and ev.event_type_value == "STEP_WORKER_STARTED" and not done:
            return int(ev.event_specific_data.metadata["pid"].value)
    return None


def _daemon_up(instance: dg.DagsterInstance) -> bool:
    from dagster._daemon.controller import get_daemon_statuses

    status = get_daemon_statuses(instance, ["QUEUED_RUN_COORDINATOR"], ignore_errors=True)
    return bool(status["QUEUED_RUN_COORDINATOR"].healthy)


def _docs(root: Path) -> Path:
    return _notes(root, n=8)


def test_backfill_without_dagster_home_or_daemon_fails_in_one_line(tmp_path, monkeypatch, capsys):
    """No DAGSTER_HOME: refused naming it. A run queue no daemon serves: refused naming
    dagster-daemon, before anything is extracted or launched."""
    from rag_assets import cli

    root = _docs(tmp_path / "docs")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("RAG_WORK_DIR", str(tmp_path / "work"))
    args = ["backfill", "--documents", str(root), "--index", str(tmp_path / "index")]
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert "set DAGSTER_HOME" in err and "\n" not in err
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert "no dagster-daemon serves the run queue" in err and "\n" not in err
    assert not (tmp_path / "work").exists() and not (tmp_path / "index").exists()


def _overlap(records: list) -> int:
    """The most runs that were running at one time (from the runs' own start/end times)."""
    edges = sorted(
        [(r.start_time, 1) for r in records] + [(r.end_time, -1) for r in records],
        key=lambda x: (x[0], x[1]),
    )
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best
