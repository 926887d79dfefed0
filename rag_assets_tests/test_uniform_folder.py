"""Issues 30 and 53: a folder with no question set and no model gets the day-0 cut. A real
``rag-assets index`` run (real model, LanceDB, Dagster) on 60 printer tickets that differ only
in their number (the folder issue 30 found too uniform for the old model-free cut). The cut
comes from the shipped questions about other topics: the run publishes a usable cut (not the
sweep's floor), a ticket question is answered and questions about other topics, technical ones
included, are refused; every surface that shows an answer says the cut is not yet checked
against questions close to the documents (issue 53), and so does the non-blocking check the UI
shows, the summary and ``status``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rag_assets.lib.evaluate.calibrate import DAY0_POLICY, DEFAULT_CUTS
from rag_assets.lib.query.output import DAY0_NOTE
from rag_assets_tests.helpers import Served, run_cli, start_server, stop_process

pytestmark = pytest.mark.slow

TICKETS = 60


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


def test_a_folder_without_questions_gets_the_day0_cut_and_says_it_is_unchecked(tmp_path: Path):
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
    assert "check refusal_cut_checked_on_near_questions: WARNING (non-blocking)" in lines, summary
    cut_line = next(ln for ln in lines if ln.startswith("refusal cut:"))
    assert "questions about other topics" in cut_line and "not checked against" in cut_line
    assert any(ln.startswith("published:") for ln in lines)

    report = json.loads(_cli(env, "status", "--json"))["published"]
    assert report["threshold"] > min(DEFAULT_CUTS)  # not the floor that refuses everything
    assert report["threshold_source"] == "unrelated-only" and report["threshold_warning"] == ""
    assert report["threshold_policy"] == DAY0_POLICY

    answer = json.loads(_cli(env, "ask", "Why is the queue of a printer paused?", "--json"))
    assert answer["no_answer"] is False and "toner" in answer["citations"][0]["quote"]
    assert answer["cut_note"] == DAY0_NOTE
    text = _cli(env, "ask", "Why is the queue of a printer paused?")
    assert text.rstrip().splitlines()[-1] == f"note: {DAY0_NOTE}"
    for question in (
        "What is the boiling point of tungsten?",
        "How do I undo the last git commit but keep my changes?",
        "My Kubernetes pod is stuck in CrashLoopBackOff after a deploy, how do I see why?",
    ):
        off_topic = json.loads(_cli(env, "ask", question, "--json"))
        assert off_topic["no_answer"] is True, (question, off_topic["nearest_distance"])

    # the same note where answers are read over HTTP: /ask, the MCP tool and the page
    served = Served("", "", docs, tmp_path / "index", tmp_path / "work", None, tmp_path / "s.log")  # type: ignore[arg-type]
    served.url, served.proc = start_server(served.index, env, served.log)
    try:
        _served_surfaces_say_so(served, tmp_path)
    finally:
        stop_process(served.proc)


def _served_surfaces_say_so(served: Served, tmp_path: Path) -> None:
    import anyio
    import httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    question = "Why is the queue of a printer paused?"
    body = httpx.post(f"{served.url}/ask", json={"question": question}, timeout=60).json()
    assert body["no_answer"] is False and body["cut_note"] == DAY0_NOTE
    refused = httpx.post(
        f"{served.url}/ask", json={"question": "What is the boiling point of tungsten?"}
    ).json()
    assert refused["no_answer"] is True

    async def mcp_ask() -> dict:
        async with Client(streamable_http_client(f"{served.url}/mcp")) as client:
            got = await client.call_tool("ask", {"question": question})
            return dict(got.structured_content or {})

    assert anyio.run(mcp_ask)["cut_note"] == DAY0_NOTE

    from rag_assets_tests.serve.test_browser import CHROMIUM_ARGS, _browser

    try:
        sync_api, exe, shots = _browser(tmp_path)
    except pytest.skip.Exception:
        return  # the browser part skips with its reason where no Chromium is installed
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{served.url}/?q={question.replace(' ', '+')}")
            note = page.locator("#cut-note")
            note.wait_for(state="visible", timeout=60_000)
            assert note.inner_text() == f"Note: {DAY0_NOTE}."
            assert page.locator("#sources li").count() >= 1
            page.screenshot(path=str(shots / "day0-note.png"), full_page=True)
        finally:
            browser.close()
