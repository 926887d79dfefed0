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
