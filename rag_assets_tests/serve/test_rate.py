"""The feedback rate limit across service processes (issue 43): ``RAG_FEEDBACK_PER_MINUTE`` was
counted per process, so ``serve --workers 2`` gave a token twice the limit. Two real processes
take from one limiter file, as two workers of a service do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rag_assets.lib.query.feedback import TooManyVerdicts
from rag_assets.serve.rate import VerdictLimit

TAKER = """
import sys
from rag_assets.lib.query.feedback import TooManyVerdicts
from rag_assets.serve.rate import VerdictLimit
limit = VerdictLimit(30, sys.argv[1], scope="idx")
passed = 0
for _ in range(40):
    try:
        limit.take("flood")
        passed += 1
    except TooManyVerdicts:
        pass
print(passed)
"""


def test_two_processes_share_one_tokens_bucket(tmp_path: Path):
    path = tmp_path / "work" / "feedback-limit.sqlite"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TAKER, str(path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    passed = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    # a minute's worth for both together, not each (a refill of 0.5 a second may add one)
    assert 30 <= sum(passed) <= 31, passed
    same = VerdictLimit(30, path, scope="idx")
    with pytest.raises(TooManyVerdicts) as refused:
        same.take("flood")  # a third process would be refused too
    assert refused.value.retry_after_s > 0
    VerdictLimit(30, path, scope="other index").take("flood")  # another index: its own bucket
    VerdictLimit(30, path, scope="idx").take(None)  # the administrator is not limited


def test_a_limiter_file_that_cannot_be_written_falls_back_to_the_process(tmp_path: Path):
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    said: list[str] = []
    limit = VerdictLimit(2, blocker / "feedback-limit.sqlite", warn=said.append)
    limit.take("t")
    limit.take("t")
    with pytest.raises(TooManyVerdicts):
        limit.take("t")
    assert len(said) == 1 and "counted per service process" in said[0]
