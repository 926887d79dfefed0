"""Reviewed traffic as an evaluation set (issue 33): the ``traffic`` source of ``eval_questions``.

Each logged query with a review becomes a question of a needle-format set
(:mod:`.questions`), written beside the index (``evaluation/traffic/``):

- ``answered`` (source n) and ``missed`` (document, quote): an answerable question whose needle
  is the cited text (the span shown under citation n) or the quoted text. Needles are looked
  up again in the current documents: where an edit moved or re-spaced the text, the document's
  current characters are used (another document that holds it counts too); where the text is
  gone, the question is dropped and counted (``dropped``). Questions with the same needle are
  one question with several phrasings (each named by its query id).
- ``should_refuse`` (it answered; the corpus cannot answer) and ``right_refusal`` (NO ANSWER was
  right): an out-of-domain question, ``near`` and ``unrelated`` respectively (the published gate
  let the first through; it refused the second).
- ``wrong`` says where the answer is not, but not where it is: counted, not asked.

The same question text asked several times counts once (its newest review wins). The set
calibrates the cut only once it holds :data:`MIN_ANSWERABLE` answerable questions and
:data:`MIN_OUT_OF_DOMAIN` out-of-domain ones; until then the model-free cut stays, and
:func:`review_progress` says how many more reviews of each kind are needed. A hand-written set
at ``RAG_EVAL_DIR`` is merged with it (its rows first; a traffic question that repeats one of
its questions is left out).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.evaluate.calibrate import MIN_OOD_QUESTIONS
from rag_assets.lib.query.feedback import ANSWERABLE, OUT_OF_DOMAIN
from rag_assets.lib.query.log import valid_query_id

MIN_ANSWERABLE = 20
"""Answerable traffic queries (reviewed ``answered`` / ``missed``, distinct texts) before the
cut is calibrated on traffic: recall over fewer moves by more than 5 points a question."""

MIN_OUT_OF_DOMAIN = MIN_OOD_QUESTIONS
"""Out-of-domain traffic queries (``should_refuse`` / ``right_refusal``) before the cut is
calibrated on traffic (the calibration's own minimum, 20)."""

OOD_KIND = {"should_refuse": "near", "right_refusal": "unrelated"}
FOLDER = "evaluation/traffic"  # the set's files in the store (a _rag_files prefix remotely)
STATE_FILE = "state.json"

TRUST_RULE = (
    "only the administrator's verdicts (RAG_API_TOKEN, the local operator, `rag-assets review`) "
    "calibrate the shared cut; a group token's verdicts are kept and shown for review"
)
"""Issue 43: whose reviews make the evaluation set. One cut serves every token, so a verdict
given with a group token (one user's view, on that user's own questions) is recorded and
shown in the review queue, but moves the cut only once the administrator gives it too."""


def normalized(text: str) -> str:
    """A question's identity for counting: case and whitespace folded."""
    return " ".join(text.lower().split())


def _reviewed_entries(log: Any) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(query id -> review, query id -> entry) of every query still in the log that has a
    trusted review (the administrator's: issue 43's trust rule, :data:`TRUST_RULE`)."""
    reviews = {i: r for i, r in log.reviews(trusted=True).items() if valid_query_id(i)}
    if not reviews:
        return {}, {}
    ids = sorted(reviews)
    if len(ids) <= 500:
        where = "id IN (" + ", ".join(f"'{i}'" for i in ids) + ")"
        rows = log.entries(where, columns=["id", "question", "decision", "at"])
    else:
        rows = [
            r
            for r in log.entries(columns=["id", "question", "decision", "at"])
            if r["id"] in reviews
        ]
    entries = {r["id"]: r for r in rows}
    return {i: reviews[i] for i in ids if i in entries}, entries


def _newest_per_question(
    reviews: dict[str, dict[str, Any]], entries: dict[str, dict[str, Any]]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """normalized question -> (query id, review) of its newest review."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for qid, review in sorted(reviews.items(), key=lambda kv: (kv[1]["seq"], kv[0])):
        out[normalized(entries[qid]["question"])] = (qid, review)
    return out


def review_progress(log: Any) -> dict[str, Any]:
    """How far reviewed traffic is from calibrating the cut: distinct reviewed questions per
    kind, the reviews still needed of each, and ``ready``."""
    reviews, entries = _reviewed_entries(log)
    newest = _newest_per_question(reviews, entries)
    verdicts = [r["verdict"] for _, r in newest.values()]
    answerable = sum(v in ANSWERABLE for v in verdicts)
    ood = sum(v in OUT_OF_DOMAIN for v in verdicts)
    need_a = max(0, MIN_ANSWERABLE - answerable)
    need_o = max(0, MIN_OUT_OF_DOMAIN - ood)
    return {
        "reviewed": len(reviews),
        "answerable": answerable,
        "out_of_domain": ood,
        "wrong": sum(v == "wrong" for v in verdicts),
        "needed": {"answerable": need_a, "out_of_domain": need_o},
        "ready": need_a == 0 and need_o == 0,
    }


def progress_line(progress: dict[str, Any]) -> str:
    """One line for ``status`` and notes: what reviewed traffic holds and still needs."""
    need = progress["needed"]
    have = (
        f"{progress['answerable']} answerable and {progress['out_of_domain']} out-of-domain "
        "reviewed questions"
    )
    if progress["ready"]:
        return f"reviewed traffic: {have}: enough to calibrate the cut"
    wanted = []
    if need["answerable"]:
        wanted.append(f"{need['answerable']} more answered/missed")
    if need["out_of_domain"]:
        wanted.append(f"{need['out_of_domain']} more should_refuse/right_refusal")
    return (
        f"reviewed traffic: {have}; the cut is calibrated on traffic after {' and '.join(wanted)}"
    )


@dataclass
class TrafficSet:
    """What :func:`write_traffic_set` wrote: counts of the set, the questions dropped because
    their text left the documents, and the review progress."""

    counts: dict[str, int] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # query ids
    progress: dict[str, Any] = field(default_factory=dict)
    merged_with: str | None = None

    @property
    def ready(self) -> bool:
        return (
            self.counts.get("queries", 0) >= MIN_ANSWERABLE
            and self.counts.get("out_of_domain", 0) >= MIN_OUT_OF_DOMAIN
        )

    @property
    def empty(self) -> bool:
        return not self.counts.get("queries") and not self.counts.get("out_of_domain")


def write_traffic_set(
    log: Any, texts: dict[str, str], out_dir: Path, base: Path | None = None
) -> TrafficSet:
    """Write the reviewed traffic of ``log`` as a needle set in ``out_dir`` (replaced whole),
    needles located in ``texts`` (document id -> current text); ``base``: a hand-written set to
    merge (its rows first)."""
    reviews, entries = _reviewed_entries(log)
    newest = _newest_per_question(reviews, entries)
    base_rows, base_ood, base_texts = _base_rows(base)
    questions: dict[tuple[str, str], dict[str, Any]] = {}
    ood: list[dict[str, Any]] = []
    dropped: list[str] = []
    for key, (qid, review) in sorted(newest.items(), key=lambda kv: kv[1][0]):
        if key in base_texts:
            continue  # the hand-written set asks it already
        question = entries[qid]["question"]
        verdict = review["verdict"]
        if verdict in OUT_OF_DOMAIN:
            ood.append(
                {
                    "id": qid,
                    "kind": OOD_KIND[verdict],
                    "query": question,
                    "traffic": {"verdict": verdict, "at": entries[qid]["at"]},
                }
            )
            continue
        if verdict not in ANSWERABLE:
            continue
        found = relocate(str(review.get("quote") or ""), str(review.get("document") or ""), texts)
        if found is None:
            dropped.append(qid)
            continue
        document, needle = found
        row = questions.setdefault(
            (document, needle),
            {
                "id": "tr-" + hashlib.sha256(f"{document}\0{needle}".encode()).hexdigest()[:12],
                "document": document,
                "needle": needle,
                "queries": {},
                "traffic": {"query_ids": [], "verdicts": {}},
            },
        )
        row["queries"][qid] = question
        row["traffic"]["query_ids"].append(qid)
        row["traffic"]["verdicts"][qid] = verdict
    rows = base_rows + sorted(questions.values(), key=lambda r: r["id"])
    ood_rows = base_ood + sorted(ood, key=lambda r: r["id"])
    n_traffic_queries = sum(len(r["queries"]) for r in questions.values())
    result = TrafficSet(
        counts={
            "questions": len(questions),
            "queries": n_traffic_queries,
            "out_of_domain": len(ood),
            "near": sum(o["kind"] == "near" for o in ood),
            "unrelated": sum(o["kind"] == "unrelated" for o in ood),
            "reviews": len(reviews),
            "dropped": len(dropped),
            **(
                {"hand_written_questions": len(base_rows), "hand_written_ood": len(base_ood)}
                if base is not None
                else {}
            ),
        },
        dropped=dropped,
        progress=review_progress(log),
        merged_with=str(base) if base is not None else None,
    )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "questions.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    (tmp / "out_of_domain.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ood_rows), encoding="utf-8"
    )
    state = {
        "source": "traffic",
        "counts": result.counts,
        "dropped": dropped,
        "merged_with": result.merged_with,
    }
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out_dir)
    return result


