"""``rag-assets review`` under a real pseudo-terminal (issue 33): one key per verdict, a missed
verdict's document and quote typed as lines, a refused verdict re-asked, the verdicts stored."""

from __future__ import annotations

import json
import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import QueryLog
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.log import new_query_id
from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus

pytestmark = pytest.mark.slow  # a CLI process on a terminal


def _entry(question: str, decision: str, at_ns: int, docs: list[str]) -> dict:
    cits = (
        [
            {"n": i + 1, "chunk_id": f"c{i}", "document_id": d, "text": f"Paragraph {i} of it"}
            for i, d in enumerate(docs)
        ]
        if decision == "answered"
        else []
    )
    hits = [
        {"rank": 1, "chunk_id": "c0", "document_id": docs[0], "from": 0, "to": 9, "distance": 0.7}
    ]
    return {
        "id": new_query_id(),
        "at": f"2026-01-0{at_ns}T00:00:00.000Z",
        "at_ns": at_ns,
        "interface": "http/ask",
        "question": question,
        "table": "chunks_x",
        "version": 3,
        "cut": 0.6,
        "decision": decision,
        "hits": json.dumps(hits),
        "citations": json.dumps(cits),
        "latency_ms": 12.0,
    }


class Terminal:
    """The child's side of a pty: read until a text shows, type keys."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the CLI on the terminal
            os.execvpe(argv[0], argv, env)
        self.seen = ""

    def expect(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} did not show; the terminal shows:\n{self.seen}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096).decode("utf-8", "replace")
                except OSError:
                    chunk = ""
                if not chunk:
                    raise AssertionError(f"the program ended before {text!r}:\n{self.seen}")
                self.seen += chunk
        shown, self.seen = self.seen, self.seen[self.seen.index(text) + len(text) :]
        return shown

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def test_review_queue_on_a_terminal(tmp_path: Path):
    docs = _corpus(tmp_path / "docs", n=2)
    index_folder(docs, tmp_path / "index", strategy("E", 300), HashEmbedder())
    store = IndexStore(tmp_path / "index")
    text = store.canonical_texts()["doc1.md"]["text"]
    quote = text[text.index("Paragraph 2 of document 1") :][:60].rsplit(" ", 1)[0]
    log = QueryLog(store)
    e1 = _entry("oldest question", "answered", 1, ["doc0.md", "doc1.md"])
    e2 = _entry("refused question", "refused", 2, ["doc0.md"])
    e3 = _entry("answered question", "answered", 3, ["doc0.md", "doc1.md"])
    e4 = _entry("newest refused one", "refused", 4, ["doc1.md"])
    log.add_entries([e1, e2, e3, e4])
    env = dict(os.environ, RAG_INDEX_URI=str(tmp_path / "index"), RAG_QUERY_ENCODER="torch")
    term = Terminal([sys.executable, "-m", "rag_assets.cli", "review"], env)
    first = term.expect("> ")
    assert "4 unreviewed queries, newest first" in first and "newest refused one" in first
    assert "NO ANSWER; nearest: doc1.md d=0.700" in first
    term.type("s")  # not for a refused answer: refused in one line, asked again
    assert "not recorded: this query got NO ANSWER" in term.expect("> ")
    term.type("m")
    term.expect("document (its name as `status` lists it): ")
    term.type("doc1.md\n")
    term.expect("quote (exact text where the answer is): ")
    term.type(quote + "\n")
    shown = term.expect("> ")
    assert "recorded: missed" in shown and "answered question" in shown
    assert "[2] doc1.md" in shown and '"Paragraph 1 of it"' in shown
    term.type("x")
    assert "1-9 answered by that source" in term.expect("> ")
    term.type("2")  # one key: answered by source [2]
    shown = term.expect("> ")
    assert "recorded: answered" in shown and "refused question" in shown
    term.type("r")
    shown = term.expect("> ")
    assert "recorded: right_refusal" in shown and "oldest question" in shown
    term.type("q")
    end = term.expect("recorded")
    assert "1 answered, 1 missed, 1 right_refusal" in end
    assert term.wait() == 0
    reviews = QueryLog(IndexStore(tmp_path / "index")).reviews()
    assert {reviews[e["id"]]["verdict"] for e in (e2, e3, e4)} == {
        "right_refusal",
        "answered",
        "missed",
    }
    assert e1["id"] not in reviews
    assert reviews[e4["id"]]["quote"] == quote and reviews[e4["id"]]["interface"] == "review"
    assert reviews[e3["id"]]["source"] == 2 and reviews[e3["id"]]["document"] == "doc1.md"


def test_review_reads_keys_from_a_pipe_too(tmp_path: Path):
    import subprocess

    docs = _corpus(tmp_path / "docs", n=1)
    index_folder(docs, tmp_path / "index", strategy("E", 300), HashEmbedder())
    log = QueryLog(IndexStore(tmp_path / "index"))
    e = _entry("piped question", "refused", 1, ["doc0.md"])
    log.add_entries([e])
    r = subprocess.run(
        [sys.executable, "-m", "rag_assets.cli", "review", "--index", str(tmp_path / "index")],
        input="r\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "recorded: right_refusal" in r.stdout and "more answered/missed" in r.stdout
    assert QueryLog(IndexStore(tmp_path / "index")).reviews()[e["id"]]["verdict"] == "right_refusal"
