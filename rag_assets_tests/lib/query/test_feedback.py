"""Verdicts checked before they are stored (issue 33): every verdict, every bad input, one line."""

from __future__ import annotations

import json

import pytest

from rag_assets.lib.query.feedback import (
    FeedbackError,
    UnknownQuery,
    check_feedback,
    find_quote,
    parse_feedback,
    resolve_document,
)
from rag_assets.lib.query.log import new_query_id

DOCS = {
    "guide/rollback.md": {
        "text": "To roll back, run the\n  rollback command. It publishes the previous version."
    },
    "guide/index.md": {"text": "Start here."},
    "other/index.md": {"text": "Another index."},
}
QID = new_query_id()


def answered_entry(caller=None):
    cits = [
        {"n": 1, "chunk_id": "c1", "document_id": "guide/index.md", "text": "Start here."},
        {
            "n": 2,
            "chunk_id": "c2",
            "document_id": "guide/rollback.md",
            "text": "It publishes the previous version.",
        },
    ]
    return {"id": QID, "decision": "answered", "citations": json.dumps(cits), "caller": caller}


REFUSED = {"id": QID, "decision": "refused", "citations": "[]", "caller": None}


def check(body, entry, **kw):
    return check_feedback(parse_feedback({"query_id": QID, **body}), entry, DOCS, **kw)


def test_every_verdict_becomes_a_row():
    row = check({"verdict": "answered", "source": 2}, answered_entry())
    assert (row["verdict"], row["source"], row["document"]) == ("answered", 2, "guide/rollback.md")
    assert row["quote"] == "It publishes the previous version."
    row = check(
        {"verdict": "missed", "document": "rollback.md", "quote": "run the rollback command"},
        REFUSED,
    )
    # found across the document's own line break; its own characters are kept as the needle
    assert row["document"] == "guide/rollback.md" and row["quote"] == "run the\n  rollback command"
    assert check({"verdict": "should_refuse"}, answered_entry())["quote"] is None
    assert check({"verdict": "right_refusal"}, REFUSED)["verdict"] == "right_refusal"
    assert check({"verdict": "wrong", "note": "me@x.org said so"}, answered_entry())["note"]
    redacted = check({"verdict": "wrong", "note": "ask me@x.org"}, answered_entry(), redacting=True)
    assert redacted["note"] == "ask [email]"


@pytest.mark.parametrize(
    "body, entry, needle",
    [
        ({"verdict": "maybe"}, "answered", "is not one of answered, missed"),
        ({"verdict": "answered"}, "answered", "answered needs source"),
        ({"verdict": "answered", "source": 7}, "answered", "(shown: 1, 2)"),
        ({"verdict": "answered", "source": "1"}, "answered", "source must be a citation number"),
        ({"verdict": "answered", "source": True}, "answered", "source must be a citation number"),
        ({"verdict": "answered", "source": 1}, "refused", "got NO ANSWER"),
        ({"verdict": "should_refuse"}, "refused", "should_refuse does not apply"),
        ({"verdict": "wrong"}, "refused", "wrong does not apply"),
        ({"verdict": "right_refusal"}, "answered", "was answered, not refused"),
        ({"verdict": "should_refuse", "source": 1}, "answered", "takes no source"),
        ({"verdict": "missed", "document": "rollback.md"}, "refused", "needs document and quote"),
        (
            {"verdict": "missed", "document": "nope.md", "quote": "run the rollback command"},
            "refused",
            "no document 'nope.md'",
        ),
        (
            {"verdict": "missed", "document": "index.md", "quote": "Start here now please"},
            "refused",
            "ambiguous",
        ),
        (
            {"verdict": "missed", "document": "rollback.md", "quote": "delete the whole index"},
            "refused",
            "quote not found in guide/rollback.md",
        ),
        (
            {"verdict": "missed", "document": "rollback.md", "quote": "rollback"},
            "refused",
            "at least 3 words",
        ),
        ({"verdict": "wrong", "colour": "red"}, "answered", "unknown field 'colour'"),
        ({"verdict": "wrong", "note": "x" * 1001}, "answered", "at most 1000"),
    ],
)
def test_bad_feedback_is_one_line_naming_the_fix(body, entry, needle):
    with pytest.raises(FeedbackError) as err:
        check(body, answered_entry() if entry == "answered" else REFUSED)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_ids_and_shapes_are_checked_first():
    for body in (None, [], "x", {"verdict": "wrong"}, {"query_id": "short", "verdict": "wrong"}):
        with pytest.raises(FeedbackError):
            parse_feedback(body)
    with pytest.raises(UnknownQuery, match="no query"):
        check({"verdict": "wrong"}, None)


def test_a_named_caller_cannot_judge_another_callers_query():
    mine = answered_entry(caller="alice")
    assert check({"verdict": "wrong"}, mine, caller="alice")["caller"] == "alice"
    with pytest.raises(UnknownQuery):  # the same answer as an id that does not exist
        check({"verdict": "wrong"}, mine, caller="bob")
    assert check({"verdict": "wrong"}, mine, caller=None)["verdict"] == "wrong"  # administrator


def test_quotes_and_document_names():
    assert resolve_document("guide/index.md", DOCS) == "guide/index.md"
    assert find_quote("  Start here.  now ", "d", "x Start here. now y") == "Start here. now"
    with pytest.raises(FeedbackError, match="at most 2000"):
        find_quote("word " * 500, "d", "text")
