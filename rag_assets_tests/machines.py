"""A run launcher that plays a cluster's worker machines (issue 42), in the place of
``K8sRunLauncher`` in the docs' ``dagster.yaml``: each run it launches goes to the machine of
``machines`` that ran the fewest runs so far (counted in the instance's storage), and there to a
process of its own (``dagster api execute_run``, as a pod's command) with that machine's own
``DAGSTER_HOME`` and a fresh, empty ``RAG_WORK_DIR`` and working directory for the run. The
machines share nothing on disk with each other or with the daemon: only the Postgres database
(named by the ``dagster.yaml`` copied into each home) and the bucket (``RAG_INDEX_URI``,
``AWS_*``).

Each run is tagged with its machine and worker pid (``rag/machine``, ``rag/worker-pid``), so a
test can kill a machine's worker. The launcher reports a worker's health to Dagster's run
monitoring (``run_monitoring`` in ``dagster.yaml``): a worker gone while its run is still
STARTED is FAILED, and the monitoring daemon marks the run failed, as for a lost pod."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from dagster import Array, Field
from dagster._core.launcher import (
    CheckRunHealthResult,
    LaunchRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass, ConfigurableClassData, serialize_value

MACHINE_TAG = "rag/machine"
PID_TAG = "rag/worker-pid"
LOCAL_ONLY = ("DAGSTER_HOME", "RAG_WORK_DIR", "RAG_DOCUMENTS_DIR", "PWD", "OLDPWD")
"""What a worker never inherits from the daemon: its instance folder, its working folders and
the documents folder (a batch run reads the documents' artefacts from the bucket)."""


class MachineRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, machines: list[str], inst_data: ConfigurableClassData | None = None):
        self._inst_data = inst_data
        self.machines = [Path(m) for m in machines]
        self._procs: dict[str, subprocess.Popen] = {}
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"machines": Field(Array(str), description="one folder per worker machine")}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: dict[str, Any]
    ) -> MachineRunLauncher:
        return cls(list(config_value["machines"]), inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        machine = min(self.machines, key=self._launched_on)  # the one that ran the fewest
        here = machine / "runs" / run.run_id
        work = here / "work"
        work.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k not in LOCAL_ONLY}
        env.update({"DAGSTER_HOME": str(machine / "home"), "RAG_WORK_DIR": str(work)})
        args = ExecuteRunArgs(
            job_origin=run.job_code_origin,  # type: ignore[arg-type]
            run_id=run.run_id,
            instance_ref=None,  # the worker's own DAGSTER_HOME, as in a pod
            set_exit_code_on_failure=True,
        )
        cmd = [sys.executable, "-m", "dagster", "api", "execute_run", serialize_value(args)]
        with open(here / "worker.log", "wb") as log:
            proc = subprocess.Popen(
                cmd, env=env, cwd=here, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # the machine: its processes die together
            )  # fmt: skip
        self._procs[run.run_id] = proc
        self._instance.add_run_tags(run.run_id, {MACHINE_TAG: machine.name, PID_TAG: str(proc.pid)})

    def _launched_on(self, machine: Path) -> int:
        from dagster import RunsFilter

        return self._instance.get_runs_count(RunsFilter(tags={MACHINE_TAG: machine.name}))

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: Any) -> CheckRunHealthResult:
        proc = self._procs.get(run.run_id)
        if proc is None:
            pid = int(run.tags.get(PID_TAG, "0"))
            if pid and _alive(pid):
                return CheckRunHealthResult(WorkerStatus.RUNNING)
            return CheckRunHealthResult(WorkerStatus.NOT_FOUND, "no worker process")
        code = proc.poll()
        if code is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        if code == 0:
            return CheckRunHealthResult(WorkerStatus.SUCCESS)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"the worker exited with {code}")

    def terminate(self, run_id: str) -> bool:
        proc = self._procs.get(run_id)
        if proc is None or proc.poll() is not None:
            return False
        os.killpg(proc.pid, 9)
        return True


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def machine(root: Path, name: str, dagster_yaml: str) -> Path:
    """A machine's folder: its own DAGSTER_HOME (``home/dagster.yaml``) and nothing else."""
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "home").mkdir(parents=True)
    (folder / "home" / "dagster.yaml").write_text(dagster_yaml)
    return folder
