"""Calibrate the refusal gate: sweep cosine-distance cuts over answerable and out-of-domain queries.

The gate: of a query's hits in final retrieval order, keep those whose cosine distance is
below the cut, at most ``keep`` of them; an empty result is a refusal. For each cut the sweep
counts answerable queries answered with a correct hit kept, answered with only wrong hits,
or refused, and out-of-domain queries that "bluff" (keep at least one hit). Because a query
keeps something iff its smallest distance is below the cut, refusals fall and bluffs rise
monotonically with the cut; which answered queries are correct need not (``keep`` can push a
later correct hit out when an earlier wrong one passes).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

#: Cuts swept by default: 0.300, 0.305, ..., 1.000 (141 cuts; all-MiniLM distances of
#: relevant chunks lie well inside this range, 1.0 = orthogonal).
DEFAULT_CUTS: tuple[float, ...] = tuple(round(0.30 + 0.005 * i, 3) for i in range(141))
#: Hits the answer keeps after the gate (the cited context size).
DEFAULT_KEEP = 4
#: Default target: at most 10 % of out-of-domain queries may return anything.
DEFAULT_MAX_BLUFF_RATE = 0.10
POLICIES = ("max_cut_under_bluff_rate", "youden")
#: The fewest out-of-domain questions a cut is chosen from. With fewer, one bluff moves the rate
#: by more than 5 points and the Wilson 95 % upper bound of 2 bluffs in 20 is already 30 %: such
#: a set is reported but the cut is the day-0 one instead (:func:`choose_day0_cut`, with a warning).
MIN_OOD_QUESTIONS = 20
UNRELATED_POLICY = "max_cut_under_unrelated_bluff_rate"
OOD_KINDS = ("near", "unrelated")

#: Issue 43: the most one calibration on reviewed traffic may lower the published cut (cosine
#: distance). Lowering it refuses questions the published cut answered: a poisoned calibration
#: asked for 0.300 from 0.475 (4 of 6 baseline questions then refused). A larger drop is held
#: there and named, for the administrator to confirm with RAG_DISTANCE_CUT. A rise is not held:
#: the calibration's own bluff-rate target bounds it, and the first calibration on traffic
#: legitimately raises a model-free cut by more (0.475 -> 0.560 on 40 reviews; 0.53 in
#: rag_assets_tests/test_traffic_loop.py).
MAX_TRAFFIC_CUT_MOVE = 0.10


def bounded_traffic_cut(
    cut: float, published: float | None, bound: float = MAX_TRAFFIC_CUT_MOVE
) -> tuple[float, str]:
    """(the cut to publish, why it was held: "" when ``cut`` is at most ``bound`` below the
    ``published`` one, above it, or there is none)."""
    if published is None or not math.isfinite(published) or cut >= published - bound:
        return cut, ""
    held = published - bound
    return held, (
        f"reviewed traffic asked for {cut:.3f}, {published - cut:.3f} below the published "
        f"{published:.3f}, refusing questions it answered: held at {held:.3f} (lowered by at "
        f"most {bound:g} a run, MAX_TRAFFIC_CUT_MOVE); review the verdicts, then confirm it "
        f"with RAG_DISTANCE_CUT={cut:.3f}"
    )


@dataclass(frozen=True)
class QueryDistances:
    """One query's hits as the gate sees them.

    ``distances``: cosine distance of each hit, in final retrieval order (rank 1 first).
    ``correct_ranks``: 1-based ranks of hits that answer it (empty for out-of-domain).
    ``kind``: ``"answerable"``, ``"near"`` or ``"unrelated"``.
    """

    query_id: str
    distances: tuple[float, ...]
    correct_ranks: frozenset[int] = frozenset()
    kind: str = "answerable"

    def __post_init__(self) -> None:
        object.__setattr__(self, "distances", tuple(float(d) for d in self.distances))
        object.__setattr__(self, "correct_ranks", frozenset(self.correct_ranks))
        if self.kind not in ("answerable", *OOD_KINDS):
            raise ValueError(f"query {self.query_id!r}: unknown kind {self.kind!r}")
        if any(math.isnan(d) for d in self.distances):
            raise ValueError(f"query {self.query_id!r} has a NaN distance")
        if any(not 1 <= r <= len(self.distances) for r in self.correct_ranks):
            raise ValueError(
                f"query {self.query_id!r}: correct rank outside 1..{len(self.distances)}"
            )

    def kept_ranks(self, cut: float, keep: int = DEFAULT_KEEP) -> list[int]:
        """1-based ranks the gate keeps at ``cut``: the first ``keep`` hits with distance < cut."""
        return [r for r, d in enumerate(self.distances, start=1) if d < cut][:keep]


@dataclass(frozen=True)
class SweepRow:
    """Gate outcome at one cut. Rates are over answerable (answer) and OOD (bluff) queries."""

    cut: float
    answered_correct: int
    answered_wrong: int
    refused_answerable: int
    bluffs_near: int
    bluffs_unrelated: int
    n_answerable: int
    n_near: int
    n_unrelated: int
    answer_rate: float = field(init=False)
    answered_correct_rate: float = field(init=False)
    bluff_rate: float = field(init=False)

    def __post_init__(self) -> None:
        n_ood = self.n_near + self.n_unrelated
        answered = self.answered_correct + self.answered_wrong
        object.__setattr__(self, "answer_rate", answered / self.n_answerable)
        object.__setattr__(self, "answered_correct_rate", self.answered_correct / self.n_answerable)
        bluffs = self.bluffs_near + self.bluffs_unrelated
        object.__setattr__(self, "bluff_rate", bluffs / n_ood if n_ood else 0.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Choice:
    """The chosen cut, the policy that chose it and why (``satisfied``: target was met)."""

    cut: float
    policy: str
    reason: str
    row: SweepRow
    satisfied: bool = True
    warning: str = ""  # issue 30: what the cut cannot bound, and what to do about it

    def to_dict(self) -> dict[str, Any]:
        return {
            "cut": self.cut,
            "policy": self.policy,
            "reason": self.reason,
            "satisfied": self.satisfied,
            "row": self.row.to_dict(),
            "warning": self.warning,
        }


def outcomes(
    answerable: Sequence[QueryDistances],
    ood: Sequence[QueryDistances],
    cut: float,
    keep: int = DEFAULT_KEEP,
) -> dict[str, dict[str, str]]:
    """Each query's gate outcome at ``cut``, for paired comparisons of two gates or models:
    answerable → ``"correct"`` (a kept hit answers it), ``"wrong"`` or ``"refused"``;
    out-of-domain → ``"bluff"`` (something was kept) or ``"refused"``. The counts of
    :func:`sweep` at the same cut are these outcomes tallied."""

    def gate(q: QueryDistances) -> str:
        kept = q.kept_ranks(cut, keep)
        if not kept:
            return "refused"
        if q.kind != "answerable":
            return "bluff"
        return "correct" if q.correct_ranks.intersection(kept) else "wrong"

    return {
        "answerable": {q.query_id: gate(q) for q in answerable},
        "out_of_domain": {q.query_id: gate(q) for q in ood},
    }


def sweep(
    answerable: Sequence[QueryDistances],
    ood: Sequence[QueryDistances],
    cuts: Sequence[float] = DEFAULT_CUTS,
    keep: int = DEFAULT_KEEP,
) -> list[SweepRow]:
    """Count gate outcomes at every cut (rows in ascending cut order)."""
    if not answerable or not ood:
        raise ValueError("calibration needs at least one answerable and one out-of-domain query")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    bad = [q.query_id for q in ood if q.kind not in OOD_KINDS]
    bad += [q.query_id for q in answerable if q.kind != "answerable"]
    if bad:
        raise ValueError(f"queries with the wrong kind for their list: {bad[:5]}")
    n_near = sum(1 for q in ood if q.kind == "near")
    rows = []
    for cut in sorted(cuts):
        correct = wrong = refused = 0
        for q in answerable:
            kept = q.kept_ranks(cut, keep)
            if not kept:
                refused += 1
            elif q.correct_ranks.intersection(kept):
                correct += 1
            else:
                wrong += 1
        bluffing = [q.kind for q in ood if q.kept_ranks(cut, keep)]
        rows.append(
            SweepRow(
                cut=cut,
                answered_correct=correct,
                answered_wrong=wrong,
                refused_answerable=refused,
                bluffs_near=bluffing.count("near"),
                bluffs_unrelated=bluffing.count("unrelated"),
                n_answerable=len(answerable),
                n_near=n_near,
                n_unrelated=len(ood) - n_near,
            )
        )
    return rows


def choose_cut(
    rows: Sequence[SweepRow],
    policy: str = "max_cut_under_bluff_rate",
    max_bluff_rate: float = DEFAULT_MAX_BLUFF_RATE,
) -> Choice:
    """Pick the operating cut from a sweep.

    Policies:

    * ``"max_cut_under_bluff_rate"`` (default): the largest cut whose bluff rate (share of
      out-of-domain queries returning anything) is at most ``max_bluff_rate``. It answers as
      much as possible while bounding false answers to off-topic questions. If no cut meets
      the target, the smallest swept cut is returned (most conservative) with
      ``satisfied=False`` and a reason saying so.
    * ``"youden"``: the cut maximising answered_correct_rate - bluff_rate (Youden's J with
      "answered correctly" as the true-positive rate); ties go to the smallest cut.
    """
    if not rows:
        raise ValueError("empty sweep")
    ordered = sorted(rows, key=lambda r: r.cut)
    if policy == "max_cut_under_bluff_rate":
        ok = [r for r in ordered if r.bluff_rate <= max_bluff_rate]
        if not ok:
            row = ordered[0]
            reason = (
                f"no cut in [{ordered[0].cut:.3f}, {ordered[-1].cut:.3f}] keeps the bluff rate "
                f"<= {max_bluff_rate:.0%}; even the smallest cut bluffs on {_ood_text(row)}; "
                f"using the smallest cut {row.cut:.3f} (most conservative)"
            )
            return Choice(row.cut, policy, reason, row, satisfied=False)
        row = ok[-1]
        reason = (
            f"largest cut with bluff rate <= {max_bluff_rate:.0%}: {row.cut:.3f} bluffs on "
            f"{_ood_text(row)} and answers {_answer_text(row)}"
        )
        return Choice(row.cut, policy, reason, row)
    if policy == "youden":
        row = max(ordered, key=lambda r: (r.answered_correct_rate - r.bluff_rate, -r.cut))
        j = row.answered_correct_rate - row.bluff_rate
        reason = (
            f"cut {row.cut:.3f} maximises answered-correct rate - bluff rate (J = {j:.3f}): "
            f"answers {_answer_text(row)}, bluffs on {_ood_text(row)}"
        )
        return Choice(row.cut, policy, reason, row)
    raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")


def choose_unrelated_cut(
    ood: Sequence[QueryDistances],
    max_bluff_rate: float = DEFAULT_MAX_BLUFF_RATE,
    cuts: Sequence[float] = DEFAULT_CUTS,
    keep: int = DEFAULT_KEEP,
) -> Choice:
    """The cut from out-of-domain questions alone (no answerable ones): the largest swept cut
    at which at most ``max_bluff_rate`` of them keep a source. Used with the shipped unrelated
    list when a corpus has no question set and no model to write one; it bounds bluffs on
    off-topic questions, not on near-misses, which only a question set can measure.
    Refuses fewer than :data:`MIN_OOD_QUESTIONS` questions."""
    if len(ood) < MIN_OOD_QUESTIONS:
        raise ValueError(
            f"only {len(ood)} out-of-domain questions: a cut needs at least {MIN_OOD_QUESTIONS}"
        )
    ordered = sorted(cuts)
    n = len(ood)
    best_row = None
    for cut in ordered:
        bluffing = [q.kind for q in ood if q.kept_ranks(cut, keep)]
        row = SweepRow(
            cut=cut,
            answered_correct=0,
            answered_wrong=0,
            refused_answerable=0,
            bluffs_near=bluffing.count("near"),
            bluffs_unrelated=bluffing.count("unrelated"),
            n_answerable=1,  # no answerable queries: rates over them are not reported
            n_near=sum(1 for q in ood if q.kind == "near"),
            n_unrelated=sum(1 for q in ood if q.kind == "unrelated"),
        )
        if row.bluff_rate <= max_bluff_rate:
            best_row = row
        else:
            break
    if best_row is None:
        first = ordered[0]
        row = SweepRow(first, 0, 0, 0, 0, n, 1, 0, n)
        reason = (
            f"even the smallest cut {first:.3f} answers more than {max_bluff_rate:.0%} of "
            f"{n} unrelated questions; using it (most conservative)"
        )
        return Choice(first, UNRELATED_POLICY, reason, row, satisfied=False)
    b = best_row.bluffs_near + best_row.bluffs_unrelated
    reason = (
        f"largest cut answering at most {max_bluff_rate:.0%} of {n} unrelated questions: "
        f"{best_row.cut:.3f} answers {b}/{n}; no question set measured near-misses or answers"
    )
    return Choice(best_row.cut, UNRELATED_POLICY, reason, best_row)


#: Issue 53: the share of the shipped questions about other topics (``day0.other_topics``) the
#: day-0 cut may answer, as a fraction of the bluff-rate target: 1 % at the default 10 %. Measured
#: on seven folders with hand-written questions (docs/measurements.md, "Day-0 refusal across
#: folders"): at 1 % no folder answered more than 2.6 % of the other folders' questions, and each
#: answered at least 97 % of what its hand-calibrated cut answers; at 0.5 % the course kept only
#: 80 % of it, at 2 % an 18-page manual answered 6.6 % of the others' questions.
DAY0_SHARE = 0.1
DAY0_POLICY = "max_cut_under_other_topics_rate"


def choose_day0_cut(
    other_topics: Sequence[QueryDistances],
    max_bluff_rate: float = DEFAULT_MAX_BLUFF_RATE,
    cuts: Sequence[float] = DEFAULT_CUTS,
    keep: int = DEFAULT_KEEP,
) -> Choice:
    """The ``unrelated-only`` cut (no question set, no model), issue 53: the largest swept cut
    at which at most ``DAY0_SHARE * max_bluff_rate`` of the shipped questions about other topics
    find a source (their ids are ``<domain>/<n>``; the reason names the domains nearest the
    folder). Whatever a folder is about, its neighbouring domains' questions are in that set, so
    the cut stops where this folder's near-misses begin; questions about the folder's own
    subject that it does not answer are not bounded: only a question set written for it is.

    It fails closed: when even the smallest cut answers more than that share (a folder close to
    questions on many topics), the smallest cut is taken (``satisfied=False``) with a warning
    saying why and what to do, never a cut from everyday questions alone."""
    share = max_bluff_rate * DAY0_SHARE
    n = len(other_topics)
    choice = choose_unrelated_cut(other_topics, share, cuts, keep)
    kept = [q.query_id.rpartition("/")[0] for q in other_topics if q.kept_ranks(choice.cut, keep)]
    near = Counter(kept).most_common(4)
    nearest = ", ".join(f"{d or 'other'} {c}" for d, c in near) or "none"
    domains = len({q.query_id.rpartition("/")[0] for q in other_topics})
    if not choice.satisfied:
        warning = (
            f"this folder is close to questions on many topics: even the smallest cut "
            f"{choice.cut:.3f} gives a source to {len(kept)} of {n} questions about other topics "
            f"(more than {share:.1%}; nearest: {nearest}), so it refuses nearly everything until "
            f"a question set measures it; {NO_SEPARATION_ADVICE}"
        )
        return replace(choice, policy=DAY0_POLICY, reason=warning, warning=warning)
    reason = (
        f"largest cut at which at most {share:.1%} of {n} questions about other topics "
        f"({domains} domains) find a source: {choice.cut:.3f} gives one to {len(kept)} "
        f"(nearest: {nearest}); not checked against questions near these documents"
    )
    return replace(choice, policy=DAY0_POLICY, reason=reason)


NO_SEPARATION_ADVICE = (
    "to bound near-miss answers, give a question set written for these documents "
    "(RAG_EVAL_DIR; `rag-assets questions` writes one with a local model at RAG_LLM_URL), "
    "for instance from questions your users asked"
)


def best_distances(queries: Sequence[QueryDistances]) -> list[float]:
    """Per query, the distance the gate decides on: best *correct* hit for answerable queries
    (queries with no correct hit retrieved are left out), best hit for out-of-domain ones."""
    out = []
    for q in queries:
        ds = (
            [q.distances[r - 1] for r in q.correct_ranks] if q.kind == "answerable" else q.distances
        )
        if ds:
            out.append(min(ds))
    return out


def plot_distributions(
    answerable_best: Sequence[float], ood_best: Sequence[float], cut: float, path: Path
) -> Path:
    """PNG histograms of the gate's deciding distance for both populations, with the cut.

    ``answerable_best``: cosine distance of each answerable query's best correct hit;
    ``ood_best``: distance of each out-of-domain query's best hit (see :func:`best_distances`).
    """
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in threads
    from matplotlib.ticker import MaxNLocator

    values = [*answerable_best, *ood_best, cut]
    lo, hi = min(values) - 0.01, max(values) + 0.01
    bins = [lo + (hi - lo) * i / 30 for i in range(31)]  # shared bins for both populations
    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.subplots()
    n_a, n_o = len(answerable_best), len(ood_best)
    ax.hist(
        answerable_best,
        bins=bins,
        alpha=0.6,
        color="tab:blue",
        label=f"answerable: best correct hit (n={n_a})",
    )
    ax.hist(
        ood_best, bins=bins, alpha=0.6, color="tab:red", label=f"out-of-domain: best hit (n={n_o})"
    )
    ax.axvline(cut, color="black", linestyle="--", label=f"refusal cut = {cut:.3f}")
    ax.set_xlabel("cosine distance (1 - cosine similarity); hits below the cut are kept")
    ax.set_ylabel("queries")
    ax.set_title("Refusal gate: deciding distance per query")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def sweep_table_markdown(
    rows: Sequence[SweepRow], every: int = 10, chosen: float | None = None
) -> str:
    """Markdown table of every ``every``-th cut, the last one and the chosen one (in bold)."""
    ordered = sorted(rows, key=lambda r: r.cut)
    lines = [
        "| cut | answered correct | answered wrong | refused | bluffs near | bluffs unrelated "
        "| answer rate | bluff rate |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(ordered):
        is_chosen = chosen is not None and math.isclose(r.cut, chosen, abs_tol=1e-9)
        if not (is_chosen or i % every == 0 or i == len(ordered) - 1):
            continue
        cells = [
            f"{r.cut:.3f}",
            f"{r.answered_correct}/{r.n_answerable}",
            str(r.answered_wrong),
            str(r.refused_answerable),
            f"{r.bluffs_near}/{r.n_near}",
            f"{r.bluffs_unrelated}/{r.n_unrelated}",
            f"{r.answer_rate:.3f}",
            f"{r.bluff_rate:.3f}",
        ]
        if is_chosen:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ood_text(row: SweepRow) -> str:
    return (
        f"{row.bluffs_near}/{row.n_near} near and {row.bluffs_unrelated}/{row.n_unrelated} "
        f"unrelated out-of-domain queries ({row.bluff_rate:.1%})"
    )


def _answer_text(row: SweepRow) -> str:
    return (
        f"{row.answered_correct}/{row.n_answerable} answerable queries correctly "
        f"({row.answered_wrong} wrong, {row.refused_answerable} refused)"
    )


# -- the answer check after the distance gate (issue 9) ---------------------------------------
#: Judge cuts swept: 0.00, 0.01, ..., 1.00 (0.00 accepts everything = the distance gate alone).
DEFAULT_JUDGE_CUTS: tuple[float, ...] = tuple(round(0.01 * i, 2) for i in range(101))
JOINT_POLICY = "max_answered_under_bluff_rate"


@dataclass(frozen=True)
class JudgedQuery:
    """A query as the two-stage gate sees it: its distances (:class:`QueryDistances`) and the
    judge's score (P(yes), per source) of each rank the distance gate can keep."""

    query: QueryDistances
    scores: dict[int, float]
    judged: int = DEFAULT_KEEP  # the judge reads the first this-many kept sources

    def judge_score(self, cut: float, keep: int = DEFAULT_KEEP) -> float | None:
        """Max judge score over the first ``judged`` sources kept at ``cut`` (None: the distance
        gate refused)."""
        kept = self.query.kept_ranks(cut, keep)[: self.judged]
        if not kept:
            return None
        missing = [r for r in kept if r not in self.scores]
        if missing:
            raise ValueError(f"query {self.query.query_id!r}: no judge score for ranks {missing}")
        return max(self.scores[r] for r in kept)


