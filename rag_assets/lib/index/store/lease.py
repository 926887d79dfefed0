"""One writer at a time per index: a lease kept in the LanceDB table ``_rag_lease``.

Two ``rag-assets index`` runs (CLI + CLI, CLI + the automation sensor, two Dagster runs) on one
index must never write at the same time: two concurrent ``merge_insert`` commits into an empty
table both insert, leaving every row twice (issue 25). Every writer takes this lease first.

How it works (append-only rows, LanceDB's own linear commits; local disk and object stores):

1. A writer appends a ``claim`` row (its claim id, run, pid, host, expiry). ``add`` returns the
   table version of that commit.
2. It reads the table *at that version*: exactly the rows committed up to and including its
   own. If any other claim is live there, it withdraws (appends ``release``) and waits or
   refuses; else it holds the lease. Commits are linear, so of two claims the later one always
   sees the earlier: two writers can never both win (at worst both retry).
3. While holding, a heartbeat thread appends ``renew`` rows every ``ttl / 4`` seconds; the
   holder appends ``release`` when done.

The one exception to "append-only" is the table's creation on a fresh index. Two writers that
both find no lease table both create it, and LanceDB (lance 13) does not fail the later create:
it rebases it as an *Overwrite* on top of the earlier one (measured: three processes racing on a
fresh directory, 1 round in 25 lost a claim row). So a claim made on a fresh index is written
*in* the create commit, and a creator whose create landed above version 1 knows it overwrote
someone: it reads the version just below its own, puts those rows back, and decides on them.
Its own claim is live in the overwriting commit itself, so no reader ever sees a table without
the claims that guard the index. An append that meets such an Overwrite is retried
(:func:`_append`).

A claim is live until it is released or its newest expiry passes (``kill -9`` of a holder: the
lease expires after :data:`DEFAULT_TTL_S` seconds, it never wedges the index). On the same host
and PID namespace the holder's process decides instead of the clock: a claim whose process (same
PID *and* start time, so a reused PID does not count) no longer exists is dead at once, so a
killed CLI run does not make the next one wait, and one whose process still runs stays live even
when a starved heartbeat let its expiry pass (measured: on a machine at load 18 a ``nice 15``
holder missed its renewals and a second writer got in). Expiry compares wall clocks of
different machines: keep them within a few seconds (NTP), and the TTL above the longest stall a
holder on another machine can suffer.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

LEASE_TABLE = "_rag_lease"  # claim / renew / release rows of the writer lease

DEFAULT_TTL_S = 60.0
"""Seconds a claim stays live without a renewal (RAG_LEASE_SECONDS): a holder killed with
``kill -9`` on another machine blocks writers at most this long. Renewals come every ttl/4."""

DEFAULT_WAIT_S = 0.0
"""Seconds a writer waits for a held lease before refusing (RAG_LEASE_WAIT); 0 = refuse at once
in one line naming the holder (the automation sensor retries on its next tick)."""

POLL_S = 0.5
"""Seconds between attempts while waiting for a held lease."""

LEASE_SCHEMA = pa.schema(
    [
        ("claim", pa.string()),  # random id of one claim
        ("kind", pa.string()),  # claim | renew | release
        ("seq", pa.int64()),  # time.time_ns() of the write
        ("expires_ns", pa.int64()),  # wall-clock ns after which the claim is dead (0: release)
        ("holder", pa.string()),  # JSON: run, pid, host, since (on claim rows)
    ]
)


class IndexBusy(RuntimeError):
    """Another writer holds the index's lease (the message names it)."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or claimed) the lease."""

    claim: str
    run: str
    pid: int
    host: str
    since: str
    expires_ns: int

    def describe(self) -> str:
        left = max(0.0, (self.expires_ns - time.time_ns()) / 1e9)
        return (
            f"run {self.run or '?'} (pid {self.pid} on {self.host}, since {self.since}; "
            f"its lease expires in {left:.0f} s unless renewed)"
        )


