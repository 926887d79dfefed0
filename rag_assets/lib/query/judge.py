"""The answer check after the distance gate: do the passed sources answer the question?

Two designs read the question and the sources together through the chat endpoint
(:mod:`rag_assets.lib.models.llm`; every request cached on disk by
:mod:`rag_assets.lib.models.llm_cache`):

* **per-source** (:func:`passage_yes_probability`): one request per (question, source) asking
  "does this passage answer the question? Yes/No", scored by P(yes) / (P(yes) + P(no)) from the
  first token's log-probabilities. The judge score of a context is the *maximum* over its
  sources: one answering source is enough, and a single long prompt with four sources is what
  the naive judge measured worse than distance (AUROC 0.81). The same score ranks passages in
  the LLM reranker, so the two share their cached requests.
* **extractive** (:func:`extract_answer`): the model must copy the sentence that answers, or
  say NONE; the check accepts only a copy of at least :data:`MIN_EXTRACT_CHARS` characters found
  verbatim (after whitespace normalisation) in one source, so the model cannot fake it.

The judge never replaces the distance gate: it runs only on contexts that passed it, and its
cut is calibrated jointly with the distance cut
(:func:`rag_assets.lib.evaluate.calibrate.judge_sweep`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.models.llm import LLMClient
from rag_assets.lib.models.llm_cache import CachedClient
from rag_assets.lib.types import normalize_ws

SETTING = "RAG_ANSWER_CHECK"
MODES = ("llm",)
REFUSAL_REASON = "sources do not answer"
"""The judge's refusal reason, distinct from the distance gate's."""

DEFAULT_JUDGE_CUT = 0.5
"""Judge cut used until a calibrated one exists: accept when max P(yes) over sources >= cut."""

MAX_PASSAGE_CHARS = 1500
"""A source is cut to this many characters in the judge prompt (chunks are ~512 + header)."""

MIN_EXTRACT_CHARS = 20
"""An extracted sentence shorter than this is not accepted (a few words match anywhere)."""

TOP_LOGPROBS = 10
"""Alternatives requested for the first token; Yes/No are always among them in practice."""

PASSAGE_SYSTEM = (
    "You check whether a passage from technical documentation answers a user's question. "
    "Reply with exactly one word: Yes or No."
)
PASSAGE_USER = (
    "Question: {question}\n\nPassage:\n{passage}\n\n"
    "Does this passage contain the answer to the question? Reply Yes or No."
)
EXTRACT_SYSTEM = (
    "You find the answer to a question in numbered sources. Copy, word for word, the one "
    "sentence from the sources that answers the question. If no sentence in the sources "
    "answers it, reply NONE. Reply with the copied sentence or NONE only."
)
PROMPT_VERSION = "judge-1"
"""Bumped when a prompt above changes (recorded with calibrations)."""


def passage_messages(question: str, passage: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": PASSAGE_SYSTEM},
        {
            "role": "user",
            "content": PASSAGE_USER.format(
                question=question.strip(), passage=passage.strip()[:MAX_PASSAGE_CHARS]
            ),
        },
    ]


def yes_probability(top: dict[str, float]) -> float:
    """P(yes) / (P(yes) + P(no)) from one position's top log-probabilities (0.0 when neither
    word is among them: the model answered something else, which is not a yes)."""
    yes = sum(math.exp(lp) for t, lp in top.items() if t.strip().lower() == "yes")
    no = sum(math.exp(lp) for t, lp in top.items() if t.strip().lower() == "no")
    return yes / (yes + no) if yes + no > 0 else 0.0


def passage_yes_probability(llm: CachedClient | LLMClient, question: str, passage: str) -> float:
    """The per-source judge score of one (question, passage) pair, in [0, 1]."""
    out = llm.chat(
        passage_messages(question, passage), max_tokens=1, top_logprobs=TOP_LOGPROBS, seed=0
    )
    if not out.top_logprobs:
        from rag_assets.lib.models.llm import LLMError

        raise LLMError(
            "the endpoint returned no log-probabilities; the judge and the LLM reranker need a "
            "server that supports logprobs/top_logprobs (llama.cpp, vLLM)"
        )
    return yes_probability(out.top_logprobs[0])


def extract_messages(question: str, sources: Sequence[str]) -> list[dict[str, str]]:
    blocks = [f"[{i}] {s.strip()[:MAX_PASSAGE_CHARS]}" for i, s in enumerate(sources, start=1)]
    user = "Sources:\n\n" + "\n\n".join(blocks) + f"\n\nQuestion: {question.strip()}"
    return [{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": user}]


_LEAD = re.compile(r'^\s*(\[\d+\]|["“\'`]|source\s*\d+\s*:|sentence\s*:|answer\s*:)', re.I)
_TAIL = re.compile(r'["”\'`]*\s*$')


def _strip_lead(text: str) -> str:
    """Drop leading quotes, ``[n]`` markers and "Answer:"-style labels, in any order."""
    while (stripped := _LEAD.sub("", text, count=1)) != text:
        text = stripped
    return text


def verbatim_source(reply: str, sources: Sequence[str]) -> int | None:
    """1-based source holding ``reply`` verbatim (whitespace-normalised), else None."""
    text = normalize_ws(_TAIL.sub("", _strip_lead(reply.strip())))
    if len(text) < MIN_EXTRACT_CHARS or text.upper().startswith("NONE"):
        return None
    for i, s in enumerate(sources, start=1):
        if text in normalize_ws(s):
            return i
    return None


def extract_answer(
    llm: CachedClient | LLMClient, question: str, sources: Sequence[str]
) -> tuple[str, int | None]:
    """The model's reply and the source it copied from (None: NONE, or not found verbatim)."""
    out = llm.chat(extract_messages(question, sources), max_tokens=96, seed=0)
    return out.text.strip(), verbatim_source(out.text, sources)