@dataclass(frozen=True)
class JointRow:
    """Outcome of distance cut ``cut`` then judge cut ``judge_cut`` (accept iff score >= it)."""

    cut: float
    judge_cut: float
    answered_correct: int
    answered_wrong: int
    refused_distance: int
    refused_judge: int
    bluffs_near: int
    bluffs_unrelated: int
    n_answerable: int
    n_near: int
    n_unrelated: int

    @property
    def bluff_rate(self) -> float:
        n = self.n_near + self.n_unrelated
        return (self.bluffs_near + self.bluffs_unrelated) / n if n else 0.0

    @property
    def refused_ood(self) -> int:
        return self.n_near + self.n_unrelated - self.bluffs_near - self.bluffs_unrelated

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"bluff_rate": self.bluff_rate, "refused_ood": self.refused_ood}


def needed_ranks(
    queries: Sequence[QueryDistances],
    cuts: Sequence[float],
    keep: int = DEFAULT_KEEP,
    judged: int = DEFAULT_KEEP,
) -> dict[str, set[int]]:
    """Per query, every rank among the first ``judged`` the distance gate keeps at some cut in
    ``cuts`` (what the judge must score)."""
    return {q.query_id: {r for c in cuts for r in q.kept_ranks(c, keep)[:judged]} for q in queries}


