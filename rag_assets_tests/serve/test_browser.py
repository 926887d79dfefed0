"""A real Chromium (Playwright) through the page: ask, see the cards, open one, see the words.

Uses a system Chromium through ``executable_path`` (``RAG_CHROMIUM``, else ``chromium`` /
``chromium-browser`` / ``google-chrome`` on PATH); skipped with the reason when none is found or
Playwright is not installed. Screenshots go to ``RAG_SCREENSHOT_DIR`` when set.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from rag_assets_tests.helpers import stop_process

pytestmark = pytest.mark.slow

QUESTION = "How do I roll back to the previous embedding model?"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--no-first-run",
    "--no-default-browser-check",
]


def _words(text: str) -> str:
    """Text without Markdown punctuation or line breaks (rendering drops the syntax)."""
    return " ".join(re.sub(r"[`*_#>|-]+", " ", text).split())


def chromium_path() -> str | None:
    if os.environ.get("RAG_CHROMIUM"):
        return os.environ["RAG_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _browser(tmp_path: Path) -> tuple[Any, str, Path]:
    """Playwright, the system Chromium and the screenshot folder, or a skip naming what is
    missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    exe = chromium_path()
    if exe is None:
        pytest.skip("no Chromium found: apt-get install chromium (or set RAG_CHROMIUM)")
    shots = Path(os.environ.get("RAG_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    return sync_api, exe, shots


def test_page_cards_open_the_source_at_the_cited_words(served, tmp_path):
    sync_api, exe, shots = _browser(tmp_path)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                extra_http_headers=served.auth, viewport={"width": 1100, "height": 800}
            )
            page = context.new_page()
            page.goto(served.url + "/")
            page.fill("#question", QUESTION)
            page.press("#question", "Enter")
            page.wait_for_selector(".card", timeout=60_000)
            cards = page.locator(".card")
            assert cards.count() >= 1
            first = cards.nth(0)
            assert first.locator(".card-n").inner_text() == "[1]"
            assert first.locator(".card-dist").inner_text().startswith("d=0.")
            quote = first.locator(".card-span").inner_text()  # issue 21: the span is marked
            shown = page.locator("#version").inner_text()  # issue 51: the index's own version
            assert shown.startswith("answered by version ") and "(chunks_" in shown
            page.screenshot(path=str(shots / "answer.png"), full_page=True)

            first.locator("a").click()
            page.wait_for_url("**/documents/**?char=*", timeout=30_000)
            mark = page.locator("mark#cite")
            mark.wait_for(state="visible", timeout=30_000)
            box = mark.bounding_box()
            assert box is not None and 0 <= box["y"] < 800  # scrolled into the viewport
            marked = " ".join(page.locator("mark.cite").all_inner_texts())
            assert _words(quote)[:40] in _words(marked)  # the card's quote is what is marked
            background = mark.evaluate("e => getComputedStyle(e).backgroundColor")
            assert background not in ("rgba(0, 0, 0, 0)", "transparent")
            page.screenshot(path=str(shots / "source.png"))

            page.goto(served.url + "/")
            page.fill("#question", "What is the boiling point of tungsten?")
            page.press("#question", "Enter")
            page.wait_for_selector(".no-answer", timeout=60_000)
            assert (
                page.locator(".no-answer")
                .inner_text()
                .startswith("NO ANSWER: nothing under cosine distance")
            )
            assert "distance gate (RAG_DISTANCE_CUT)" in page.locator("#state").inner_text()
            assert page.locator(".card").count() == 0
            page.screenshot(path=str(shots / "no-answer.png"))
        finally:
            browser.close()


# ---------------------------------------------------------------- issue 21: every locator kind

FORMAT_QUESTIONS = [  # (kind, document, question asked through the page's ?q= deep link)
    ("markdown", "faq.md", "How much is a ticket for adults at the museum?"),
    ("csv", "prices.csv", "What is the price of the copper kettle?"),
    ("vtt", "lecture.vtt", "How much does the walrus index add to the storage bill?"),
    ("html", "garden.html", "How many hours of direct sun do tomatoes need?"),
    ("pdf", "report.pdf", "How many unlabelled cable drums were found in warehouse 4?"),
    ("docx", "handbook.docx", "When does a new hire receive a laptop from the IT desk?"),
]
FAQ = (
    "# Museum FAQ\n\nThe museum opens at nine on weekdays and at ten on Sundays. "
    "Tickets cost twelve euros for adults and are free for children under six. "
    "Every gallery has step-free access and lifts.\n"
)


@pytest.fixture(scope="module")
def formats_served(tmp_path_factory, real_embedder):
    """A second real server over one small file of every kind (a transcript with its media)."""

    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets_tests.helpers import start_server
    from rag_assets_tests.lib import format_files as ff

    root = tmp_path_factory.mktemp("formats-served")
    docs = root / "documents"
    docs.mkdir()
    (docs / "faq.md").write_text(FAQ, encoding="utf-8")
    for write in (ff.write_vtt, ff.write_csv, ff.write_html, ff.write_docx, ff.write_report_pdf):
        write(docs)
    index_folder(docs, root / "index", strategy("E"), real_embedder)
    env = dict(os.environ)
    env.update(RAG_WORK_DIR=str(root / "work"), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for var in ("RAG_BASE_URL", "RAG_LLM_URL", "RAG_RERANK_MODEL", "RAG_API_TOKEN"):
        env.pop(var, None)
    env["RAG_DISTANCE_CUT"] = "0.95"  # these tests are about the views, not the gate
    url, proc = start_server(root / "index", env, root / "serve.log")
    try:
        yield url
    finally:
        stop_process(proc)


def test_document_views_highlight_every_locator_kind(formats_served, tmp_path):
    """Ask through ``/?q=``, open the card of each kind's document, see its span highlighted
    in the view of its kind; one screenshot per kind (the path is printed)."""
    import httpx

    sync_api, exe, shots = _browser(tmp_path)
    print(f"screenshots of every locator kind in {shots}")
    from urllib.parse import quote as q

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            for kind, name, question in FORMAT_QUESTIONS:
                page.goto(f"{formats_served}/?q={q(question)}")
                assert page.input_value("#question") == question  # the deep link fills it
                page.wait_for_selector(".card", timeout=60_000)
                card = page.locator(".card", has=page.locator(".card-doc", has_text=name))
                assert card.count() >= 1, f"{name} not cited for {question!r}"
                span_text = card.first.locator(".card-span").inner_text()
                span_where = card.first.locator(".card-span-where").inner_text()
                card.first.locator("a.card-link").click()
                page.wait_for_url("**/documents/**?char=*", timeout=30_000)
                assert page.locator(".span-info").inner_text() == span_where
                if kind == "csv":
                    row = page.locator("table.sheet tr.cite")
                    assert row.count() == 1 and "copper kettle" in row.inner_text()
                    assert span_where == "prices!A4:C4"
                    target = row.locator("td").first
                elif kind == "vtt":
                    cue = page.locator("li.cue.cite")
                    assert cue.count() == 1 and _words(span_text) in _words(cue.inner_text())
                    assert "2:15.0" in cue.locator(".cue-time").inner_text()
                    video = page.locator("video.media")
                    src = video.get_attribute("src") or ""
                    assert src.endswith("/documents/lecture.mp4#t=135,158.9")
                    media_src = page.evaluate("v => v.src", video.element_handle())
                    media = httpx.get(media_src.split("#")[0], timeout=30)  # served beside it
                    assert media.status_code == 200 and media.content.startswith(b"\x00\x00")
                    target = cue
                elif kind == "pdf":
                    frame = page.locator("iframe.pdf")
                    m = re.search(
                        r"/documents/report\.pdf#page=(\d+)$", frame.get_attribute("src") or ""
                    )
                    assert m and span_where.startswith(f"p. {m.group(1)}, chars ")
                    target = page.locator(".pdf-span mark#cite")
                    assert _words(target.inner_text()) == _words(span_text)
                else:  # markdown, html, docx: the span's words are marked and scrolled to
                    target = page.locator("mark#cite")
                    marked = " ".join(page.locator("mark.cite").all_inner_texts())
                    assert _words(marked) == _words(span_text)
                    assert span_where.startswith("chars ")
                target.wait_for(state="visible", timeout=30_000)
                box = target.bounding_box()
                assert box is not None and 0 <= box["y"] < 800
                background = target.evaluate("e => getComputedStyle(e).backgroundColor")
                assert background not in ("rgba(0, 0, 0, 0)", "transparent")
                page.screenshot(path=str(shots / f"view-{kind}.png"), full_page=True)
            assert sorted(p.name for p in shots.glob("view-*.png")) == sorted(
                f"view-{k}.png" for k, _, _ in FORMAT_QUESTIONS
            )
        finally:
            browser.close()


# ---------------------------------------------------------------- issue 33: verdicts on the page


def _status(page: Any, text: str) -> None:
    """Wait until the feedback line says ``text`` (it appears once a verdict was answered)."""
    page.wait_for_function(
        "t => ((document.querySelector('.fb-status') || {}).textContent || '').includes(t)",
        arg=text,
        timeout=60_000,
    )


def test_page_verdicts_reach_the_query_log(served, tmp_path):
    """Under an answer: "[1] answers it", then "Should be NO ANSWER" replacing it; under a
    refusal: "The documents do answer this…", the passage found with the page's own search and
    sent as the quote. Each verdict is in the log afterwards, through the browser's requests."""
    sync_api, exe, shots = _browser(tmp_path)
    refused = "What is the boiling point of tungsten?"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                extra_http_headers=served.auth, viewport={"width": 1100, "height": 900}
            )
            page = context.new_page()
            page.goto(served.url + "/")
            page.fill("#question", QUESTION)
            page.press("#question", "Enter")
            page.wait_for_selector(".card .fb-button", timeout=60_000)
            page.locator(".card").nth(0).locator(".fb-button").click()
            status = page.locator(".fb-status")
            status.wait_for(timeout=30_000)
            _status(page, "recorded")
            assert status.inner_text().startswith("recorded: answered [1]")
            page.get_by_role("button", name="Should be NO ANSWER").click()
            _status(page, "replaces answered")
            page.screenshot(path=str(shots / "verdicts.png"), full_page=True)

            page.fill("#question", refused)
            page.press("#question", "Enter")
            page.wait_for_selector(".no-answer", timeout=60_000)
            page.get_by_role("button", name="The documents do answer this…").click()
            page.fill(".fb-query", "roll back to the previous embedding model")
            page.locator(".fb-find button").click()
            page.wait_for_selector(".fb-hit", timeout=60_000)
            page.locator(".fb-use").nth(0).click()
            quote = page.locator(".fb-quote").input_value()
            assert len(quote.split()) >= 3
            page.locator(".fb-send").click()
            _status(page, "recorded: missed")
            page.screenshot(path=str(shots / "missed.png"), full_page=True)
        finally:
            browser.close()
    with served.client() as c:
        entries = c.get("/log", params={"limit": 100}).json()
    mine = [e for e in entries if e["question"] == QUESTION and e["history"]]
    # issue 43: one verdict per (query, caller): the second replaced the first
    assert any([h["verdict"] for h in e["history"]] == ["should_refuse"] for e in mine)
    # and the page's own search for the passage is not a question: not logged
    assert not any(e["question"] == "roll back to the previous embedding model" for e in entries)
    missed = [e for e in entries if e["question"] == refused and e["review"] == "missed"]
    assert missed and " ".join(missed[0]["history"][-1]["quote"].split()) == " ".join(quote.split())


# ---------------------------------------------------------------- issue 50: a verified answer
WRONG = "The rollback takes 99 days and costs 42 euros in licence fees."


@pytest.fixture(scope="module")
def verifying(served, tmp_path_factory) -> Any:
    """A second real server on the shared index, its model a loopback chat server that answers
    with source [1]'s longest sentence (supported) and one sentence no source states."""
    from rag_assets_tests.helpers import start_server
    from rag_assets_tests.lib.fake_llm import fake_llm, user_text
    from rag_assets_tests.test_verify_cli import _first_sentence

    root = tmp_path_factory.mktemp("verifying")

    def answer(body: dict[str, Any]) -> tuple[str, None]:
        return f"{_first_sentence(user_text(body))} [1] {WRONG} [1]", None

    with fake_llm(answer, served="fake-model") as (url, _):
        env = served.env() | {
            "RAG_LLM_URL": url,
            "RAG_LLM_MODEL": "fake-model",
            "RAG_ANSWER_VERIFY": "flag",
            "RAG_QUERY_LOG": "off",
            "RAG_WORK_DIR": str(root / "work"),
        }
        env.pop("RAG_API_TOKEN", None)
        base, proc = start_server(served.index, env, root / "serve.log")
        try:
            yield base
        finally:
            stop_process(proc)


def test_page_flags_an_unsupported_sentence_with_its_reason(verifying, tmp_path):
    """The answer the model wrote, sentence by sentence: the one its source states is shown
    plain, the one it does not is flagged with the verifier's reason (as /ask gives it)."""
    import httpx

    sync_api, exe, shots = _browser(tmp_path)
    want = httpx.post(f"{verifying}/ask", json={"question": QUESTION}, timeout=120).json()
    verdicts = [s["verdict"] for s in want["sentences"]]
    assert verdicts == ["supported", "unsupported"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.goto(verifying + "/")
            page.fill("#question", QUESTION)
            page.press("#question", "Enter")
            page.wait_for_selector("#answer .sentence", timeout=60_000)
            shown = page.locator("#answer .sentence")
            assert shown.count() == 2
            assert shown.nth(0).get_attribute("data-verdict") == "supported"
            flagged = page.locator("#answer .sentence.unsupported")
            assert flagged.count() == 1 and WRONG in flagged.inner_text()
            reason = page.locator("#answer .verdict-flag").inner_text()
            assert reason == f"unsupported: {want['sentences'][1]['reason']}"
            background = flagged.evaluate("e => getComputedStyle(e).backgroundColor")
            assert background not in ("rgba(0, 0, 0, 0)", "transparent")
            line = page.locator("#answer .verified").inner_text()
            assert line == "1 of 2 sentence(s) supported by their sources"
            page.screenshot(path=str(shots / "verified-answer.png"), full_page=True)
        finally:
            browser.close()
