"""Which questions evaluate a corpus, and where they come from (the ``eval_questions`` stage).

Every corpus gets an evaluation, in this order of preference:

1. ``hand-written`` / ``reviewed``: a needle-format set at ``RAG_EVAL_DIR`` that belongs to the
   corpus (at least :data:`MIN_MATCHING_SHARE` of its needles are in the documents). It is
   ``reviewed`` when its rows carry the ``generated`` provenance of a generated set (a person
   exported, edited or struck rows and pointed ``RAG_EVAL_DIR`` at the copy), else ``hand-written``.
   A reviewed or hand-written set always wins over a generated one.
   Reviewed queries from the query log are merged into it (``hand-written+traffic``).
2. ``traffic``: the reviewed queries of the query log alone (:func:`traffic_decision`,
   :mod:`.traffic`), once they hold the counts calibration needs (20 answerable, 20
   out-of-domain); until then the sources below stand and say how many more reviews are needed.
3. ``generated``: written by the model at ``RAG_LLM_URL`` (:mod:`.questions_gen`), sized by the
   corpus, every request cached on disk under the served model's name, so a later run resumes
   and an edit re-asks only what changed. A run spends at most ``RAG_EVAL_BUDGET_S`` seconds on
   it; an unfinished set is kept (``complete: false``) and the table is gated by the
   unrelated-only cut until a later run completes it.
4. ``unrelated-only``: no set and no model: the shipped questions about other topics
   (:func:`.day0.other_topics`) calibrate the day-0 cut (:func:`.calibrate.choose_day0_cut`,
   issue 53); recall is not measured.

A set whose needles are mostly not in the corpus is never used (``unevaluated`` is only what is
left when even those questions cannot be scored, e.g. an empty table).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.evaluate import questions_gen
from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.types import normalize_ws

#: A question set belongs to a corpus when at least this share of its needles (the exact answer
#: text of each question) is found in the corpus' documents; below it the set is not used:
#: recall on a set written for other documents measures nothing.
MIN_MATCHING_SHARE = 0.5
#: Seconds of model time one run may spend writing the generated set (RAG_EVAL_BUDGET_S).
DEFAULT_BUDGET_S = 300.0
SOURCES = (
    "hand-written",
    "reviewed",
    "traffic",  # issue 33: reviewed queries from the query log (lib/evaluate/traffic.py)
    "hand-written+traffic",
    "reviewed+traffic",
    "generated",
    "unrelated-only",
    "unevaluated",
)
TRAFFIC_SOURCES = ("traffic", "hand-written+traffic", "reviewed+traffic")
STATE_FILE = "state.json"


@dataclass
class Decision:
    """The question source of one evaluation: ``source`` (one of :data:`SOURCES`), the set's
    folder (None for unrelated-only), its counts, and the notes that explain the choice."""

    source: str
    path: str | None
    counts: dict[str, int] = field(default_factory=dict)
    model: str = ""
    complete: bool = True
    notes: list[str] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    # issue 33: reviewed traffic's progress towards calibrating the cut (review_progress)
    traffic: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How ``status`` and the UI name it: ``generated (model …)`` etc."""
        if self.source == "generated":
            return f"generated (model {self.model})" + ("" if self.complete else ", unfinished")
        return self.source

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"label": self.label}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        keys = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in keys})


def matching_share(qdir: Path, texts: dict[str, str]) -> tuple[int, int]:
    """(needles found in the documents, needles) of the set at ``qdir`` (whitespace-collapsed
    match, as PDF needles are written)."""
    qset = load_needle_set(qdir)
    joined = normalize_ws("\n".join(texts.values()))
    found = sum(1 for q in qset.questions if normalize_ws(q.needle) in joined)
    return found, len(qset.questions)


def files_digest(qdir: Path) -> str:
    """SHA-256 over a set's ``questions.jsonl`` and ``out_of_domain.jsonl`` (names and bytes):
    two evaluations with the same digest asked the very same questions."""
    h = hashlib.sha256()
    for name in ("questions.jsonl", "out_of_domain.jsonl"):
        f = qdir / name
        h.update(name.encode() + (f.read_bytes() if f.is_file() else b""))
    return h.hexdigest()


def counts_of(qdir: Path) -> dict[str, int]:
    qset = load_needle_set(qdir)
    return {
        "questions": len(qset.questions),
        "queries": len(qset.queries()),
        "near": sum(1 for o in qset.out_of_domain if o.kind == "near"),
        "unrelated": sum(1 for o in qset.out_of_domain if o.kind == "unrelated"),
    }


def is_reviewed(qdir: Path) -> bool:
    """A set exported from a generated one (its rows keep their ``generated`` provenance)."""
    f = qdir / "questions.jsonl"
    for line in f.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return "generated" in json.loads(line)
    return False