def host_id() -> str:
    """This machine and PID namespace: a PID is only meaningful within one."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return f"{socket.gethostname()}/{ns}"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    "" where unknown: with the PID it names one process, even after the PID is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19] if ")" in stat else ""


def _pid_alive(pid: int, started: str = "") -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    return not started or _start_time(pid) in ("", started)


def _open(db: Any) -> Any:
    if LEASE_TABLE in db.list_tables().tables:
        return db.open_table(LEASE_TABLE)
    try:
        return db.create_table(LEASE_TABLE, schema=LEASE_SCHEMA)
    except (ValueError, OSError, RuntimeError):
        if LEASE_TABLE not in db.list_tables().tables:  # not a create race: a real failure
            raise
        return db.open_table(LEASE_TABLE)


APPEND_TRIES = 10
"""Attempts of one lease append that meets a concurrent Overwrite (a racing create)."""


def _append(db: Any, rows: pa.Table) -> int:
    """Append ``rows`` to the lease table; the version of the commit. An Append that meets a
    concurrent Overwrite (a racing create on a fresh index, see the module docstring) is not
    merged by lance, it fails: reopen and append again. So does opening a table whose racing
    create has made its folder but not yet committed its first version ("was not found")."""
    for attempt in range(APPEND_TRIES):
        try:
            return int(db.open_table(LEASE_TABLE).add(rows).version)
        except (RuntimeError, ValueError) as exc:
            transient = "ncompatible transaction" in str(exc) or "was not found" in str(exc)
            if not transient or attempt == APPEND_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _rows_at(db: Any, version: int) -> list[dict[str, Any]]:
    snapshot = db.open_table(LEASE_TABLE)
    snapshot.checkout(version)
    return list(snapshot.to_arrow().to_pylist())


def commit_claim(db: Any, claim: pa.Table) -> list[dict[str, Any]]:
    """Commit the ``claim`` row; the rows a claimant decides on: the table exactly as of its
    claim's commit (commits are linear, so every earlier claim is in it). On a fresh index the
    claim is written by the create itself; a create that LanceDB rebased over an earlier one
    (version above 1) restores the rows it overwrote and decides on them too."""
    if LEASE_TABLE not in db.list_tables().tables:
        try:
            created = db.create_table(LEASE_TABLE, data=claim, schema=LEASE_SCHEMA)
        except (ValueError, OSError, RuntimeError):
            if LEASE_TABLE not in db.list_tables().tables:  # not a create race: a real failure
                raise
        else:
            version = int(created.version)
            if version == 1:
                return list(claim.to_pylist())
            return restore_overwritten(db, version) + list(claim.to_pylist())
    return _rows_at(db, _append(db, claim))


def restore_overwritten(db: Any, version: int) -> list[dict[str, Any]]:
    """Put back the rows that the Overwrite committed at ``version`` replaced (those of
    ``version - 1``) and return them: a rebased create wiped every claim made before it."""
    lost = _rows_at(db, version - 1)
    if lost:
        _append(db, pa.Table.from_pylist(lost, schema=LEASE_SCHEMA))
    return lost


def live_holders(rows: list[dict[str, Any]], now_ns: int | None = None) -> list[Holder]:
    """The live claims in ``rows`` (a snapshot of the table), oldest claim first."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    here = host_id()
    claims: dict[str, dict[str, Any]] = {}
    expiry: dict[str, int] = {}
    released: set[str] = set()
    for r in sorted(rows, key=lambda r: (r["seq"], r["kind"], r["claim"])):
        if r["kind"] == "claim":
            claims[r["claim"]] = json.loads(r["holder"] or "{}")
        if r["kind"] == "release":
            released.add(r["claim"])
        else:
            expiry[r["claim"]] = max(expiry.get(r["claim"], 0), int(r["expires_ns"]))
    out: list[Holder] = []
    for claim, info in claims.items():
        if claim in released:
            continue
        pid = int(info.get("pid", 0))
        if info.get("host") == here and pid:
            if not _pid_alive(pid, str(info.get("started", ""))):
                continue  # killed on this machine: dead now, not at expiry
        elif expiry.get(claim, 0) <= now_ns:
            continue
        out.append(
            Holder(
                claim,
                str(info.get("run", "")),
                pid,
                str(info.get("host", "")),
                str(info.get("since", "")),
                expiry[claim],
            )
        )
    return out


def holders(db: Any) -> list[Holder]:
    """Live holders of the lease of the index at ``db`` (a LanceDB connection); for status."""
    if LEASE_TABLE not in db.list_tables().tables:
        return []
    return live_holders(db.open_table(LEASE_TABLE).to_arrow().to_pylist())


