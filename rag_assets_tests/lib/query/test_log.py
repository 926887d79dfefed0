"""Log entries and the background writer (issue 33): ids, redaction, batching, a failing store
reported once while queries go on, flushing on close."""

from __future__ import annotations

import re
import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from rag_assets.lib.query.log import (
    ID_PATTERN,
    LogWriter,
    new_query_id,
    redact,
    valid_query_id,
)


def test_query_ids_are_random_and_well_formed():
    ids = {new_query_id() for _ in range(2000)}
    assert len(ids) == 2000  # 128 random bits: no repeats
    assert all(ID_PATTERN.fullmatch(i) for i in ids)
    assert not valid_query_id("abc") and not valid_query_id("' OR 1=1 --xxxxxxxxxxxx")
    assert not valid_query_id(None) and not valid_query_id(12)


def test_redaction_masks_emails_and_long_numbers_only():
    text = (
        "Mail jane.doe+rag@example.co.uk or call +44 20 7946 0958; card 4111-1111-1111-1111, "
        "account 12345678. Dagster 1.13.27 and port 8000 in 2026 stay."
    )
    out = redact(text)
    assert "jane" not in out and "example" not in out and "[email]" in out
    assert "7946" not in out and "4111" not in out and "12345678" not in out
    assert out.count("[number]") == 3
    assert "1.13.27" in out and "8000" in out and "2026" in out


def test_redaction_masks_unicode_emails_full_width_at_and_dotted_cards():
    """Issue 43: these were stored unmasked with RAG_QUERY_LOG_REDACT=on."""
    out = redact("jöe@exämple.de, joe\uff20example.com, 4111.1111.1111.1111 on 2026.01.15 v1.13.27")
    assert out == "[email], [email], [number] on 2026.01.15 v1.13.27"


@given(st.text(alphabet="abc xyz.-+@0123456789", max_size=80))
def test_redaction_leaves_no_run_of_seven_digits(text):
    out = redact(text)
    assert re.search(r"\d(?:[ -]?\d){6,}", out) is None  # single spaces/hyphens between
    assert redact(out) == out  # idempotent


class FakeLog:
    uri = "memory://log"

    def __init__(self, fail: int = 0):
        self.batches: list[list[dict]] = []
        self.fail = fail  # the first `fail` writes raise
        self.calls = 0

    def add_entries(self, rows):
        self.calls += 1
        if self.calls <= self.fail:
            raise OSError("bucket unreachable")
        self.batches.append(list(rows))


def test_entries_are_written_in_batches_off_the_caller_thread():
    log = FakeLog()
    writer = LogWriter(log, flush_rows=10, flush_s=0.2)
    callers = {threading.get_ident()}
    original = log.add_entries

    def record(rows):
        callers.add(threading.get_ident())
        original(rows)

    log.add_entries = record  # type: ignore[method-assign]
    for i in range(25):
        writer.submit({"id": str(i)})
    assert writer.flush(10)
    writer.close()
    written = [r["id"] for b in log.batches for r in b]
    assert written == [str(i) for i in range(25)]
    assert len(log.batches) < 25 and len(callers) == 2  # batches, from one other thread
    assert writer.stats()["written"] == 25 and writer.stats()["dropped"] == 0


def test_a_failing_store_is_reported_once_and_submit_never_raises():
    warnings: list[str] = []
    log = FakeLog(fail=3)
    writer = LogWriter(log, warn=warnings.append, where="s3://bucket/idx", flush_s=0.05)
    for i in range(3):
        writer.submit({"id": f"a{i}"})
        writer.flush(5)
    assert len(warnings) == 1 and "s3://bucket/idx" in warnings[0]
    assert "bucket unreachable" in warnings[0] and "queries still answer" in warnings[0]
    writer.submit({"id": "b"})
    writer.flush(5)  # the store is back: the pending batch and this one are written
    writer.close()
    written = {r["id"] for b in log.batches for r in b}
    assert "b" in written and writer.stats()["last_error"] is None
    assert writer.stats()["written"] + writer.stats()["dropped"] == 4


def test_close_writes_what_is_queued_and_later_entries_are_counted_not_written():
    log = FakeLog()
    writer = LogWriter(log, flush_rows=1000, flush_s=60)  # nothing would flush by itself
    for i in range(5):
        writer.submit({"id": str(i)})
    t = time.monotonic()
    writer.close(timeout=10)
    assert time.monotonic() - t < 10 and sum(len(b) for b in log.batches) == 5
    writer.submit({"id": "late"})
    assert writer.stats()["dropped"] == 1


def test_maintenance_runs_in_the_writer_thread_and_its_failure_is_one_line():
    ran: list[int] = []
    warnings: list[str] = []

    def maintain():
        ran.append(threading.get_ident())
        raise RuntimeError("commit conflict")

    writer = LogWriter(
        FakeLog(), maintain=maintain, maintain_first_s=0, flush_s=0.05, warn=warnings.append
    )
    writer.submit({"id": "x"})
    writer.flush(5)
    writer.close()
    assert ran and ran[0] != threading.get_ident()
    assert warnings and "commit conflict" in warnings[0]
