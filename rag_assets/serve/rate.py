"""The feedback rate limit (issue 43): ``RAG_FEEDBACK_PER_MINUTE`` verdicts a minute per group
token, held across the worker processes of one service on one machine.

Each token has a bucket that holds a minute's worth: a user's burst passes, a loop is refused
(HTTP 429 with ``Retry-After``) until the bucket refills. The buckets live in a small SQLite
file in the index's working folder (``<index>/.rag-work/feedback-limit.sqlite`` for a local
index, ``RAG_WORK_DIR`` when set, ``~/.cache/rag-assets/work/…`` for an object-store index):
every ``serve --workers`` process of the machine takes from the same bucket, each take one
short ``BEGIN IMMEDIATE`` transaction. Services on different machines (an object-store index
served from several hosts) each have their own file, so there a token gets the limit once per
machine. When the file cannot be written (a read-only folder), the limit is kept per process
and that is said once.
"""

from __future__ import annotations

import math
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rag_assets.lib.query.feedback import TooManyVerdicts

LIMIT_FILE = "feedback-limit.sqlite"
"""The buckets' file in the working folder."""


def refill(tokens: float, at: float, now: float, per_minute: int) -> float:
    """A bucket's tokens at ``now``: what it held at ``at`` plus the refill, at most full."""
    return min(float(per_minute), tokens + max(0.0, now - at) * per_minute / 60.0)


class VerdictLimit:
    """At most ``per_minute`` verdicts a minute from one group token (by name). ``path``: the
    SQLite file shared by the service's processes (None: this process only); ``scope`` tells
    apart the indexes that share a working folder. The administrator (``caller`` None), whose
    verdicts are the trusted ones, is not limited."""

    def __init__(
        self,
        per_minute: int,
        path: Path | str | None = None,
        *,
        scope: str = "",
        warn: Callable[[str], None] | None = None,
    ):
        self.per_minute = per_minute
        self.path = Path(path) if path is not None else None
        self.scope = scope
        self._warn = warn or (lambda m: print(f"rag-assets: warning: {m}", file=sys.stderr))
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (tokens, at), per process
        self._lock = threading.Lock()

    def take(self, caller: str | None) -> None:
        """One verdict of ``caller``; :class:`TooManyVerdicts` when its bucket is empty."""
        if self.per_minute <= 0 or caller is None:
            return
        wait = self._take_shared(caller) if self.path is not None else None
        if wait is None:
            wait = self._take_local(caller)
        if wait > 0:
            raise TooManyVerdicts(
                f"too many verdicts: at most RAG_FEEDBACK_PER_MINUTE={self.per_minute} a "
                f"minute per token; try again in {math.ceil(wait)} s",
                wait,
            )

    def _spend(self, tokens: float) -> tuple[float, float]:
        """(tokens left, seconds to wait: 0 when one was taken)."""
        if tokens < 1.0:
            return tokens, (1.0 - tokens) * 60.0 / self.per_minute
        return tokens - 1.0, 0.0

    def _take_local(self, caller: str) -> float:
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(caller, (float(self.per_minute), now))
            left, wait = self._spend(refill(tokens, at, now, self.per_minute))
            self._buckets[caller] = (left, now)
        return wait

    def _take_shared(self, caller: str) -> float | None:
        """The take in the shared file; None when the file cannot be used (said once)."""
        assert self.path is not None
        key = f"{self.scope}\t{caller}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            con = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            try:
                con.execute(
                    "CREATE TABLE IF NOT EXISTS buckets (caller TEXT PRIMARY KEY, tokens REAL, "
                    "at REAL)"
                )
                con.execute("BEGIN IMMEDIATE")  # the buckets' lock, across processes
                now = time.time()
                row = con.execute("SELECT tokens, at FROM buckets WHERE caller = ?", (key,))
                found = row.fetchone()
                tokens, at = found if found else (float(self.per_minute), now)
                left, wait = self._spend(refill(float(tokens), float(at), now, self.per_minute))
                con.execute(
                    "INSERT OR REPLACE INTO buckets (caller, tokens, at) VALUES (?, ?, ?)",
                    (key, left, now),
                )
                con.execute("COMMIT")
            finally:
                con.close()
        except (sqlite3.Error, OSError) as exc:
            where, self.path = self.path, None
            self._warn(
                f"feedback limit: {where} cannot be used ({' '.join(str(exc).split())[:120]}); "
                "RAG_FEEDBACK_PER_MINUTE is counted per service process from now on"
            )
            return None
        return wait