class IndexLease:
    """The writer lease of one index (see the module docstring)."""

    def __init__(
        self,
        db: Any,
        uri: str,
        run: str = "",
        *,
        ttl_s: float = DEFAULT_TTL_S,
        wait_s: float = DEFAULT_WAIT_S,
    ):
        if ttl_s <= 0:
            raise ValueError(f"RAG_LEASE_SECONDS={ttl_s:g}: give a positive number of seconds")
        self.db, self.uri, self.run = db, uri, run
        self.ttl_s, self.wait_s = ttl_s, wait_s
        self.claim = ""
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _row(self, kind: str, expires_ns: int, holder: str = "") -> pa.Table:
        row = {
            "claim": self.claim,
            "kind": kind,
            "seq": time.time_ns(),
            "expires_ns": expires_ns,
            "holder": holder,
        }
        return pa.Table.from_pylist([row], schema=LEASE_SCHEMA)

    def try_acquire(self) -> Holder | None:
        """Take the lease: None when held now, else the live holder that keeps it."""
        self.claim = secrets.token_hex(8)
        info = {
            "run": self.run,
            "pid": os.getpid(),
            "host": host_id(),
            "started": _start_time(os.getpid()),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        expires = time.time_ns() + int(self.ttl_s * 1e9)
        seen = commit_claim(self.db, self._row("claim", expires, json.dumps(info)))
        others = [h for h in live_holders(seen) if h.claim != self.claim]
        if others:
            _append(self.db, self._row("release", 0))
            self.claim = ""
            return others[0]
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="rag-lease", daemon=True)
        self._beat.start()
        return None

    def acquire(self) -> None:
        """Take the lease, waiting up to ``wait_s``; :class:`IndexBusy` names the holder."""
        deadline = time.monotonic() + self.wait_s
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                raise IndexBusy(
                    f"index {self.uri} is being written by {holder.describe()}: wait for it to "
                    "finish, or set RAG_LEASE_WAIT=<seconds> to wait for it"
                )
            time.sleep(POLL_S)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                _append(self.db, self._row("renew", time.time_ns() + int(self.ttl_s * 1e9)))
            except Exception:  # noqa: BLE001 - retried on the next beat; expiry is the bound
                continue

    def release(self) -> None:
        if not self.claim:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        _append(self.db, self._row("release", 0))
        self.claim = ""
        self._tidy()

    def _tidy(self) -> None:
        """Drop rows of claims that are dead (released or expired) once the table grows."""
        tbl = _open(self.db)
        if tbl.count_rows() < TIDY_ROWS:
            return
        rows = tbl.to_arrow().to_pylist()
        live = {h.claim for h in live_holders(rows)}
        dead = sorted({r["claim"] for r in rows} - live)
        if dead:
            quoted = ", ".join("'" + c + "'" for c in dead)
            try:
                tbl.delete(f"claim IN ({quoted})")
            except Exception:  # noqa: BLE001 - tidying is optional
                return


TIDY_ROWS = 200
"""Rows in ``_rag_lease`` above which a release deletes the rows of dead claims."""

_held: dict[str, tuple[IndexLease, int]] = {}  # uri -> (lease, depth) held by this process
_held_lock = threading.Lock()


@contextmanager
def hold_index(
    db: Any,
    uri: str,
    run: str = "",
    *,
    ttl_s: float = DEFAULT_TTL_S,
    wait_s: float = DEFAULT_WAIT_S,
) -> Iterator[IndexLease]:
    """Hold the index's writer lease for the block; re-entrant within one process (the CLI
    holds it for the whole run, the assets inside that run take it again at no cost)."""
    key = str(uri).rstrip("/") if "://" in str(uri) else os.path.abspath(uri)
    with _held_lock:
        if key in _held:
            lease, depth = _held[key]
            _held[key] = (lease, depth + 1)
            nested = True
        else:
            nested = False
    if not nested:
        lease = IndexLease(db, key, run, ttl_s=ttl_s, wait_s=wait_s)
        lease.acquire()
        with _held_lock:
            _held[key] = (lease, 1)
    try:
        yield lease
    finally:
        with _held_lock:
            lease, depth = _held[key]
            if depth > 1:
                _held[key] = (lease, depth - 1)
            else:
                del _held[key]
        if depth == 1:
            lease.release()
