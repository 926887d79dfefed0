# mypy: disable-error-code="union-attr,index,arg-type"
"""`rag-assets backfill` through Dagster's run queue (issue 23): a real instance whose
dagster.yaml names a QueuedRunCoordinator (max_concurrent_runs: 2) and the default run launcher,
a real dagster-daemon dequeuing the batch runs two at a time into one LanceDB table, one batch's
embedding process killed with SIGKILL mid-run and the batch retried by running the command again;
the published table equals the single run's (same ids and texts, vectors within 1e-6)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
from rag_assets_tests.helpers import REPO, SAMPLE_EVAL
from rag_assets_tests.test_backfill import _docs as _notes
from rag_assets_tests.test_backfill import assert_same_table

STRAT = chunk_strategy("E", 200)
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


def backfill_through_the_queue(tmp_path: Path, real_embedder, monkeypatch, index_uri: str) -> None:
    """The whole check, for one index URI. ``test_backfill_queue_s3.py`` runs it on the S3
    server, which asserts all a local directory would and more (the credentials reach the
    daemon and every batch run through ``AWS_*`` alone); the same queue into a local directory
    ran here too until 2026-12-04 (issue 38: about 2 minutes of a 2-core run for no check of
    its own; a local backfill without the queue is ``test_backfill.py``'s)."""
    root = _docs(tmp_path / "docs")
    single = index_folder(root, tmp_path / "single", STRAT, real_embedder, publish=False).entry
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "RAG_DOCUMENTS_DIR": str(root),
        "RAG_INDEX_URI": index_uri,
        "RAG_WORK_DIR": str(tmp_path / "work"),
        "RAG_EVAL_DIR": str(SAMPLE_EVAL),
        "RAG_CHUNK_TARGET": "200",
        "RAG_BACKFILL_BATCH_ROWS": "3",
        "RAG_DEVICE": "cpu",
    }
    for k in ("DAGSTER_HOME", "RAG_INDEX_URI"):
        monkeypatch.setenv(k, env[k])
    # a backfill runs with the automation paused (docs/scaling.md): else the sensor's eager
    # chunk_embeddings embeds the freshly planned chunks in one run of its own
    subprocess.run(
        [str(DAEMON.parent / "dagster"), "sensor", "stop", "rag_automation_sensor",
         "-m", "rag_assets.definitions"],
        env=env, cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    daemon = subprocess.Popen(
        [str(DAEMON), "run", "-m", "rag_assets.definitions"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log: list[str] = []
    try:
        with dg.DagsterInstance.get() as instance:
            while not _daemon_up(instance):  # the command refuses a queue no daemon serves
                assert daemon.poll() is None, "dagster-daemon exited"
                time.sleep(0.5)
            first = subprocess.Popen(
                [sys.executable, "-m", "rag_assets.cli", "backfill"],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            killed: str | None = None
            while first.poll() is None:  # kill one batch's embedding process mid-run
                if killed is None:
                    for run in instance.get_runs(dg.RunsFilter(job_name="embedding_backfill")):
                        pid = (
                            _step_pid(instance, run.run_id)
                            if run.status.value == "STARTED"
                            else None
                        )
                        if pid is not None:
                            os.kill(pid, signal.SIGKILL)
                            killed = run.tags["dagster/partition"]
                            break
                time.sleep(0.2)
            out1 = first.stdout.read()
            log.append(out1)
            print(out1, flush=True)
            assert killed is not None, out1
            assert first.returncode == 1, out1
            assert f"batch runs failed ({killed})" in out1 and "keeps serving" in out1
            assert IndexStore(env["RAG_INDEX_URI"]).published(strict=False) is None

            second = subprocess.run(
                [sys.executable, "-m", "rag_assets.cli", "backfill"],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                check=False,
            )
            log.append(second.stdout + second.stderr)
            assert second.returncode == 0, log[-1]
            assert "1 to embed" in second.stdout  # only the killed batch is launched again

            records = list(instance.get_run_records(dg.RunsFilter(job_name="embedding_backfill")))
            records.sort(key=lambda r: r.start_time or 0)
            t0 = records[0].start_time
            for r in records:
                log.append(
                    f"{r.dagster_run.tags['dagster/partition']} {r.dagster_run.run_id[:8]} "
                    f"{r.dagster_run.status.value} start +{r.start_time - t0:.1f}s "
                    f"end +{r.end_time - t0:.1f}s"
                )
            print("\n".join(log))
            keys = instance.get_dynamic_partitions("embedding_batches")
            assert len(keys) >= 3
            assert len(records) == len(keys) + 1  # every batch once, the killed one twice
            first_wave = [r for r in records if r.dagster_run.status.value == "SUCCESS"]
            assert _overlap(records) == 2  # the queue ran them two at a time, never three
            retried = [r for r in records if r.dagster_run.tags["dagster/partition"] == killed]
            assert sorted(r.dagster_run.status.value for r in retried) == ["FAILURE", "SUCCESS"]
            assert len(first_wave) == len(keys)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)

    store = IndexStore(env["RAG_INDEX_URI"])
    pub = store.published()
    assert pub.table == single.table
    assert_same_table(IndexStore(tmp_path / "single"), single, store, pub)