def joint_sweep(
    answerable: Sequence[JudgedQuery],
    ood: Sequence[JudgedQuery],
    cuts: Sequence[float],
    judge_cuts: Sequence[float] = DEFAULT_JUDGE_CUTS,
    keep: int = DEFAULT_KEEP,
) -> list[JointRow]:
    """Count outcomes of the two-stage gate at every (distance cut, judge cut) pair."""
    if not answerable or not ood:
        raise ValueError("calibration needs at least one answerable and one out-of-domain query")
    n_near = sum(1 for q in ood if q.query.kind == "near")
    rows = []
    for cut in sorted(cuts):
        a_scores = [(q, q.judge_score(cut, keep)) for q in answerable]
        o_scores = [(q.query.kind, q.judge_score(cut, keep)) for q in ood]
        for jc in sorted(judge_cuts):
            correct = wrong = by_distance = by_judge = 0
            for q, s in a_scores:
                if s is None:
                    by_distance += 1
                elif s < jc:
                    by_judge += 1
                elif q.query.correct_ranks.intersection(q.query.kept_ranks(cut, keep)):
                    correct += 1
                else:
                    wrong += 1
            bluffing = [kind for kind, s in o_scores if s is not None and s >= jc]
            rows.append(
                JointRow(
                    cut=cut,
                    judge_cut=jc,
                    answered_correct=correct,
                    answered_wrong=wrong,
                    refused_distance=by_distance,
                    refused_judge=by_judge,
                    bluffs_near=bluffing.count("near"),
                    bluffs_unrelated=bluffing.count("unrelated"),
                    n_answerable=len(answerable),
                    n_near=n_near,
                    n_unrelated=len(ood) - n_near,
                )
            )
    return rows