@dataclass
class Verdict:
    """What the judge said about one context."""

    score: float  # max P(yes) over sources
    per_source: list[float] = field(default_factory=list)
    cut: float = DEFAULT_JUDGE_CUT

    @property
    def answers(self) -> bool:
        return self.score >= self.cut

    def to_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "per_source": self.per_source,
            "cut": self.cut,
            "answers": self.answers,
        }


JUDGED_SOURCES = 4
"""The judge reads the first this-many sources the distance gate kept (one request each)."""


@dataclass
class Judge:
    """Per-source judge with a cut (calibrated, else :data:`DEFAULT_JUDGE_CUT`) over the first
    ``sources`` kept sources."""

    llm: CachedClient
    cut: float = DEFAULT_JUDGE_CUT
    sources: int = JUDGED_SOURCES

    def scores(self, question: str, passages: Sequence[str]) -> list[float]:
        return [passage_yes_probability(self.llm, question, p) for p in passages]

    def check(self, question: str, passages: Sequence[str]) -> Verdict:
        per = self.scores(question, passages[: self.sources])
        return Verdict(max(per, default=0.0), per, self.cut)

    @property
    def provenance(self) -> dict[str, Any]:
        return {
            "design": "per-source max P(yes)",
            "model": self.llm.model_name,
            "prompt": PROMPT_VERSION,
        }


def make_client(
    url: str, model: str | None = None, api_key: str | None = None, cache_dir: Path | None = None
) -> CachedClient:
    """A cached client for ``RAG_LLM_URL`` (raises with the setting named when empty)."""
    if not url or not url.strip():
        raise ValueError("this needs a model endpoint: set RAG_LLM_URL (and RAG_LLM_MODEL)")
    return CachedClient(LLMClient(url, model or None, api_key or None), cache_dir)


def load_judge(
    setting: str | None,
    llm_url: str | None = None,
    llm_model: str | None = None,
    api_key: str | None = None,
    cache_dir: Path | None = None,
    cut: float | None = None,
) -> Judge | None:
    """The judge for ``RAG_ANSWER_CHECK`` (None when off); a bad value fails naming it."""
    if setting is None or not setting.strip():
        return None
    if setting.strip().lower() not in MODES:
        raise ValueError(f"{SETTING}={setting!r}: use 'llm' (or leave it empty to turn it off)")
    if not llm_url or not llm_url.strip():
        raise ValueError(f"{SETTING}=llm needs a model endpoint: set RAG_LLM_URL")
    return Judge(
        make_client(llm_url, llm_model, api_key, cache_dir),
        DEFAULT_JUDGE_CUT if cut is None else cut,
    )


def llm_cache_dir(work_dir: str | Path) -> Path:
    """Where cached model replies live: ``<RAG_WORK_DIR>/llm-cache``."""
    return Path(work_dir) / "llm-cache"


def llm_options(settings: Any, rerank: bool = True) -> dict[str, Any]:
    """Endpoint keyword arguments for :func:`load_judge` / ``load_reranker`` from Settings."""
    out: dict[str, Any] = {
        "llm_url": settings.llm_url or None,
        "llm_model": settings.llm_model or None,
        "api_key": settings.llm_api_key or None,
        "cache_dir": llm_cache_dir(settings.work_dir),
    }
    if rerank:
        out["depth"] = settings.rerank_depth
        # issue 35: a /rerank server (RAG_RERANK_URL) takes precedence over RAG_RERANK_MODEL
        out["rerank_url"] = getattr(settings, "rerank_url", "") or None
        out["rerank_api_key"] = getattr(settings, "rerank_api_key", "") or None
        out["rerank_timeout"] = getattr(settings, "rerank_timeout", None)
    return out


def calibration_name(table: str, version: int) -> str:
    """The store file (a file under ``<index>/evaluation/``, a ``_rag_files`` row on object
    storage) the ``refusal_threshold`` asset writes for one table version."""
    return f"evaluation/{table}@{version}.threshold.json"


def calibration_path(uri: str | Path, table: str, version: int) -> Path:
    """That file in a local index directory."""
    return Path(uri) / calibration_name(table, version)


def calibrated(store: Any, table: str, version: int) -> dict[str, Any] | None:
    """The persisted joint calibration ``{"cut", "judge_cut", "policy", "reason", ...}`` of a
    table version (``store``: an :class:`~rag_assets.lib.index.store.IndexStore`), or None
    when the index was calibrated without the judge."""
    import json

    text = store.read_text(calibration_name(table, version))
    if text is None:
        return None
    data = json.loads(text).get("judge")
    return data if isinstance(data, dict) and "judge_cut" in data else None


def apply_judge(index: Any, settings: Any) -> None:
    """Attach the judge for ``RAG_ANSWER_CHECK`` to an open ``Index``: with a persisted joint
    calibration its judge cut, and its distance cut unless ``RAG_DISTANCE_CUT`` overrides."""
    judge = load_judge(settings.answer_check, **llm_options(settings, rerank=False))
    if judge is None:
        return
    cal = calibrated(index.store, index.published.table, index.published.version)
    if cal is not None:
        judge.cut = float(cal["judge_cut"])
        judge.sources = int(cal.get("sources") or judge.sources)
        if not settings.distance_cut:
            index.distance_cut = float(cal["cut"])
    index.judge = judge