def _base_rows(base: Path | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], set[str]]:
    """A hand-written set's rows as they are, and its query texts (normalized)."""
    if base is None:
        return [], [], set()
    rows: list[dict[str, Any]] = []
    ood: list[dict[str, Any]] = []
    for name, out in (("questions.jsonl", rows), ("out_of_domain.jsonl", ood)):
        f = base / name
        if f.is_file():
            out += [json.loads(line) for line in f.read_text("utf-8").splitlines() if line.strip()]
    texts = {normalized(t) for r in rows for t in r.get("queries", {}).values()}
    texts |= {normalized(o["query"]) for o in ood if isinstance(o.get("query"), str)}
    return rows, ood, texts


def relocate(needle: str, document: str, texts: dict[str, str]) -> tuple[str, str] | None:
    """(document id, the document's own text of ``needle``) in the current ``texts``: in its
    document first, then in any (sorted by id); whitespace between words may differ. None when
    the text is gone."""
    words = needle.split()
    if not words:
        return None
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words))
    order = ([document] if document in texts else []) + sorted(d for d in texts if d != document)
    for doc in order:
        if needle in texts[doc]:
            return doc, needle
        m = pattern.search(texts[doc])
        if m is not None:
            return doc, m.group(0)
    return None


# -- what the review queue and GET /log show ------------------------------------------------
def shown_entry(row: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """A log entry as ``GET /log`` and ``rag-assets review`` show it (hits and citations
    parsed, its verdict history oldest first)."""
    out = {k: v for k, v in row.items() if k not in ("hits", "citations", "at_ns")}
    out["hits"] = json.loads(row.get("hits") or "[]")
    out["citations"] = json.loads(row.get("citations") or "[]")
    out["review"] = history[-1]["verdict"] if history else None
    out["history"] = [
        {
            k: h.get(k)
            for k in ("at", "verdict", "source", "document", "quote", "note", "interface", "caller")
        }
        for h in history
    ]
    return out


def entries_for_review(log: Any, *, unreviewed: bool = False, limit: int = 50) -> list[Any]:
    """The newest entries (only those without the administrator's verdict with
    ``unreviewed``: a group token's verdict waits there to be confirmed), newest first."""
    reviews = log.reviews(trusted=True)
    newest = [
        r["id"]
        for r in reversed(log.entries(columns=["id"]))  # ids first: no texts, hits or citations
        if not (unreviewed and r["id"] in reviews) and valid_query_id(r["id"])
    ][:limit]
    if not newest:
        return []
    rows = log.entries("id IN (" + ", ".join(f"'{i}'" for i in newest) + ")")
    feedback: dict[str, list[dict[str, Any]]] = {}
    for f in log.feedback():
        feedback.setdefault(f["query_id"], []).append(f)
    return [shown_entry(r, feedback.get(r["id"], [])) for r in reversed(rows)]


def log_status(store: Any, enabled: bool) -> dict[str, Any]:
    """The query log in ``status`` / ``/status``: on or off, how many entries and reviews, and
    what reviewed traffic still needs to calibrate the cut (counts only)."""
    from rag_assets.lib.index.store.querylog import (
        FEEDBACK_TABLE,
        QUERIES_TABLE,
        LogDamaged,
        QueryLog,
    )

    log = QueryLog(store)
    out: dict[str, Any] = {"enabled": enabled, "entries": 0, "calibration": None}
    try:
        if log.exists(QUERIES_TABLE):
            out["entries"] = log.count()
        has_reviews = log.exists(FEEDBACK_TABLE)
        if has_reviews:
            out["calibration"] = review_progress(log)
    except LogDamaged as exc:  # issue 43: on object storage; the rest of status goes on
        out["damaged"] = str(exc)
        has_reviews = False
    if not has_reviews:
        out["calibration"] = {
            "reviewed": 0,
            "answerable": 0,
            "out_of_domain": 0,
            "wrong": 0,
            "needed": {"answerable": MIN_ANSWERABLE, "out_of_domain": MIN_OUT_OF_DOMAIN},
            "ready": False,
        }
    return out
