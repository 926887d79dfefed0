"""Issue 30: a folder of many near-identical files defeats the model-free cut. A real
``rag-assets index`` run (real model, LanceDB, Dagster) on 200 printer tickets that differ only
in their number: no cut separates the corpus's own sentences (asked with their own document held
out) from unrelated questions. The run publishes with the unrelated-only cut, not the sweep's
floor that refused every question, and says so plainly in its verdict, in a non-blocking check
the UI shows, and in ``status``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rag_assets.lib.evaluate.calibrate import DEFAULT_CUTS
from rag_assets_tests.helpers import run_cli

pytestmark = pytest.mark.slow

TICKETS = 200


def _ticket(i: int) -> str:
    """Ticket ``i``: the same three sentences as every other, with its own numbers."""
    return (
        f"# Printer ticket {i}\n\nThe printer in room {100 + i} on floor three is out of toner "
        f"again since {i % 12 + 1} o'clock. Please replace the toner cartridge of printer "
        f"{i} and restart it before {i % 9 + 2} pm. The queue of printer {i} is paused until "
        "its toner cartridge is replaced.\n"
    )


def _cli(env: dict[str, str], *args: str) -> str:
    return run_cli(env, *args).stdout


def test_a_uniform_folder_publishes_a_usable_cut_and_says_it_cannot_separate(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(1, TICKETS + 1):
        (docs / f"ticket-{i:04d}.md").write_text(_ticket(i))
    env = {
        **os.environ,
        "RAG_DOCUMENTS_DIR": str(docs),
        "RAG_INDEX_URI": str(tmp_path / "index"),
        "RAG_WORK_DIR": str(tmp_path / "work"),
        "RAG_EVAL_DIR": str(tmp_path / "no-eval"),  # no question set, no model: unrelated-only
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    for var in ("RAG_RERANK_MODEL", "RAG_DISTANCE_CUT", "RAG_LLM_URL"):
        env.pop(var, None)
    summary = _cli(env, "index", "--quiet")
    lines = summary.splitlines()
    assert "check refusal_cut_separates_the_corpus: WARNING (non-blocking)" in lines, summary
    cut_line = next(ln for ln in lines if ln.startswith("refusal cut:"))
    assert "no cut separates this folder's own sentences" in cut_line
    assert "RAG_EVAL_DIR" in cut_line and "each at most" not in cut_line
    assert any(ln.startswith("published:") for ln in lines)  # published, with the warning

    report = json.loads(_cli(env, "status", "--json"))["published"]
    assert report["threshold"] > min(DEFAULT_CUTS)  # not the floor that refuses everything
    assert report["threshold_source"] == "unrelated-only"
    assert report["threshold_warning"].startswith("no cut separates")
    status = _cli(env, "status")
    assert "  WARNING: no cut separates this folder's own sentences" in status

    answer = json.loads(_cli(env, "ask", "Why is the queue of a printer paused?", "--json"))
    assert answer["no_answer"] is False and "toner" in answer["citations"][0]["quote"]
    off_topic = json.loads(_cli(env, "ask", "What is the boiling point of tungsten?", "--json"))
    assert off_topic["no_answer"] is True
