"""Issue 25 through the real ``rag-assets index`` command: two runs started together on one
fresh index and one fresh Dagster home leave no duplicate ids (the second waits or refuses in
one line naming the holder) and a later run works; a run killed with ``kill -9`` while it holds
the lease does not wedge the index, and the next run's summary names the published version read
back from the pointer. The 20-round version is ``python -m rag_assets.bench.concurrent``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag_assets.bench.concurrent import _duplicates
from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.helpers import REPO, copy_docs, index_env

pytestmark = pytest.mark.slow


def _env(root: Path, **extra: str) -> dict[str, str]:
    docs = root / "docs"
    if not docs.exists():
        copy_docs(docs, "0[1-3]*.md")
    return index_env(root, docs, **extra)


def _index(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rag_assets.cli", "index", "--quiet"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_index_runs_at_once_leave_no_duplicates(tmp_path: Path):
    env = _env(tmp_path)
    procs = [_index({**env, "RAG_WORK_DIR": str(tmp_path / f"work{i}")}) for i in range(2)]
    outs = [p.communicate(timeout=1800) for p in procs]
    results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]
    codes = [r[0] for r in results]
    assert 0 in codes, results
    for code, _, err in results:
        if code:  # the loser refused in one line naming the run that held the index
            line = err.strip().splitlines()[-1]
            assert re.search(r"is being written by run \S+ \(pid \d+", line), err
    rows, dups = _duplicates(tmp_path / "index")
    assert rows > 0 and dups == 0
    again = _index(env)
    out, err = again.communicate(timeout=1800)
    assert again.returncode == 0, err  # no wedged index, no second alembic head
    assert "published:" in out


def test_kill_9_of_the_lease_holder_does_not_wedge_the_index(tmp_path: Path):
    env = _env(tmp_path, RAG_LEASE_SECONDS="3600")  # only the dead pid can free it this fast
    first = _index(env)
    store = IndexStore(tmp_path / "index")
    deadline = time.monotonic() + 900
    while not store.lease_holders():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    second = _index(env)
    out, err = second.communicate(timeout=1800)
    assert second.returncode == 0, err
    status = subprocess.run(
        [sys.executable, "-m", "rag_assets.cli", "status", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    pub = json.loads(status.stdout)["published"]
    line = next(ln for ln in out.splitlines() if ln.startswith("published:"))
    assert f"{pub['table']} version {pub['index_version']} ({pub['rows']} rows" in line  # read back
    assert json.loads(status.stdout)["writers"] == []
