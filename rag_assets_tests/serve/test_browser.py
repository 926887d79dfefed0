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

import pytest

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


def test_page_cards_open_the_source_at_the_cited_words(served, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    exe = chromium_path()
    if exe is None:
        pytest.skip("no Chromium found: apt-get install chromium (or set RAG_CHROMIUM)")
    shots = Path(os.environ.get("RAG_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
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
            quote = first.locator(".card-quote").inner_text()
            assert page.locator("#version").inner_text().startswith("answered by chunks_")
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
            assert page.locator(".card").count() == 0
            page.screenshot(path=str(shots / "no-answer.png"))
        finally:
            browser.close()
