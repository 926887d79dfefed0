"""Issue 31 and 38 on the real thing: ``make dev`` stops, with its webserver and daemon, on
Ctrl-C and on SIGTERM to make, and the UI stops when what started it is killed outright."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

from rag_assets_tests.helpers import REPO, free_port
from rag_assets_tests.ui_processes import (
    STOP_BOUND_S,
    as_from_a_terminal,
    clean_env,
    session,
    stop,
    ui_services,
    wait_for_port,
    wait_gone,
)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("make") is None or not (REPO / ".venv" / "bin" / "rag-assets").exists(),
    reason="needs make and the project's .venv (make install)",
)
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_make_dev_stops_with_its_webserver_and_daemon(tmp_path, how):
    """``make dev`` in a session of its own (as in a terminal): Ctrl-C is SIGINT to the whole
    foreground process group; SIGTERM goes to make alone, which passes it on to its recipe
    (GNU make sends SIGTERM to its running children and waits for them).

    make starts as from a terminal (:func:`_as_from_a_terminal`). In two full-tier runs on
    2026-12-03 and one on 2026-12-04 this case failed: the test process ignored SIGINT (started
    as a background job) and, after an in-process Dagster run, SIGTERM too; make inherited the
    ignored SIGTERM and never saw it (seen on 2026-12-04 in /proc: the orphaned dagster dev
    ignored both)."""
    port = free_port()
    proc = subprocess.Popen(
        ["make", "-o", ".venv/.installed", "dev", f"DEV_ARGS=--port {port}"],
        cwd=REPO, env=clean_env(RAG_INDEX_URI=str(tmp_path / "index")), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    try:
        wait_for_port(port, proc)
        services = ui_services(proc.pid)
        assert set(services) == {"webserver", "daemon"}
        assert (tmp_path / "index" / ".rag-work" / "dagster" / "dagster.yaml").is_file()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        assert wait_gone(proc.pid, set(services.values())) == set()
        proc.wait(timeout=STOP_BOUND_S)
        assert wait_gone(proc.pid, set(session(proc.pid))) == set()
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_ui_stops_when_what_started_it_is_killed_outright(tmp_path):
    """SIGKILL, which nothing can pass on, to the process that launched ``rag-assets ui`` (as a
    ``make dev`` that dies without forwarding a signal): the UI gets SIGTERM from the kernel
    (it asks for it when its parent ends) and stops its webserver and daemon."""
    port = free_port()
    ui = f"exec {shlex.quote(sys.executable)} -m rag_assets.cli ui --port {port}"
    proc = subprocess.Popen(
        ["sh", "-c", f"{ui} & wait"],  # the launcher: a shell that stays the UI's parent
        env=clean_env(RAG_INDEX_URI=str(tmp_path / "index")), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, proc)
        services = ui_services(proc.pid)
        assert set(services) == {"webserver", "daemon"}
        cli = [
            pid
            for pid, args in session(proc.pid).items()
            if "rag_assets.cli ui" in args and pid != proc.pid  # not the launching shell
        ]
        assert len(cli) == 1
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_gone(proc.pid, set(services.values())) == set()
    finally:
        stop(proc)


@pytest.mark.slow
def test_runs_a_stopped_ui_left_started_are_ended_and_marked_others_are_not(tmp_path):
    """Issue 51, the rule on a real instance (the UI itself: ``test_ui.py``): after the UI
    stopped, a run created since it started whose processes are all gone (its worker reported,
    then died with the UI) is marked CANCELED with the reason; a run another live process is
    running (a ``rag-assets index`` beside the UI) and a run older than the UI are left alone."""
    import time

    import dagster as dg
    from dagster._core.test_utils import create_run_for_test

    from rag_assets.defs.run import ensure_instance_config
    from rag_assets.defs.ui import STOPPED_UI, end_runs_left

    home = tmp_path / "dagster"
    home.mkdir()
    ensure_instance_config(home)
    started = dg.DagsterRunStatus.STARTED
    with dg.DagsterInstance.from_config(str(home)) as instance:
        older = create_run_for_test(instance, job_name="index_job", status=started)
        time.sleep(1.5)
        since = time.time()
        gone = create_run_for_test(instance, job_name="index_job", status=started)
        beside = create_run_for_test(instance, job_name="index_job", status=started)
        instance.report_dagster_event(_worker_event(beside.job_name), run_id=beside.run_id)
    worker = (  # the UI's run worker: it reports (with its pid, as a step does), then ends
        "import sys, dagster as dg\n"
        "from rag_assets_tests.test_ui_stop import _worker_event\n"
        "with dg.DagsterInstance.from_config(sys.argv[1]) as i:\n"
        "    i.report_dagster_event(_worker_event('index_job'), run_id=sys.argv[2])\n"
    )
    subprocess.run([sys.executable, "-c", worker, str(home), gone.run_id], check=True, timeout=300)
    assert end_runs_left(home, since) == [f"{gone.run_id[:8]} index_job"]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        status = {r.run_id: r.status for r in instance.get_runs()}
        assert status[gone.run_id] == dg.DagsterRunStatus.CANCELED
        assert status[beside.run_id] == status[older.run_id] == started
        said = [e.message for e in instance.all_logs(gone.run_id) if e.dagster_event]
        assert STOPPED_UI in said
    assert end_runs_left(home, since) == []  # once


def _worker_event(job: str) -> object:
    """An engine event of a run worker, carrying its process id (as the events of a step do)."""
    from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData

    return DagsterEvent(
        DagsterEventType.ENGINE_EVENT.value,
        job_name=job,
        message="run worker",
        event_specific_data=EngineEventData({}),
        pid=os.getpid(),
    )