@dataclass(frozen=True)
class JointChoice:
    """The chosen (distance cut, judge cut), the policy and why."""

    cut: float
    judge_cut: float
    policy: str
    reason: str
    row: JointRow
    satisfied: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "cut": self.cut,
            "judge_cut": self.judge_cut,
            "policy": self.policy,
            "reason": self.reason,
            "satisfied": self.satisfied,
            "row": self.row.to_dict(),
        }


def choose_joint(
    rows: Sequence[JointRow], max_bluff_rate: float = DEFAULT_MAX_BLUFF_RATE
) -> JointChoice:
    """Policy ``max_answered_under_bluff_rate``: of the pairs whose out-of-domain bluff rate is
    at most ``max_bluff_rate``, the one answering most answerable queries with a correct source;
    ties: fewer bluffs, then fewer wrong answers, then the smaller distance cut, then the larger
    judge cut. Judge cut 0 is the distance gate alone, so the pair is never worse than the
    distance-only calibration on the same queries. No pair meets the target: the pair with the
    fewest bluffs (then most answered), ``satisfied=False``."""
    if not rows:
        raise ValueError("empty sweep")
    ok = [r for r in rows if r.bluff_rate <= max_bluff_rate]
    if ok:
        row = min(
            ok,
            key=lambda r: (
                -r.answered_correct,
                r.bluffs_near + r.bluffs_unrelated,
                r.answered_wrong,
                r.cut,
                -r.judge_cut,
            ),
        )
        reason = (
            f"most answered with bluff rate <= {max_bluff_rate:.0%}: distance cut {row.cut:.3f} "
            f"then judge P(yes) >= {row.judge_cut:.2f} answers {row.answered_correct}/"
            f"{row.n_answerable} answerable correctly ({row.answered_wrong} wrong, "
            f"{row.refused_distance} refused by distance, {row.refused_judge} by the judge) and "
            f"bluffs on {row.bluffs_near}/{row.n_near} near and {row.bluffs_unrelated}/"
            f"{row.n_unrelated} unrelated ({row.bluff_rate:.1%})"
        )
        return JointChoice(row.cut, row.judge_cut, JOINT_POLICY, reason, row)
    row = min(rows, key=lambda r: (r.bluffs_near + r.bluffs_unrelated, -r.answered_correct, r.cut))
    reason = (
        f"no (distance, judge) pair keeps the bluff rate <= {max_bluff_rate:.0%}; fewest bluffs "
        f"at cut {row.cut:.3f}, judge {row.judge_cut:.2f} ({row.bluff_rate:.1%})"
    )
    return JointChoice(row.cut, row.judge_cut, JOINT_POLICY, reason, row, satisfied=False)


def judge_curve(rows: Sequence[JointRow], cut: float) -> list[JointRow]:
    """The rows at one distance cut, by judge cut (the refused-vs-answered curve)."""
    return sorted(
        (r for r in rows if math.isclose(r.cut, cut, abs_tol=1e-9)), key=lambda r: r.judge_cut
    )


def joint_table_markdown(rows: Sequence[JointRow], chosen: JointRow | None = None) -> str:
    """Markdown: per row, answered with the needle, refused OOD (near / unrelated)."""
    lines = [
        "| distance cut | judge cut | answered correct | wrong | refused by distance "
        "| refused by judge | OOD refused | near refused | unrelated refused |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [
            f"{r.cut:.3f}",
            f"{r.judge_cut:.2f}",
            f"{r.answered_correct}/{r.n_answerable}",
            str(r.answered_wrong),
            str(r.refused_distance),
            str(r.refused_judge),
            f"{r.refused_ood}/{r.n_near + r.n_unrelated}",
            f"{r.n_near - r.bluffs_near}/{r.n_near}",
            f"{r.n_unrelated - r.bluffs_unrelated}/{r.n_unrelated}",
        ]
        if chosen is not None and r == chosen:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
