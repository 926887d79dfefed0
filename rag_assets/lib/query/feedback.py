"""Verdicts on logged queries (issue 33): what a user or a reviewer says about one answer.

``POST /feedback``, the MCP ``feedback`` tool and ``rag-assets review`` all go through
:func:`parse_feedback` and :func:`check_feedback`, which refuse bad input in one line
(:class:`FeedbackError`; :class:`UnknownQuery` for an id the log does not hold) and turn a good
verdict into the row :meth:`~rag_assets.lib.index.store.querylog.QueryLog.add_feedback` stores:

- ``answered`` + ``source`` n: citation [n] answers; its shown text becomes the question's needle;
- ``missed`` + ``document`` + ``quote``: the answer is this exact text of that document (found
  in its published text, whitespace aside; the document's own characters are stored);
- ``should_refuse``: it answered, but the corpus cannot answer this;
- ``right_refusal``: NO ANSWER was right;
- ``wrong``: it answered, none of the sources answers, and where the answer is is unknown.

A second verdict on the same query replaces the first as its review; the first stays in the
history.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rag_assets.lib.ingest.validate import text_problem
from rag_assets.lib.query.log import now, redact, valid_query_id

VERDICTS = ("answered", "missed", "should_refuse", "right_refusal", "wrong")
ANSWERABLE = ("answered", "missed")  # become answerable evaluation questions
OUT_OF_DOMAIN = ("should_refuse", "right_refusal")  # become out-of-domain questions

MIN_QUOTE_WORDS = 3
"""A ``missed`` quote is at least this many words: shorter text ("the model") is found almost
anywhere and would make any chunk "correct"."""
MAX_QUOTE_CHARS = 2000
MAX_NOTE_CHARS = 1000
FIELDS = ("query_id", "verdict", "source", "document", "quote", "note")


class FeedbackError(ValueError):
    """The feedback itself is wrong (HTTP 400); the message is one line."""


class TooManyVerdicts(FeedbackError):
    """A caller sent verdicts faster than ``RAG_FEEDBACK_PER_MINUTE`` (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnknownQuery(LookupError):
    """No such query id in the log (HTTP 404)."""


@dataclass(frozen=True)
class Feedback:
    query_id: str
    verdict: str
    source: int | None = None
    document: str | None = None
    quote: str | None = None
    note: str | None = None


def parse_feedback(body: Any) -> Feedback:
    """The feedback in a request body (a JSON object), or :class:`FeedbackError`."""
    if not isinstance(body, dict):
        raise FeedbackError(
            'send a JSON object: {"query_id": "...", "verdict": "answered", "source": 1}'
        )
    extra = sorted(set(body) - set(FIELDS))
    if extra:
        raise FeedbackError(f"unknown field {extra[0]!r}: the fields are {', '.join(FIELDS)}")
    qid = body.get("query_id")
    if not valid_query_id(qid):
        raise FeedbackError(
            "query_id is missing or malformed: give the query_id of an /ask answer (or the "
            "X-RAG-Query-Id header of /search)"
        )
    verdict = body.get("verdict")
    if verdict not in VERDICTS:
        raise FeedbackError(f"verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
    source = body.get("source")
    if source is not None and (isinstance(source, bool) or not isinstance(source, int)):
        raise FeedbackError(f"source must be a citation number such as 1, got {source!r}")
    for name in ("document", "quote", "note"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise FeedbackError(f"{name} must be a string, got {type(value).__name__}")
        problem = text_problem(value, name) if value is not None else None
        if problem:  # issue 43: the rules of a question (lone surrogates, control characters)
            raise FeedbackError(problem)
    note = body.get("note")
    if note is not None and len(note) > MAX_NOTE_CHARS:
        raise FeedbackError(f"note is {len(note)} characters; at most {MAX_NOTE_CHARS}")
    return Feedback(str(qid), verdict, source, body.get("document"), body.get("quote"), note)


def check_feedback(
    fb: Feedback,
    entry: dict[str, Any] | None,
    documents: Mapping[str, Mapping[str, Any]],
    *,
    caller: str | None = None,
    interface: str = "http",
    redacting: bool = False,
) -> dict[str, Any]:
    """The verdict row for ``fb`` on the logged ``entry`` (None: :class:`UnknownQuery`), checked
    against the published ``documents`` (id -> record with ``text``). ``caller`` is who sends
    it: a named caller may only judge its own queries (others' ids are unknown to it)."""
    if entry is None or (caller is not None and entry.get("caller") != caller):
        raise UnknownQuery(f"no query {fb.query_id} in the query log (it may have been purged)")
    decision = entry.get("decision") or ""  # "" for a search
    unused = [
        n
        for n, v in (("source", fb.source), ("document", fb.document), ("quote", fb.quote))
        if v is not None and n not in _USES[fb.verdict]
    ]
    if unused:
        raise FeedbackError(f"{fb.verdict} takes no {unused[0]}: {_HOW[fb.verdict]}")
    document = quote = None
    source = None
    if fb.verdict == "answered":
        if decision == "refused":
            raise FeedbackError(
                "this query got NO ANSWER: use right_refusal, or missed with the document and quote"
            )
        cited = {int(c["n"]): c for c in json.loads(entry.get("citations") or "[]")}
        if fb.source is None or fb.source not in cited:
            numbers = ", ".join(str(n) for n in sorted(cited)) or "none"
            raise FeedbackError(
                f"answered needs source: the number of the citation that answers (shown: {numbers})"
            )
        source = fb.source
        document, quote = cited[source]["document_id"], cited[source]["text"]
    elif fb.verdict == "missed":
        if not fb.document or not fb.quote:
            raise FeedbackError(f"missed needs document and quote: {_HOW['missed']}")
        document = resolve_document(fb.document, documents)
        quote = find_quote(fb.quote, document, str(documents[document]["text"]))
    elif fb.verdict in ("should_refuse", "wrong") and decision == "refused":
        raise FeedbackError(
            f"this query got NO ANSWER, so {fb.verdict} does not apply: use right_refusal, or "
            "missed with the document and quote"
        )
    elif fb.verdict == "right_refusal" and decision != "refused":
        raise FeedbackError(
            "this query was answered, not refused: use should_refuse (it should have been NO "
            "ANSWER) or wrong"
        )
    at, seq = now()
    note = fb.note.strip() if fb.note and fb.note.strip() else None
    return {
        "query_id": fb.query_id,
        "seq": seq,
        "at": at,
        "verdict": fb.verdict,
        "source": source,
        "document": document,
        "quote": quote,
        "note": redact(note) if note and redacting else note,
        "caller": caller,
        "interface": interface,
    }


_USES = {
    "answered": ("source",),
    "missed": ("document", "quote"),
    "should_refuse": (),
    "right_refusal": (),
    "wrong": (),
}
_HOW = {
    "answered": 'give {"verdict": "answered", "source": n}',
    "missed": 'give {"verdict": "missed", "document": "<name as status lists it>", "quote": '
    '"<exact text of it>"}',
    "should_refuse": 'give {"verdict": "should_refuse"} alone',
    "right_refusal": 'give {"verdict": "right_refusal"} alone',
    "wrong": 'give {"verdict": "wrong"} alone',
}


def resolve_document(name: str, documents: Mapping[str, Any]) -> str:
    """The document id ``name`` means: an id as ``status`` lists it, or the only id ending in
    ``/name``; else :class:`FeedbackError`."""
    name = name.strip()
    if name in documents:
        return name
    ends = sorted(d for d in documents if d.endswith("/" + name.lstrip("/")))
    if len(ends) == 1:
        return ends[0]
    if ends:
        raise FeedbackError(f"document {name!r} is ambiguous: {', '.join(ends[:3])}; give its path")
    raise FeedbackError(
        f"no document {name!r} in the published index: give its id as GET /status (or "
        "`rag-assets status`) lists it"
    )


def find_quote(quote: str, document_id: str, text: str) -> str:
    """The document's own text of ``quote`` (found exactly, or with any whitespace between its
    words), or :class:`FeedbackError`."""
    words = quote.split()
    if len(words) < MIN_QUOTE_WORDS:
        raise FeedbackError(
            f"quote has {len(words)} word(s): give at least {MIN_QUOTE_WORDS} words of the "
            "passage that answers"
        )
    if len(quote) > MAX_QUOTE_CHARS:
        raise FeedbackError(f"quote is {len(quote)} characters; at most {MAX_QUOTE_CHARS}")
    stripped = quote.strip()
    if stripped in text:
        return stripped
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words))
    found = pattern.search(text)
    if found is None:
        raise FeedbackError(
            f"quote not found in {document_id}: copy the exact text from the document (the "
            "search finds the passage)"
        )
    return found.group(0)
