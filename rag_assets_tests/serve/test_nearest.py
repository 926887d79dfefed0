"""Issue 31 on the real thing: a real ``rag-assets serve`` over a real index (MiniLM), with a
loopback chat server (a real HTTP server recording every request) as ``RAG_LLM_URL``.

* A refusal says how close it came: ``/ask``, the MCP ``ask`` tool and ``rag-assets ask`` give
  the cut and the nearest distance; ``show_nearest`` / ``--show-nearest`` list the closest
  sources below the bar, and none of them ever reaches the chat model.
* The Markdown document view shows raw HTML blocks as their text (never markup, never run).
* ``rag-assets ask`` prints ``path:LINE`` that opens the cited line (a ``.rst`` file too).

The cut is placed between the nearest and the second-nearest candidate of one question, so that
question is answered from exactly one source while the next ones lie just below the bar.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rag_assets_tests.helpers import SAMPLE_DOCS, start_server, stop_process
from rag_assets_tests.lib.fake_llm import fake_llm

pytestmark = pytest.mark.slow

ANSWERED = "How do I roll back to the previous embedding model?"
REFUSED = "What is the boiling point of tungsten?"
ANSWER = "Point RAG_EMBEDDING_MODEL at the old model and re-index [1]."
RAW_HTML = """# tinyqueue on the web

<p align="center">
  <img src="logo.png" alt="logo" onerror="document.title='ran'">
  <b>Fast</b> and <i>small</i> queue.
</p>

<script>document.title = 'ran';</script>

Press <kbd>Ctrl</kbd>+<kbd>C</kbd> to stop the worker; queued jobs stay on disk.

<details>
<summary>Older releases</summary>

Release 0.9 stored jobs in one file.

</details>
"""
RST = """\
=========
tinyqueue
=========

A small persistent job queue for scripts that must survive a reboot.

Retries
=======

