# mypy: disable-error-code="union-attr,index,arg-type"
"""Issue 42: many machines for real. Dagster's instance on Postgres storage (a real PostgreSQL
server) with the ``dagster.yaml`` of docs/scaling.md, read from the page; workers that share only
the bucket (a moto S3 server, authentication on) and that database. See docs/scaling.md, "Many
machines"."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import dagster as dg
import pytest
import yaml

from rag_assets.lib.index.embed import Embedder, resolve_model
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.helpers import REPO, SAMPLE_EVAL
from rag_assets_tests.machines import MACHINE_TAG, PID_TAG, machine
from rag_assets_tests.pg_server import fresh_database
from rag_assets_tests.test_backfill import STRAT, assert_same_table
from rag_assets_tests.test_backfill import _docs as _notes
from rag_assets_tests.test_backfill_queue import DAEMON, _daemon_up, _overlap, _step_pid

DOCS = REPO / "docs" / "scaling.md"
MARKER = "<!-- many-machines dagster.yaml"


def docs_dagster_yaml() -> dict:
    """The many-workers ``dagster.yaml`` of docs/scaling.md (the fenced block after the marker)."""
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(r"```yaml\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert found is not None, "no yaml block after the marker in docs/scaling.md"
    return yaml.safe_load(found.group(1))


def instance_yaml(launcher: dict | None, max_concurrent_runs: int | None = None) -> str:
    """The docs' ``dagster.yaml`` with ``launcher`` in the place of ``K8sRunLauncher`` (None:
    Dagster's default launcher), everything else as written there but the run queue's
    ``max_concurrent_runs`` when given (a small one shows the queue's bound on a few batches)."""
    cfg = docs_dagster_yaml()
    assert cfg["run_launcher"]["class"] == "K8sRunLauncher"
    assert cfg["storage"]["postgres"]["postgres_db"]["hostname"] == {"env": "DAGSTER_PG_HOST"}
    del cfg["run_launcher"]
    if launcher is not None:
        cfg["run_launcher"] = launcher
    if max_concurrent_runs is not None:
        cfg["run_coordinator"]["config"]["max_concurrent_runs"] = max_concurrent_runs
    return yaml.safe_dump(cfg, sort_keys=False)


@pytest.fixture
def pg(pg_server, request, monkeypatch) -> dict[str, str]:
    """A database of its own on the session's PostgreSQL server, in ``DAGSTER_PG_*``."""
    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + f"_{os.getpid()}"
    settings = fresh_database(pg_server, name)
    for k, v in settings.items():
        monkeypatch.setenv(k, v)
    return settings


def test_the_docs_dagster_yaml_runs_the_graph_on_postgres(tmp_path, pg, monkeypatch):
    """Runs, events, materialisations, dynamic partitions and the instigators' state are in
    Postgres: a second instance (another DAGSTER_HOME with the same file) sees them all."""
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    from rag_assets.defs.backfill import BATCHES, PLAN_JOB, default_backfill_definitions
    from rag_assets.defs.build import build_definitions
    from rag_assets_tests.helpers import graph_settings

    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    for home in homes:
        home.mkdir()
        (home / "dagster.yaml").write_text(instance_yaml(None))
    root = _notes(tmp_path / "docs", n=6)
    settings = graph_settings(tmp_path, root, chunk_target=STRAT.target, backfill_batch_rows=3)
    defs = dg.Definitions.merge(build_definitions(settings), default_backfill_definitions(settings))
    started = time.monotonic()
    with dg.DagsterInstance.from_config(str(homes[0])) as one:
        assert isinstance(one.run_storage, PostgresRunStorage)
        assert isinstance(one.event_log_storage, PostgresEventLogStorage)
        assert type(one.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert one.run_monitoring_enabled
        res = defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=one)
        assert res.success
        keys = one.get_dynamic_partitions(BATCHES.name)
        assert len(keys) >= 2
    with dg.DagsterInstance.from_config(str(homes[1])) as two:  # another machine's instance
        runs = two.get_runs()
        assert [r.run_id for r in runs] == [res.run_id]
        assert runs[0].status == dg.DagsterRunStatus.SUCCESS
        assert two.get_dynamic_partitions(BATCHES.name) == keys
        for key in ("extracted_documents", "chunks", "backfill_plan"):
            assert two.get_latest_materialization_event(dg.AssetKey(key)) is not None
        assert any(e.dagster_event and e.dagster_event.is_step_success
                   for e in two.all_logs(res.run_id))  # fmt: skip
    print(f"plan job on Postgres storage: {time.monotonic() - started:.1f} s")


@pytest.mark.slow
def test_a_model_upgrade_backfill_over_two_machines_sharing_only_bucket_and_postgres(
    tmp_path, real_embedder, second_model_dir, s3_env, pg, monkeypatch
):
    """Two worker machines, a daemon's and the command line's, each with its own DAGSTER_HOME
    and RAG_WORK_DIR, sharing only the S3 bucket (the credentials only in ``AWS_*``) and the
    Postgres database. A model upgrade's backfill fans out over the run queue to both machines,
    two batch runs at a time (the queue's ``max_concurrent_runs: 2``: they do overlap two and
    never three); one batch run's worker is killed mid-batch, ``run_monitoring`` marks the run
    failed, the retry (the command again, on an emptied working folder) runs only that batch,
    and the published table equals the upgraded model's single run on one machine (same ids and
    texts, vectors within 1e-6). (Issue 23's queue test on S3 ran apart until 2026-12-05; this
    one asserts all it did.)"""
    root = _notes(tmp_path / "docs", n=8)
    uri = f"s3://rag/{tmp_path.name}"
    upgraded = Embedder(resolve_model(str(second_model_dir)), batch_size=16)
    single = index_folder(root, tmp_path / "single", STRAT, upgraded, publish=False).entry
    before = index_folder(root, uri, STRAT, real_embedder).entry  # the packaged model's, published

    machines = tmp_path / "machines"
    workers = [machines / "machine-a", machines / "machine-b"]
    launcher = {
        "module": "rag_assets_tests.machines",
        "class": "MachineRunLauncher",
        "config": {"machines": [str(w) for w in workers]},
    }
    text = instance_yaml(launcher, max_concurrent_runs=2)
    for w in workers:
        machine(machines, w.name, text)
    daemon_m, cli_m = machine(machines, "daemon", text), machine(machines, "cli", text)
    shared = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "RAG_"))}
    shared.update(
        {
            **pg,  # DAGSTER_PG_*: the database
            **s3_env,  # AWS_*: the bucket
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
            ),
            "RAG_INDEX_URI": uri,
            "RAG_EMBEDDING_MODEL": str(second_model_dir),  # the upgrade
            "RAG_EVAL_DIR": str(SAMPLE_EVAL),
            "RAG_CHUNK_TARGET": str(STRAT.target),
            "RAG_BACKFILL_BATCH_ROWS": "3",
            "RAG_DEVICE": "cpu",
            "RAG_ADAPT": "off",
        }
    )

    def env_on(m: Path, **extra: str) -> dict[str, str]:
        (m / "work").mkdir(exist_ok=True)
        return {**shared, "DAGSTER_HOME": str(m / "home"), "RAG_WORK_DIR": str(m / "work"),
                **extra}  # fmt: skip

    cli_env = env_on(cli_m, RAG_DOCUMENTS_DIR=str(root))  # the documents are the CLI's alone
    monkeypatch.setenv("DAGSTER_HOME", cli_env["DAGSTER_HOME"])
    subprocess.run(
        [sys.executable, "-m", "dagster", "sensor", "stop", "rag_automation_sensor",
         "-m", "rag_assets.definitions"],
        env=cli_env, cwd=cli_m, check=True, capture_output=True,
    )  # fmt: skip
    daemon = subprocess.Popen(
        [str(DAEMON), "run", "-m", "rag_assets.definitions"],
        env=env_on(daemon_m),
        cwd=daemon_m,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    started = time.monotonic()
    log: list[str] = []
    try:
        with dg.DagsterInstance.get() as instance:
            while not _daemon_up(instance):
                assert daemon.poll() is None, "dagster-daemon exited"
                time.sleep(0.5)
            first = subprocess.Popen(
                [sys.executable, "-m", "rag_assets.cli", "backfill"],
                env=cli_env, cwd=cli_m, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
            killed: dg.DagsterRun | None = None
            while first.poll() is None:  # a machine lost: one worker killed mid-batch
                if killed is None:
                    killed = _kill_one_worker(instance)
                time.sleep(0.2)
            out1 = first.stdout.read()
            log.append(out1)
            assert killed is not None, out1
            key = killed.tags["dagster/partition"]
            assert first.returncode == 1, out1
            assert f"batch runs failed ({key})" in out1 and "keeps serving" in out1
            dead = instance.get_run_by_id(killed.run_id)
            assert dead.status == dg.DagsterRunStatus.FAILURE
            said = [e.message for e in instance.all_logs(killed.run_id) if e.message]
            assert any("Detected run worker status" in m for m in said), said[-5:]
            assert IndexStore(uri).published().table == before.table  # v1 keeps serving

            shutil.rmtree(cli_m / "work")  # the retry starts on an empty working folder
            second = subprocess.run(
                [sys.executable, "-m", "rag_assets.cli", "backfill"],
                env=env_on(cli_m, RAG_DOCUMENTS_DIR=str(root)),
                cwd=cli_m,
                capture_output=True,
                text=True,
                check=False,
            )
            log.append(second.stdout + second.stderr)
            assert second.returncode == 0, log[-1]
            assert "1 to embed" in second.stdout  # only the killed batch again

            runs = instance.get_runs(dg.RunsFilter(job_name="embedding_backfill"))
            keys = instance.get_dynamic_partitions("embedding_batches")
            assert len(keys) >= 3 and len(runs) == len(keys) + 1
            assert {r.tags[MACHINE_TAG] for r in runs} == {w.name for w in workers}
            retried = [r for r in runs if r.tags["dagster/partition"] == key]
            assert sorted(r.status.value for r in retried) == ["FAILURE", "SUCCESS"]
            records = list(instance.get_run_records(dg.RunsFilter(job_name="embedding_backfill")))
            records.sort(key=lambda r: r.start_time or 0)
            t0 = records[0].start_time
            for rec in records:
                r = rec.dagster_run
                log.append(f"{r.tags['dagster/partition']} {r.run_id[:8]} {r.status.value} "
                           f"on {r.tags[MACHINE_TAG]} start +{rec.start_time - t0:.1f}s "
                           f"end +{rec.end_time - t0:.1f}s")  # fmt: skip
            assert _overlap(records) == 2  # the queue ran them two at a time, never three
    finally:
        with suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
        print("\n".join(log))
        print(
            f"two machines, one killed, retried and published: {time.monotonic() - started:.1f} s"
        )

    # nothing went between the machines on disk: no artefact in any machine's folders
    on_disk = [
        p
        for p in machines.rglob("*")
        if p.suffix == ".parquet" or p.parent.name in ("extracted", "chunks", "backfill")
    ]
    assert not on_disk
    store = IndexStore(uri)
    pub = store.published()
    assert pub.table == single.table != before.table
    assert_same_table(IndexStore(tmp_path / "single"), single, store, pub)


def _kill_one_worker(instance: dg.DagsterInstance) -> dg.DagsterRun | None:
    """Kill (SIGKILL, the whole process group: the machine's worker and its step process) the
    first batch run whose embedding step has started; None while there is none."""
    for run in instance.get_runs(dg.RunsFilter(job_name="embedding_backfill")):
        if run.status != dg.DagsterRunStatus.STARTED or PID_TAG not in run.tags:
            continue
        step = _step_pid(instance, run.run_id)
        if step is None:
            continue
        for pid in (int(run.tags[PID_TAG]), step):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return run
    return None
