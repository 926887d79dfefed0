"""The real processes of the Dagster UI tests (``test_ui.py``, ``test_ui_stop.py``): the
environment they run in, waiting for a port, the processes of a session, stopping them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

CLI = [sys.executable, "-m", "rag_assets.cli"]
#: seconds allowed for the UI's processes to be gone after a stop signal: a bound, not a timing
#: assertion (rag-assets ui gives dagster dev 10 s, then ends what is left of its group)
STOP_BOUND_S = 90
#: seconds allowed for the UI to answer after it starts (a loaded CI machine: imports, workspace)
START_BOUND_S = 300


def clean_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for var in list(env):  # nothing from the caller's settings or Dagster instance
        if var.startswith("RAG_") or var == "DAGSTER_HOME":
            del env[var]
    return env | {"RAG_ADAPT": "off"} | extra  # the tests' default (conftest)


def wait_for_port(port: int, proc: subprocess.Popen, bound: float = START_BOUND_S) -> None:
    end = time.monotonic() + bound
    while time.monotonic() < end:
        assert proc.poll() is None, f"the UI exited with {proc.returncode} before serving"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"nothing answered on port {port} within {bound} s")


def session(sid: int) -> dict[int, str]:
    """The live processes of session ``sid``: pid → command line."""
    out = subprocess.run(
        ["ps", "-o", "pid=,stat=,args=", "-s", str(sid)], capture_output=True, text=True
    ).stdout
    procs = {}
    for line in out.splitlines():
        pid, stat, args = line.split(None, 2)
        if not stat.startswith("Z"):
            procs[int(pid)] = args
    return procs


def ui_services(sid: int) -> dict[str, int]:
    procs = session(sid)
    found = {}
    for pid, args in procs.items():
        if "dagster_webserver" in args:
            found["webserver"] = pid
        elif "dagster._daemon" in args:
            found["daemon"] = pid
    return found


def wait_gone(sid: int, pids: set[int], bound: float = STOP_BOUND_S) -> set[int]:
    end = time.monotonic() + bound
    while time.monotonic() < end:
        left = pids & set(session(sid))
        if not left:
            return set()
        time.sleep(0.2)
    return pids & set(session(sid))


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return dict(json.loads(resp.read()))


RUNS_QUERY = "{ runsOrError { ... on Runs { results { runId jobName status } } } }"
LOCATIONS_QUERY = "{ workspaceOrError { ... on Workspace { locationEntries { name } } } }"
LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}"""


def launch_run(port: int, job: str) -> str:
    """Launch a run of ``job`` through the UI's webserver (as its Materialize button does); its
    run id. The webserver's run launcher starts the run worker in the UI's process group."""
    entries = graphql(port, LOCATIONS_QUERY)["data"]["workspaceOrError"]["locationEntries"]
    selector = {
        "repositoryLocationName": entries[0]["name"],
        "repositoryName": "__repository__",
        "jobName": job,
    }
    out = graphql(port, LAUNCH_RUN, {"params": {"selector": selector, "runConfigData": {}}})
    launched = out["data"]["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return str(launched["run"]["runId"])


def run_status(port: int, run_id: str) -> str:
    query = "query Run($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
    return str(graphql(port, query, {"id": run_id})["data"]["runOrError"]["status"])


def as_from_a_terminal() -> None:
    """In a child before exec: the signals of a command started in a terminal, nothing ignored
    or blocked. A child inherits ignored signals across exec, and this test process may ignore
    SIGINT (a background job of a script does) and then SIGTERM too (Dagster's in-process runs
    give SIGTERM SIGINT's handler when they end); GNU make keeps an ignored signal ignored."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def stop(proc: subprocess.Popen) -> None:
    """After the test, whatever it left: every process of the session ``proc`` leads (dagster
    dev runs in a process group of its own, which a SIGKILL to ``proc``'s group would miss)."""
    for pid in session(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
