"""Issue 25 #11: a document id with a newline (``%0A`` in its citation URL) reaches the
document route, and a question with a lone surrogate is a one-line usage error on the CLI."""

from __future__ import annotations

import subprocess
import sys

from starlette.routing import Match, Route

import rag_assets.serve.app  # noqa: F401  (registers the "docpath" convertor)
from rag_assets_tests.helpers import REPO


def _scope(path: str) -> dict:
    return {"type": "http", "path": path, "method": "GET", "root_path": ""}


def test_the_document_route_matches_ids_with_newlines_and_slashes():
    route = Route("/documents/{document_id:docpath}", endpoint=lambda r: None)
    for doc_id in ("notes\nweek 1.md", "sub/dir/a.md", "plain.md"):
        match, child = route.matches(_scope(f"/documents/{doc_id}"))
        assert match is Match.FULL and child["path_params"]["document_id"] == doc_id
    # the default converter, which the route used before, stops at the newline
    plain = Route("/documents/{document_id:path}", endpoint=lambda r: None)
    assert plain.matches(_scope("/documents/notes\nweek 1.md"))[0] is Match.NONE


def test_a_question_that_is_not_text_is_a_one_line_usage_error():
    # bytes that are not UTF-8 arrive in sys.argv as lone surrogates (surrogateescape)
    proc = subprocess.run(
        [sys.executable, "-m", "rag_assets.cli", "ask", b"caf\xe9 opening hours"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "the question" in lines[-1]
    usage = [ln for ln in lines if not ln.startswith(" ")]  # argparse wraps a long usage
    assert all("error" in ln or ln.startswith("usage:") for ln in usage), proc.stderr
