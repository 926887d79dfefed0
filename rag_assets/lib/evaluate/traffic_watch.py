"""Watching the query log (issue 33): its figures, the drift rule, the content-gap report.

:func:`log_metrics` are the numbers the ``query_log`` asset records at each observation
(Dagster plots them): queries per day, the refusal rate, percentiles of the nearest distance
and of the latency, review counts. They are aggregates only: no question text leaves the index
store through them.

**The drift rule** (:func:`drift`, the ``query_log_drift`` check). Users asking about something
the corpus lacks shows as more refusals and larger nearest distances. The asks of the log, in
time order, are cut into windows of :data:`DRIFT_WINDOW` asks; the newest full window is
compared with the up to :data:`MAX_TRAILING` windows before it (at least
:data:`MIN_TRAILING`). It warns when the newest window's refusal rate, or its median nearest
distance, lies outside the trailing windows' mean ± :data:`SIGMAS` standard deviations *and*
moved by at least :data:`MIN_REFUSAL_MOVE` (refusal rate) or :data:`MIN_DISTANCE_MOVE`
(distance) from that mean: the floors keep a very steady history from flagging noise. Windows
of a fixed number of asks, not of days, make the rule the same for a quiet and a busy service.

**The content-gap report** (:func:`content_gaps`): the questions that were refused, or reviewed
``should_refuse``, grouped by similarity (embedded with the index's model when given, cosine
≥ :data:`GAP_SIMILARITY` to a group's first question; else by shared words), biggest group
first: what the documentation does not cover, for the people who write it. A group token's
refusal that the index answers without the token's access filter is counted apart
(:func:`access_refusals`, issue 43): the answer exists, the token may not see it.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

DAY_NS = 86_400 * 10**9

DRIFT_WINDOW = 30
"""Asks per drift window."""
MIN_TRAILING = 3
"""Trailing windows needed before the rule judges (fewer: "not enough traffic")."""
MAX_TRAILING = 20
"""Trailing windows the newest is compared with at most."""
SIGMAS = 3.0
"""How many standard deviations of the trailing windows count as "far"."""
MIN_REFUSAL_MOVE = 0.15
"""The least change of the refusal rate (absolute) that can warn."""
MIN_DISTANCE_MOVE = 0.05
"""The least change of the median nearest cosine distance that can warn."""

REFUSAL_GATES = ("distance", "judge", "verification")
"""What may refuse an ``ask`` (the query log's ``refused_by``), each counted in the figures."""

GAP_SIMILARITY = 0.6
"""Cosine similarity of two questions' embeddings above which they are one content gap
(all-MiniLM-L6-v2: paraphrases ≈ 0.7-0.9, unrelated questions ≈ 0.0-0.3)."""
GAP_WORDS_OVERLAP = 0.5
"""Without a model: the share of shared content words (Jaccard) that makes one gap."""
GAP_GROUPS = 25
"""Groups the report lists (the largest)."""


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else math.nan


def log_metrics(
    entries: Sequence[dict[str, Any]],
    reviews: dict[str, dict[str, Any]] | None = None,
    now_ns: int = 0,
) -> dict[str, float | int]:
    """The observation's figures over ``entries`` (rows with at_ns, interface, decision,
    nearest_distance, latency_ms): the last 24 hours, the last 7 days and the whole log. NaN
    where there is nothing to measure (Dagster shows no point)."""
    reviews = reviews or {}
    day = [e for e in entries if e["at_ns"] >= now_ns - DAY_NS]
    week = [e for e in entries if e["at_ns"] >= now_ns - 7 * DAY_NS]
    asks = [e for e in day if e.get("decision") in ("answered", "refused")]
    refused = sum(e["decision"] == "refused" for e in asks)
    dists = [float(e["nearest_distance"]) for e in day if e.get("nearest_distance") is not None]
    lat = [float(e["latency_ms"]) for e in day if e.get("latency_ms") is not None]
    ids = {e.get("id") for e in entries}
    verdicts = Counter(r["verdict"] for i, r in reviews.items() if i in ids)
    out: dict[str, float | int] = {
        "entries": len(entries),
        "queries_last_24h": len(day),
        "queries_per_day_7d": round(len(week) / 7, 2),
        "asks_last_24h": len(asks),
        "refusal_rate_24h": refused / len(asks) if asks else math.nan,
        "nearest_distance_p10_24h": _pct(dists, 10),
        "nearest_distance_p50_24h": _pct(dists, 50),
        "nearest_distance_p90_24h": _pct(dists, 90),
        "latency_ms_p50_24h": _pct(lat, 50),
        "latency_ms_p95_24h": _pct(lat, 95),
        "reviewed": sum(verdicts.values()),
        "unreviewed": len(entries) - sum(verdicts.values()),
    }
    for verdict, n in sorted(verdicts.items()):
        out[f"reviews_{verdict}"] = n
    # which gate refused, over the last 24 hours: the distance cut, the answer check (judge),
    # the written answer's verification (issue 50: RAG_ANSWER_VERIFY=refuse)
    gates = Counter(e.get("refused_by") or "distance" for e in asks if e["decision"] == "refused")
    for gate in REFUSAL_GATES:
        out[f"refused_by_{gate}_24h"] = gates.get(gate, 0)
    return out


@dataclass
class Drift:
    """The drift rule's verdict: ``status`` ok | warn | not enough traffic, and its figures."""

    status: str
    reasons: list[str] = field(default_factory=list)
    windows: int = 0
    current: dict[str, float] = field(default_factory=dict)
    trailing_mean: dict[str, float] = field(default_factory=dict)
    trailing_sd: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _window_figures(window: Sequence[dict[str, Any]]) -> dict[str, float]:
    refused = sum(e["decision"] == "refused" for e in window)
    dists = [float(e["nearest_distance"]) for e in window if e.get("nearest_distance") is not None]
    return {
        "refusal_rate": refused / len(window),
        "median_nearest_distance": statistics.median(dists) if dists else math.nan,
    }


def drift(entries: Sequence[dict[str, Any]], window: int = DRIFT_WINDOW) -> Drift:
    """The drift rule (see the module docstring) over the log's asks."""
    asks = sorted(
        (e for e in entries if e.get("decision") in ("answered", "refused")),
        key=lambda e: (e["at_ns"], e.get("id") or ""),
    )
    full = len(asks) // window
    if full < MIN_TRAILING + 1:
        return Drift(
            "not enough traffic",
            [
                f"{len(asks)} asks: the rule needs {(MIN_TRAILING + 1) * window} "
                f"({MIN_TRAILING + 1} windows of {window})"
            ],
            windows=full,
        )
    start = len(asks) - full * window  # whole windows ending with the newest ask
    wins = [asks[start + i * window : start + (i + 1) * window] for i in range(full)]
    current = _window_figures(wins[-1])
    trailing = [_window_figures(w) for w in wins[:-1][-MAX_TRAILING:]]
    out = Drift("ok", windows=len(trailing), current=current)
    floors = {"refusal_rate": MIN_REFUSAL_MOVE, "median_nearest_distance": MIN_DISTANCE_MOVE}
    for name, floor in floors.items():
        values = [t[name] for t in trailing if not math.isnan(t[name])]
        if len(values) < MIN_TRAILING or math.isnan(current[name]):
            continue
        mean = statistics.fmean(values)
        sd = statistics.pstdev(values)
        out.trailing_mean[name], out.trailing_sd[name] = mean, sd
        move = current[name] - mean
        if abs(move) > max(SIGMAS * sd, floor):
            out.status = "warn"
            out.reasons.append(
                f"{name.replace('_', ' ')} {current[name]:.3f} in the last {window} asks, "
                f"{'up' if move > 0 else 'down'} from {mean:.3f} ± {sd:.3f} over the "
                f"{len(values)} windows before"
            )
    return out


# -- content gaps ---------------------------------------------------------------------------
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "can",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "my",
        "of",
        "on",
        "or",
        "the",
        "to",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "with",
        "you",
        "your",
        "this",
        "that",
        "be",
        "by",
        "at",
        "as",
        "me",
        "we",
        "our",
    ]
)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def gap_questions(
    entries: Sequence[dict[str, Any]], reviews: dict[str, dict[str, Any]]
) -> list[tuple[str, int, str]]:
    """(question, times asked, why) of every refused or ``should_refuse`` question, most asked
    first (a question is its text, case and spacing folded)."""
    counts: Counter[str] = Counter()
    shown: dict[str, str] = {}
    why: dict[str, set[str]] = {}
    for e in entries:
        verdict = reviews.get(str(e.get("id")), {}).get("verdict")
        reasons = set()
        if e.get("decision") == "refused" and verdict != "missed":
            reasons.add("refused")
        if verdict == "should_refuse":
            reasons.add("should_refuse")
        if not reasons or not e.get("question"):
            continue
        key = " ".join(str(e["question"]).lower().split())
        counts[key] += 1
        shown.setdefault(key, " ".join(str(e["question"]).split()))
        why.setdefault(key, set()).update(reasons)
    return [
        (shown[k], n, "+".join(sorted(why[k])))
        for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def access_refusals(
    entries: Sequence[dict[str, Any]], answers: Callable[[str], bool] | None
) -> tuple[list[dict[str, Any]], int]:
    """Issue 43: the refusals caused by access, split off the content gaps. A question a group
    token asked (``caller`` set) that was refused, and that the published index answers
    without the token's access filter (``answers``: its retrieval and distance gate for the
    administrator), is no gap in the content: the answer is in documents the token may not
    see. Returns (the entries that stay, how many were refused for access); ``answers`` None:
    nothing is split off. Run when the report is made, on the administrator's side: the token
    sees nothing of it (the log and the report are the administrator's)."""
    if answers is None:
        return list(entries), 0
    seen: dict[str, bool] = {}
    kept: list[dict[str, Any]] = []
    access = 0
    for e in entries:
        question = e.get("question")
        if e.get("decision") == "refused" and e.get("caller") and question:
            key = " ".join(str(question).lower().split())
            if key not in seen:
                seen[key] = answers(str(question))
            if seen[key]:
                access += 1
                continue
        kept.append(e)
    return kept, access


def refused_for_a_token(entries: Sequence[dict[str, Any]]) -> bool:
    """Whether any entry is a group token's refused question (:func:`access_refusals` then
    needs the unrestricted gate)."""
    return any(e.get("decision") == "refused" and e.get("caller") for e in entries)


def unrestricted_answers(store: Any, embedder: Any) -> Callable[[str], bool]:
    """Whether the published version answers a question for the administrator (no access
    filter): retrieval and the distance gate at the published cut (``RAG_DISTANCE_CUT`` when
    set), as ``rag-assets ask`` without a judge."""
    import os

    from rag_assets.lib.query.fusion import parse_fusion
    from rag_assets.lib.query.retrieve import Index

    published = store.published()
    if published is None:
        return lambda _q: False
    cut = os.environ.get("RAG_DISTANCE_CUT")
    index = Index(
        store,
        published,
        embedder,
        None,
        float(cut) if cut else None,
        parse_fusion(os.environ.get("RAG_FUSION")),
    )
    return lambda q: not index.ask(q, rerank=False).no_answer


def gap_report(
    log: Any,
    store: Any,
    load_embedder: Callable[[], Any],
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The content-gap report of ``log`` now (``log gaps`` and the ``content_gaps`` asset):
    ``groups`` (:func:`content_gaps`), ``questions`` (:func:`gap_questions`), ``grouped_by``
    and ``refused_for_access`` (:func:`access_refusals`, told apart with the index's model:
    ``load_embedder``, loaded only when needed). With ``warn``, a model that fails is said
    and the report goes on (grouped by words, refusals not told apart); without, it raises."""
    entries = log.entries(columns=["id", "question", "decision", "caller"]) if log.exists() else []
    loaded: list[Any] = []

    def model() -> Any:
        if not loaded:
            loaded.append(load_embedder())
        return loaded[0]

    def tried(what: str, make: Callable[[], T]) -> T | None:
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - said, and the report goes on
            if warn is None:
                raise
            warn(f"content gaps: {what} ({' '.join(str(exc).split())[:200]})")
            return None

    answers = None
    if refused_for_a_token(entries):
        answers = tried(
            "refusals for access not told apart", lambda: unrestricted_answers(store, model())
        )
    kept, access = access_refusals(entries, answers)
    questions = gap_questions(kept, log.reviews() if entries else {})
    embedder = tried("grouped by words: the model failed", model) if questions else None
    groups = content_gaps(questions, embedder.encode_queries if embedder is not None else None)
    by = f"{embedder.spec.model_id} embeddings" if embedder is not None else "shared words"
    return {
        "grouped_by": by,
        "groups": groups,
        "questions": questions,
        "refused_for_access": access,
    }


def content_gaps(
    questions: Sequence[tuple[str, int, str]],
    embed: Callable[[list[str]], Any] | None = None,
) -> list[dict[str, Any]]:
    """Group ``questions`` (from :func:`gap_questions`) by similarity, biggest group first.
    ``embed`` maps texts to unit vectors (the index's query encoder); without it, by words."""
    texts = [q for q, _, _ in questions]
    if not texts:
        return []
    vecs = np.asarray(embed(texts), dtype=np.float32) if embed is not None else None
    words = [_words(t) for t in texts]
    groups: list[dict[str, Any]] = []
    leaders: list[int] = []
    for i, (text, n, why) in enumerate(questions):  # most asked first: it leads its group
        home = None
        for g, lead in enumerate(leaders):
            if vecs is not None:
                close = float(vecs[i] @ vecs[lead]) >= GAP_SIMILARITY
            else:
                union = words[i] | words[lead]
                close = (
                    bool(union) and len(words[i] & words[lead]) / len(union) >= GAP_WORDS_OVERLAP
                )
            if close:
                home = g
                break
        if home is None:
            leaders.append(i)
            groups.append({"example": text, "asked": 0, "questions": []})
            home = len(groups) - 1
        groups[home]["asked"] += n
        groups[home]["questions"].append({"question": text, "asked": n, "why": why})
    groups.sort(key=lambda g: (-g["asked"], g["example"]))
    return groups


def gaps_markdown(
    groups: Sequence[dict[str, Any]],
    generated_at: str,
    grouped_by: str,
    refused_for_access: int = 0,
) -> str:
    """The report for the people who write the documentation."""
    lines = [
        "# Content gaps",
        "",
        f"Questions the index refused, or that reviewers marked should_refuse, grouped by "
        f"similarity ({grouped_by}); the most asked first. Generated {generated_at}.",
        "",
    ]
    if refused_for_access:
        lines += [
            f"Refused for access: {refused_for_access} (questions of group tokens that the "
            "index answers from documents those tokens may not see; not content gaps, not "
            "listed below).",
            "",
        ]
    if not groups:
        lines.append("No refused or should_refuse questions in the query log.")
    for i, g in enumerate(groups[:GAP_GROUPS], start=1):
        lines += ["", f"## {i}. {g['example']}", "", f"Asked {g['asked']} times.", ""]
        for q in g["questions"][:15]:
            lines.append(f"- {q['question']} ({q['asked']}×, {q['why']})")
        if len(g["questions"]) > 15:
            lines.append(f"- … and {len(g['questions']) - 15} more")
    return "\n".join(lines) + "\n"