A job that raises is put back at the end of the queue at most three times before it lands in
the dead-letter folder.
"""


@dataclass
class NearestServed:
    url: str
    cut: float
    docs: Path
    index: Path
    env: dict[str, str]
    seen: list[dict[str, Any]]  # every request the chat server received


@pytest.fixture(scope="module")
def nearest_served(tmp_path_factory, real_embedder) -> Iterator[NearestServed]:
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.query.retrieve import RERANK_DEPTH, Index
    from rag_assets_tests.helpers import Served

    root = tmp_path_factory.mktemp("nearest")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    (docs / "web-readme.md").write_text(RAW_HTML, encoding="utf-8")
    (docs / "tinyqueue.rst").write_text(RST, encoding="utf-8")
    index_folder(docs, root / "index", strategy("E"), real_embedder)
    store = IndexStore(root / "index")
    index = Index(store, store.published(), real_embedder)
    d = sorted(h.cosine_distance for h in index.search(ANSWERED, "hybrid", k=RERANK_DEPTH))
    assert d[1] - d[0] > 0.004, f"no room for a cut between {d[0]} and {d[1]}"
    cut = round((d[0] + d[1]) / 2, 6)  # exactly one source passes; the next lie below the bar
    with fake_llm(lambda body: (ANSWER, None), served="fake-model") as (llm_url, seen):
        base = Served("", "", docs, root / "index", root / "work", None, root / "s.log")  # type: ignore[arg-type]
        env = base.env() | {
            "RAG_LLM_URL": llm_url,
            "RAG_LLM_MODEL": "fake-model",
            "RAG_DISTANCE_CUT": str(cut),
        }
        env.pop("RAG_API_TOKEN", None)
        url, proc = start_server(root / "index", env, root / "serve.log")
        try:
            yield NearestServed(url, cut, docs, root / "index", env, seen)
        finally:
            stop_process(proc)


def _prompt(body: dict[str, Any]) -> str:
    """Everything a chat request sends to the model, as one string."""
    return json.dumps(body["messages"], ensure_ascii=False)


def _ask(s: NearestServed, question: str, **extra: Any) -> dict[str, Any]:
    r = httpx.post(f"{s.url}/ask", json={"question": question, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_refusal_gives_the_cut_and_the_nearest_distance(nearest_served):
    s = nearest_served
    before = len(s.seen)
    out = _ask(s, REFUSED)
    assert out["no_answer"] is True and out["refused_by"] == "distance"
    assert out["threshold"] == pytest.approx(s.cut)
    nearest = out["nearest_distance"]
    assert isinstance(nearest, float) and nearest >= out["threshold"]
    assert out["near_miss"] is (nearest - out["threshold"] < 0.05)
    assert out["closeness"].startswith(f"nearest source at cosine distance {nearest:.3f}, ")
    assert out["nearest"] == [] and out["citations"] == [] and out["prompt"] == ""
    shown = _ask(s, REFUSED, show_nearest=True)
    below = shown["nearest"]
    assert len(below) == 3 and all(b["below_the_bar"] is True for b in below)
    assert [b["cosine_distance"] for b in below] == sorted(b["cosine_distance"] for b in below)
    assert below[0]["cosine_distance"] == pytest.approx(nearest, abs=1e-6)
    assert all("index" not in b and b["over_cut"] >= 0 for b in below)  # never a [n]
    assert len(s.seen) == before  # a refusal calls no model, shown sources or not


def test_sources_below_the_bar_never_reach_the_chat_model(nearest_served):
    s = nearest_served
    before = len(s.seen)
    out = _ask(s, ANSWERED, show_nearest=True)
    assert out["no_answer"] is False and out["answer"]["text"] == ANSWER
    assert len(out["citations"]) == 1 and out["citations"][0]["index"] == 1
    below = out["nearest"]
    assert len(below) == 3
    assert all(b["cosine_distance"] >= s.cut for b in below)
    assert out["nearest_distance"] == pytest.approx(out["citations"][0]["cosine_distance"])
    assert out["closeness"] == "" and out["near_miss"] is False
    requests = s.seen[before:]
    assert len(requests) == 1  # the one answer, written from the one cited source
    sent = _prompt(requests[0])
    assert json.dumps(out["citations"][0]["quote"], ensure_ascii=False)[1:-1] in sent
    for b in below:  # neither the quote nor the document of a source below the bar
        assert json.dumps(b["quote"], ensure_ascii=False)[1:-1] not in sent
        assert b["chunk_id"] not in sent
    assert out["prompt"] and all(b["quote"] not in out["prompt"] for b in below)


def test_mcp_ask_says_how_close_and_lists_below_the_bar(nearest_served):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    s = nearest_served
    before = len(s.seen)

    async def main() -> tuple[Any, Any, Any]:
        http = create_mcp_http_client()
        async with http, Client(streamable_http_client(f"{s.url}/mcp", http_client=http)) as c:
            tools = await c.list_tools()
            plain = await c.call_tool("ask", {"question": REFUSED})
            shown = await c.call_tool("ask", {"question": REFUSED, "show_nearest": True})
            return tools, plain, shown

    tools, plain, shown = anyio.run(main)
    ask = next(t for t in tools.tools if t.name == "ask")
    prop = ask.input_schema["properties"]["show_nearest"]
    assert prop["type"] == "boolean" and "below the bar" in prop["description"]
    assert "required" not in ask.input_schema or "show_nearest" not in ask.input_schema["required"]
    out = plain.structured_content
    assert out["no_answer"] is True and out["threshold"] == pytest.approx(s.cut)
    assert out["nearest_distance"] >= out["threshold"] and out["nearest"] == []
    below = shown.structured_content["nearest"]
    assert len(below) == 3 and all(b["below_the_bar"] and "index" not in b for b in below)
    assert below == _ask(s, REFUSED, show_nearest=True)["nearest"]  # same JSON as /ask
    assert len(s.seen) == before


def test_markdown_view_shows_raw_html_as_text(nearest_served):
    s = nearest_served
    page = httpx.get(f"{s.url}/documents/web-readme.md", timeout=60)
    assert page.status_code == 200
    body = page.text
    assert '<div class="html-block">Fast and small queue.</div>' in body
    assert '<div class="html-block">Older releases</div>' in body
    assert "<p>Press Ctrl+C to stop the worker; queued jobs stay on disk.</p>" in body
    main = body[body.index("<main") : body.index("</main>")]
    assert "<img" not in main and "onerror" not in main and "<script" not in main
    assert "&lt;" not in main  # no markup shown as prose
    assert "document.title" not in main  # the script's text is not shown either
    text = (s.docs / "web-readme.md").read_text(encoding="utf-8")
    a, b = text.index("small"), text.index("Release 0.9") + len("Release 0.9")
    marked = httpx.get(f"{s.url}/documents/web-readme.md", params={"char": f"{a},{b}"}).text
    marks = re.findall(r'<mark class="cite"[^>]*>([^<]*)</mark>', marked)
    assert marks[0] == "small queue." and marks[-1] == "Release 0.9"
    assert '<div class="html-block">Fast and <mark class="cite" id="cite">small' in marked


def test_cli_ask_prints_where_to_open_and_below_the_bar(nearest_served, monkeypatch, capsys):
    from rag_assets.cli import main

    s = nearest_served
    for var, value in s.env.items():
        if var.startswith("RAG_"):
            monkeypatch.setenv(var, value)
    monkeypatch.delenv("RAG_BASE_URL", raising=False)
    monkeypatch.chdir(s.docs.parent)
    before = len(s.seen)
    assert main(["ask", ANSWERED, "--show-nearest", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    http = _ask(s, ANSWERED, show_nearest=True)
    assert [b["chunk_id"] for b in out["nearest"]] == [b["chunk_id"] for b in http["nearest"]]
    sent = "".join(_prompt(b) for b in s.seen[before:])
    assert all(json.dumps(b["quote"])[1:-1] not in sent for b in out["nearest"])

    assert main(["ask", ANSWERED, "--show-nearest"]) == 0
    lines = capsys.readouterr().out.splitlines()
    blank = lines.index("")  # issue 50: the answer, its verification, then the sources
    assert lines[0].startswith(ANSWER) and lines[blank - 1].startswith("  verified: ")
    c = out["citations"][0]
    head = f"[1] {c['document_name']}  {c['locator_label']}  documents/{c['document_id']}:"
    assert lines[blank + 1].startswith(head)
    line_no = int(lines[blank + 1][len(head) :].split()[0])
    assert line_no == c["line"]
    file_line = (s.docs / c["document_id"]).read_text(encoding="utf-8").splitlines()[line_no - 1]
    assert c["span"]["text"].split("\n")[0][:25] in file_line  # the line the span starts on
    bar = lines.index(f"below the bar (the cut {s.cut:g}): not an answer, not sent to a model")
    below = [ln for ln in lines[bar + 1 :] if ln.startswith("  - ")]
    assert len(below) == 3 and not any(ln.startswith("[") for ln in lines[bar:])

    assert main(["ask", REFUSED]) == 0
    refused = capsys.readouterr().out.splitlines()
    assert refused[0].startswith("NO ANSWER: nothing under cosine distance")
    assert refused[1].startswith("  nearest source at cosine distance ")
    assert refused[1].endswith("--show-nearest lists the closest sources")

    monkeypatch.setenv("RAG_DISTANCE_CUT", "0.95")  # the .rst file, cited by its line
    assert main(["ask", "How many times is a job that raises put back?", "--json"]) == 0
    rst = next(c for c in json.loads(capsys.readouterr().out)["citations"])
    assert rst["document_id"] == "tinyqueue.rst" and rst["section"] == "Retries"
    assert RST.splitlines()[rst["line"] - 1].startswith(rst["span"]["text"][:20])
    monkeypatch.setenv("RAG_BASE_URL", f"{s.url}/documents")
    assert main(["ask", "How many times is a job that raises put back?"]) == 0
    first = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[1] "))
    link = f"{s.url}/documents/tinyqueue.rst?char={rst['span']['from']},{rst['span']['to']}"
    assert link in first
    view = httpx.get(link, timeout=60).text  # the service's view highlights that span
    assert f'<mark class="cite" id="cite">{html.escape(rst["span"]["text"])}</mark>' in view


def test_page_toggle_and_raw_html_view_in_a_browser(nearest_served, tmp_path):
    """The page in a real Chromium: the toggle lists the sources below the bar apart from the
    answer; the Markdown view shows raw HTML as text and runs none of it."""
    from urllib.parse import quote

    from rag_assets_tests.serve.test_browser import CHROMIUM_ARGS, _browser

    sync_api, exe, shots = _browser(tmp_path)
    s = nearest_served
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.goto(f"{s.url}/?q={quote(REFUSED)}")  # toggle off: the refusal, how close
            page.wait_for_selector(".no-answer", timeout=60_000)
            assert "nearest source at cosine distance" in page.locator("#state").inner_text()
            assert page.locator("#nearest").is_hidden()
            page.check("#show-nearest")
            page.press("#question", "Enter")
            page.wait_for_selector("#nearest .below-bar", timeout=60_000)
            assert "nearest=1" in page.url  # the deep link keeps the toggle
            below = page.locator("#nearest .below-bar")
            assert below.count() == 3 and page.locator("#nearest .card-n").count() == 0
            assert "over the cut" in below.first.locator(".card-dist").inner_text()
            assert page.locator("#nearest h2").inner_text() == "Below the bar: not an answer"
            assert page.locator("#sources .card").count() == 0  # nothing presented as an answer
            page.screenshot(path=str(shots / "below-the-bar.png"), full_page=True)

            page.goto(f"{s.url}/?q={quote(ANSWERED)}&nearest=1")
            page.wait_for_selector("#nearest .below-bar", timeout=60_000)
            assert page.is_checked("#show-nearest")
            assert page.locator("#sources .card").count() == 1
            assert page.locator("#sources .card-n").inner_text() == "[1]"
            assert page.locator("#nearest .below-bar").count() == 3

            page.goto(f"{s.url}/documents/web-readme.md")
            block = page.locator("div.html-block").first
            assert block.inner_text() == "Fast and small queue."
            assert page.title() != "ran"  # neither the <script> nor the onerror ran
            assert page.locator("main img, main script, main details").count() == 0
            assert "<p align" not in page.locator("main").inner_text()
            page.screenshot(path=str(shots / "raw-html-view.png"), full_page=True)
        finally:
            browser.close()
