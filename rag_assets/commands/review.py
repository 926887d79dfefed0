"""``rag-assets review``: the terminal review queue over the query log (issue 33).

Unreviewed entries, newest first: the question, how it was answered (or refused) and at which
cut, the sources with their quotes and distances, then one key per verdict:

====  =================================================================================
1-9   answered: that source answers
m     missed: the answer is elsewhere (asks for the document and the exact quote)
s     should_refuse: it answered, but the documents cannot answer this
r     right_refusal: NO ANSWER was right
w     wrong: none of the sources answers, and where the answer is is unknown
n     next (no verdict)
q     quit
====  =================================================================================

A verdict goes through the same checks as ``POST /feedback`` (:mod:`rag_assets.lib.query.
feedback`); a refused one prints its one-line reason and asks again. On a terminal one key is
enough (cbreak mode); from a pipe, each line's first character is the key.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

from rag_assets.lib.query.feedback import (
    FeedbackError,
    UnknownQuery,
    check_feedback,
    parse_feedback,
)

KEYS = {"m": "missed", "s": "should_refuse", "r": "right_refusal", "w": "wrong"}
QUOTE_WIDTH = 110
HELP = (
    "1-9 answered by that source   m missed   s should_refuse   r right_refusal   w wrong   "
    "n next   q quit"
)


@contextlib.contextmanager
def _cbreak(stream: IO[str]) -> Iterator[bool]:
    """One key at a time on a terminal (restored on exit); False when not a terminal."""
    try:
        fd = stream.fileno()
        tty_in = stream.isatty()
    except (AttributeError, ValueError, OSError):
        tty_in = False
    if not tty_in:
        yield False
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _short(text: str, width: int = QUOTE_WIDTH) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def asker(entry: dict[str, Any]) -> str:
    """Who asked a logged query (issue 43): its token's name, or the administrator."""
    return str(entry.get("caller") or "admin")


def render(entry: dict[str, Any], i: int, n: int) -> str:
    """One entry as the queue shows it."""
    cits = json.loads(entry.get("citations") or "[]")
    hits = json.loads(entry.get("hits") or "[]")
    decision = entry.get("decision") or "search"
    cut = entry.get("cut")
    how = decision + (f" (cut {cut:.3f})" if isinstance(cut, float) else "")
    lines = [
        "",
        f"[{i}/{n}] {entry['at']}  {entry['interface']}  asked by {asker(entry)}  {how}  "
        f"{entry.get('latency_ms') or 0:.0f} ms  {entry['table']}@{entry['version']}",
        f"Q: {entry['question']}",
    ]
    for v in entry.get("untrusted") or []:  # issue 43: a group token's verdict, to confirm
        lines.append(f"  {v.get('caller')} said: {v.get('verdict')} (counts once you give it)")
    for c in cits:
        d = c.get("distance")
        dist = f"  d={d:.3f}" if isinstance(d, float) else ""
        lines.append(f"  [{c['n']}] {c.get('document_id')}  {c.get('locator') or ''}{dist}")
        lines.append(f'      "{_short(c.get("text") or "")}"')
    if not cits:
        near = ", ".join(
            f"{h['document_id']} d={h['distance']:.3f}"
            for h in hits[:3]
            if isinstance(h.get("distance"), float)
        )
        lines.append(f"  NO ANSWER; nearest: {near or 'nothing'}")
    lines.append(HELP)
    return "\n".join(lines)


def run_review(
    log: Any,
    documents: dict[str, dict[str, Any]],
    *,
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
    limit: int = 0,
    redacting: bool = False,
) -> dict[str, int]:
    """The queue over ``log``'s unreviewed entries (newest first; at most ``limit``, 0 = all),
    verdicts checked against ``documents`` (the published texts). Returns counts per verdict."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    reviews = log.reviews(trusted=True)  # issue 43: a group token's verdict waits here
    untrusted: dict[str, list[dict[str, Any]]] = {}
    for f in log.feedback():
        if f.get("caller") is not None:
            untrusted.setdefault(f["query_id"], []).append(f)
    queue = [
        e | {"untrusted": untrusted.get(e["id"], [])}
        for e in reversed(log.entries())
        if e["id"] not in reviews
    ]
    if limit:
        queue = queue[:limit]
    done: dict[str, int] = {}
    if not queue:
        print("nothing to review: every logged query has a verdict", file=stdout)
        return done
    print(f"{len(queue)} unreviewed queries, newest first", file=stdout)
    with _cbreak(stdin) as keys:
        read_key = _key_reader(stdin, stdout, keys)
        for i, entry in enumerate(queue, start=1):
            print(render(entry, i, len(queue)), file=stdout, flush=True)
            while True:
                stdout.write("> ")
                stdout.flush()
                key = read_key()
                if key is None or key == "q":
                    print("", file=stdout)
                    return done
                if key in ("n", "\n", " "):
                    print("skipped", file=stdout)
                    break
                body: dict[str, Any] = {"query_id": entry["id"]}
                if key.isdigit():
                    body |= {"verdict": "answered", "source": int(key)}
                elif key in KEYS:
                    body["verdict"] = KEYS[key]
                else:
                    print(f"{key!r}: {HELP}", file=stdout)
                    continue
                if body["verdict"] == "missed":
                    document = _line("document (its name as `status` lists it): ", stdin, stdout)
                    quote = _line("quote (exact text where the answer is): ", stdin, stdout)
                    if not document or not quote:
                        print("missed: cancelled", file=stdout)
                        continue
                    body |= {"document": document, "quote": quote}
                try:
                    row = check_feedback(
                        parse_feedback(body),
                        entry,
                        documents,
                        interface="review",
                        redacting=redacting,
                    )
                except (FeedbackError, UnknownQuery) as exc:
                    print(f"not recorded: {exc}", file=stdout)
                    continue
                log.add_feedback(row)
                done[row["verdict"]] = done.get(row["verdict"], 0) + 1
                print(f"recorded: {row['verdict']}", file=stdout, flush=True)
                break
    return done


def _key_reader(stdin: IO[str], stdout: IO[str], keys: bool) -> Callable[[], str | None]:
    def read() -> str | None:
        if keys:
            ch = stdin.read(1)
            if ch:  # cbreak does not echo
                print(ch if ch.isprintable() else "", file=stdout, flush=True)
            return ch.lower() if ch else None
        line = stdin.readline()
        if not line:
            return None
        return (line.strip()[:1] or "n").lower()

    return read


def _line(prompt: str, stdin: IO[str], stdout: IO[str]) -> str:
    """A whole line of input (the terminal back in line mode for it)."""
    stdout.write(prompt)
    stdout.flush()
    try:
        import termios

        fd = stdin.fileno()
        if stdin.isatty():
            saved = termios.tcgetattr(fd)
            mode = termios.tcgetattr(fd)
            mode[3] |= termios.ICANON | termios.ECHO
            termios.tcsetattr(fd, termios.TCSANOW, mode)
            try:
                return stdin.readline().strip()
            finally:
                termios.tcsetattr(fd, termios.TCSANOW, saved)
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    return stdin.readline().strip()