def configured_set(eval_dir: str | Path | None, texts: dict[str, str]) -> Decision | None:
    """The set at ``RAG_EVAL_DIR`` when it belongs to these documents, else None (with why in
    the returned decision's notes when it exists but belongs elsewhere)."""
    if not eval_dir:
        return None
    qdir = Path(eval_dir)
    if not (qdir / "questions.jsonl").is_file():
        return None
    found, total = matching_share(qdir, texts)
    if total == 0 or found < MIN_MATCHING_SHARE * total:
        return Decision(
            "unevaluated",
            None,
            notes=[
                f"the question set at {qdir} (RAG_EVAL_DIR) does not belong to this corpus: "
                f"{total - found} of {total} needles are not in these documents; not used"
            ],
        )
    source = "reviewed" if is_reviewed(qdir) else "hand-written"
    return Decision(source, str(qdir), counts_of(qdir), notes=[f"{found} of {total} needles found"])


def traffic_decision(
    log: Any, texts: dict[str, str], out_dir: Path, configured: Decision | None, shown: str = ""
) -> tuple[Decision | None, dict[str, Any]]:
    """Issue 33: reviewed traffic as the evaluation set, written to ``out_dir``
    (:func:`.traffic.write_traffic_set`); ``shown`` is where the set is, for people.

    Returns (decision, review progress). With a hand-written or reviewed ``configured`` set the
    two are merged (``hand-written+traffic``) as soon as traffic holds a usable question, else
    ``configured`` stands. Alone, traffic is the source (``traffic``) once it has the counts
    calibration needs; before that the decision is None (the caller falls back, and says how
    many more reviews of each kind are needed)."""
    from rag_assets.lib.evaluate import traffic

    base = (
        Path(configured.path)
        if configured is not None
        and configured.path
        and configured.source in ("hand-written", "reviewed")
        else None
    )
    made = traffic.write_traffic_set(log, texts, out_dir, base)
    progress = made.progress | {"dropped": len(made.dropped)}
    where = shown or str(out_dir)
    dropped = (
        [
            f"{len(made.dropped)} reviewed questions dropped: their answer text is no longer in "
            "the documents"
        ]
        if made.dropped
        else []
    )
    if base is not None and configured is not None:
        if made.empty:
            configured.traffic = progress
            return configured, progress
        merged = Decision(
            f"{configured.source}+traffic",
            where,
            counts_of(out_dir)
            | {
                "traffic_queries": made.counts["queries"],
                "traffic_out_of_domain": made.counts["out_of_domain"],
                "dropped": len(made.dropped),
            },  # fmt: skip
            notes=[
                *configured.notes,
                f"merged with {made.counts['queries']} answerable and "
                f"{made.counts['out_of_domain']} out-of-domain reviewed queries",
                *dropped,
            ],
            traffic=progress,
        )
        return merged, progress
    if not made.ready:
        return None, progress
    decision = Decision(
        "traffic",
        where,
        counts_of(out_dir) | {"reviews": made.counts["reviews"], "dropped": len(made.dropped)},
        notes=[traffic.progress_line(made.progress), *dropped],
        traffic=progress,
    )
    return decision, progress


def generate_set(
    documents: dict[str, dict[str, Any]],
    n_chunks: int,
    llm: Any,
    out_dir: Path,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    seed: int = 0,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[str], None] | None = None,
) -> Decision:
    """Write (or bring up to date) the generated set in ``out_dir`` within ``budget_s`` seconds.

    The set is written to a temporary folder and renamed over ``out_dir`` only when written, so
    a killed run leaves the previous set; the LLM cache makes the next run resume."""
    cands = questions_gen.candidate_needles(documents)
    n = questions_gen.set_size(n_chunks, len(cands))
    deadline = clock() + budget_s
    out = questions_gen.generate(
        documents, llm, n=n, seed=seed, progress=progress, deadline=deadline, clock=clock
    )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    questions_gen.write(out, tmp)
    prov = out.provenance
    decision = Decision(
        "generated",
        str(out_dir),
        {
            "questions": prov["questions"],
            "queries": 2 * prov["questions"],
            "near": prov["near"],
            "unrelated": prov["unrelated"],
            "wanted": n,
        },
        model=prov["model"],
        complete=bool(prov["complete"]),
        cost={k: prov[k] for k in ("llm_calls", "cached_calls", "seconds")},
    )
    if not decision.complete:
        decision.notes.append(
            f"generated set unfinished after the {budget_s:.0f} s budget (RAG_EVAL_BUDGET_S): "
            f"{prov['questions']}/{n} needles, {prov['near']}/{n + questions_gen.NEAR_EXTRA} "
            "near-misses; the next run resumes from the cache"
        )
    (tmp / STATE_FILE).write_text(json.dumps(decision.to_dict(), indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return decision


def last_generated(out_dir: Path) -> Decision | None:
    """The generated set a previous run left in ``out_dir``, or None."""
    f = out_dir / STATE_FILE
    if not f.is_file():
        return None
    try:
        return Decision.from_dict(json.loads(f.read_text(encoding="utf-8")))
    except (ValueError, TypeError):
        return None


def usable_for_calibration(decision: Decision) -> bool:
    """A set calibrates the cut when it has needles and enough out-of-domain questions; an
    unfinished generated set does not (its near-misses are the last part written)."""
    if decision.path is None or not decision.complete:
        return False
    return decision.counts.get("questions", 0) > 0
