"""Issue 51 on the real thing, across processes: an index keeps its declaration, and the first
answer comes fast.

- An index built with ``RAG_ADAPT=off``; then, in processes without that setting (or with
  another one in their environment): ``status`` (a real process) says "adaptation: off, set at
  the first build on …" and reports the declared value in ``--json``; ``index`` trains nothing;
  and the code location, loaded as the UI's sensors load it, has no ``adapted_encoder`` and
  a tick of its automation conditions requests no run of it.
- ``rag-assets index`` of a new folder with adaptation on by default: the base model's table is
  published and said ("you can ask now") before the training starts; Ctrl-C during the training
  keeps that version published, exits 0 and says the training resumes with the next run or
  ``rag-assets adapt``; no run is left STARTED in the index's instance.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag_assets.defs.run import INTERRUPTED_TRAINING
from rag_assets.lib.index.adapted import is_adapted
from rag_assets.lib.index.declaration import read_declaration
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.records import index_versions
from rag_assets_tests.helpers import CLI, REPO, cli_here, copy_docs, index_env, run_cli

pytestmark = pytest.mark.slow

TICK = """
import json, os
import dagster as dg
import rag_assets.definitions as location
keys = location.defs.resolve_asset_graph().get_all_asset_keys()
with dg.DagsterInstance.from_config(os.environ["DAGSTER_HOME"]) as instance:
    tick = dg.evaluate_automation_conditions(defs=location.defs, instance=instance)
    requested = [k.to_user_string() for k in keys if tick.get_requested_partitions(k)]
print(json.dumps({"keys": sorted(k.to_user_string() for k in keys), "requested": requested}))
"""


def test_an_index_built_with_adaptation_off_stays_off_in_every_process(tmp_path):
    docs = copy_docs(tmp_path / "docs", "0[12]*.md")
    env = index_env(tmp_path, docs)
    assert env["RAG_ADAPT"] == "off"  # the tests' default (conftest): given to this build
    cli_here(env, "index", "--quiet")
    declared = read_declaration(tmp_path / "index")
    assert declared is not None and declared.entries["adapt"].value == "off"
    day = declared.first_build[:10]
    without = {k: v for k, v in env.items() if k != "RAG_ADAPT"}  # auto, by default
    # status, another process: the index's adaptation, not this shell's
    text = run_cli(without, "status").stdout
    assert f"adaptation: off, set at the first build on {day}" in text
    report = json.loads(run_cli({**env, "RAG_ADAPT": "on"}, "status", "--json").stdout)
    assert report["declaration"]["settings"]["RAG_ADAPT"]["value"] == "off"
    assert report["adaptation"]["mode"] == "off" and not report["adaptation"]["enabled"]
    # index again without the setting: nothing trained, nothing changed in the declaration
    out = cli_here(without, "index", "--quiet").stdout
    assert "adapted encoder" not in out and "declared: RAG_ADAPT" not in out
    assert f"adaptation: off, set at the first build on {day}" in out
    assert read_declaration(tmp_path / "index") == declared
    # the code location as the UI's sensors load it, without the setting or with another one
    for shell in (without, {**env, "RAG_ADAPT": "on"}):
        proc = subprocess.run(
            [sys.executable, "-c", TICK], env=shell, cwd=REPO, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        tick = json.loads(proc.stdout.strip().splitlines()[-1])
        assert "chunk_embeddings" in tick["keys"] and "adapted_encoder" not in tick["keys"]
        assert "adapted_encoder" not in tick["requested"]
        assert tick["requested"] == []  # nothing changed since the last run: no work at all


def _runbooks(folder: Path, files: int = 12) -> Path:
    """Operations runbooks, each sentence its own (the adaptation pairs need unique sentences,
    at least 150 pairs for ``RAG_ADAPT=auto`` to train: 12 files give about 175)."""
    rng = random.Random(51)
    # fmt: off
    subjects = ["The backup job", "A failed upload", "The nightly sync", "Our billing service",
                "The search cluster", "A stale cache", "The deploy script", "The mail relay"]
    verbs = ["writes", "rejects", "retries", "archives", "compresses", "encrypts", "rotates"]
    objects = ["every invoice of the last quarter", "the customer records of each region",
               "all pending payroll files", "the signed release notes", "the weekly report"]
    tails = ["before the morning shift starts", "after the finance team approves the batch",
             "unless the maintenance window is open", "within five minutes of the alert"]
    # fmt: on
    folder.mkdir(parents=True)
    for f in range(files):
        parts = []
        for p in range(4):
            said = [
                f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} "
                f"{rng.choice(tails)} (runbook {f}, step {p}.{s})."
                for s in range(5)
            ]
            parts.append(f"## Step {p}\n\n" + " ".join(said))
        (folder / f"runbook-{f:02d}.md").write_text(f"# Runbook {f}\n\n" + "\n\n".join(parts))
    return folder


def test_the_first_answer_does_not_wait_and_ctrl_c_during_training_keeps_it(tmp_path):
    docs = _runbooks(tmp_path / "docs")
    env = {k: v for k, v in index_env(tmp_path, docs, dagster=False).items() if k != "RAG_ADAPT"}
    env["RAG_EMBED_THREADS"] = "1"
    proc = subprocess.Popen(
        [*CLI, "index"], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    err: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 900
        for line in proc.stderr:  # stage lines as they happen, off a terminal
            err.append(line)
            if "index: adapt " in line and " training " in line:
                break  # the training is under way: Ctrl-C (SIGINT to the foreground group)
            assert time.monotonic() < deadline, "".join(err)
        else:
            pytest.fail("no training line:\n" + "".join(err))
        os.killpg(proc.pid, signal.SIGINT)
        out, rest = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = "".join(err) + rest
    assert proc.returncode == 0, said[-3000:] + out[-3000:]
    published = [x for x in said.splitlines() if "you can ask now" in x]
    assert published and published[0].startswith("rag-assets: published version 1: you can ask")
    assert said.index("you can ask now") < said.index(" training ")  # said before it trained
    assert out.rstrip().endswith(INTERRUPTED_TRAINING)
    store = IndexStore(tmp_path / "index")
    pub = store.published()
    assert pub is not None and not is_adapted(pub.stamps.model)  # the base model answers
    assert index_versions(store.history_records()) == {pub.key: 1}
    hits = json.loads(cli_here(env, "search", "backup job invoices", "--json").stdout)
    assert hits and hits[0]["document_id"].startswith("runbook-")
    # no run is left STARTED in the index's instance (the interrupted one failed, said so)
    import dagster as dg

    home = tmp_path / "work" / "dagster"  # the index's instance (RAG_WORK_DIR/dagster)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        states = [r.status for r in instance.get_runs()]
    assert len(states) == 2 and dg.DagsterRunStatus.STARTED not in states
    assert states.count(dg.DagsterRunStatus.SUCCESS) == 1
