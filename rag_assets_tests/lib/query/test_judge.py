"""The answer check after the distance gate: scoring, the extractive check, the cache, the joint
calibration, ``Index.ask`` refusals by the judge, and the judge on a real llama.cpp model."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from rag_assets.lib.evaluate import calibrate
from rag_assets.lib.models.llm import LLMClient, LLMError
from rag_assets.lib.models.llm_cache import CachedClient
from rag_assets.lib.query import judge as J
from rag_assets.lib.query.cite import JUDGE_REASON, build_context
from rag_assets.lib.types import Hit
from rag_assets_tests.lib.fake_llm import fake_llm, user_text

ROLLBACK = (
    "To go back to the previous embedding model, run rag-assets rollback: it points "
    "published.json at the previous entry of the history."
)
BREAD = "Sourdough needs a long, cool fermentation and a very hot oven for a crisp crust."


def _yes_if_rollback(body):
    yes = 0.9 if "rollback" in user_text(body).split("Passage:")[-1] else 0.05
    return ("Yes" if yes > 0.5 else "No"), {"Yes": yes, "No": 1 - yes - 0.01, "Maybe": 0.01}


def test_yes_probability_normalises_over_yes_and_no():
    top = {"Yes": math.log(0.6), " yes": math.log(0.1), "No": math.log(0.2), "X": math.log(0.1)}
    assert J.yes_probability(top) == pytest.approx(0.7 / 0.9)
    assert J.yes_probability({"Sure": 0.0}) == 0.0


def test_verbatim_source_accepts_only_real_copies():
    sources = ["Intro.\nTo go back to the previous\n  embedding model, run rollback.", BREAD]
    assert (
        J.verbatim_source("To go back to the previous embedding model, run rollback.", sources) == 1
    )
    assert J.verbatim_source('"[2] Sourdough needs a long, cool fermentation"', sources) == 2
    assert J.verbatim_source("NONE", sources) is None
    assert J.verbatim_source("run rollback", sources) is None  # too short to mean anything
    assert J.verbatim_source("To go back, run the rollback command.", sources) is None  # paraphrase


def test_per_source_judge_takes_the_max_and_the_cache_answers_repeats(tmp_path):
    with fake_llm(_yes_if_rollback) as (url, seen):
        judge = J.load_judge("llm", url, cache_dir=tmp_path / "cache", cut=0.5)
        assert judge is not None
        v = judge.check("How do I roll back?", [BREAD, ROLLBACK])
        assert v.per_source == pytest.approx([0.05 / 0.99, 0.9 / 0.99])
        assert v.score == max(v.per_source) and v.answers
        assert not judge.check("How do I roll back?", [BREAD]).answers
        n = len(seen)
        again = J.load_judge("llm", url, cache_dir=tmp_path / "cache", cut=0.5)
        assert again is not None
        assert again.check("How do I roll back?", [BREAD, ROLLBACK]).score == v.score
        assert len(seen) == n and again.llm.hits == 2  # both answered from disk
        assert seen[0]["max_tokens"] == 1 and seen[0]["logprobs"] is True


def test_cache_key_separates_models_and_requests(tmp_path):
    a = CachedClient(LLMClient("http://127.0.0.1:9", "model-a"), tmp_path)
    b = CachedClient(LLMClient("http://127.0.0.1:9", "model-b"), tmp_path)
    req = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 1}
    assert a.key(req) != b.key(req)
    assert a.key(req) != a.key(req | {"max_tokens": 2})
    assert a.key(req) == CachedClient(LLMClient("http://127.0.0.2:1", "model-a"), None).key(req)


def test_cache_key_names_the_served_model_when_none_is_configured(tmp_path):
    """Two servers with different models behind the same cache must not share entries; a
    server without /v1/models is keyed by the request alone."""
    req = {"messages": [{"role": "user", "content": "q"}], "max_tokens": 1}

    def yes(body):
        return "Yes", None

    with (
        fake_llm(yes, served="qwen-0.5b") as (u1, _),
        fake_llm(yes, served="qwen-1.5b") as (u2, _),
        fake_llm(yes) as (u3, _),
    ):
        k1 = CachedClient(LLMClient(u1), tmp_path).key(req)
        k2 = CachedClient(LLMClient(u2), tmp_path).key(req)
        k3 = CachedClient(LLMClient(u3), tmp_path).key(req)
    assert len({k1, k2, k3}) == 3
    assert k1 == CachedClient(LLMClient("http://127.0.0.1:9", "qwen-0.5b"), None).key(req)
    assert k3 == CachedClient(LLMClient("http://127.0.0.1:9", ""), None).key(req)


def test_no_logprobs_is_a_clear_error(tmp_path):
    with fake_llm(lambda body: ("Yes", None)) as (url, _):
        judge = J.load_judge("llm", url, cache_dir=None)
        assert judge is not None
        with pytest.raises(LLMError, match="logprob"):
            judge.check("q", ["p"])


def test_extractive_check_accepts_a_verbatim_copy_only():
    def reply(body):
        text = user_text(body)
        if "roll back" in text:
            return "To go back to the previous embedding model, run rag-assets rollback", None
        return "The oven should be hot.", None  # invented: not in any source

    with fake_llm(reply) as (url, _):
        llm = J.make_client(url)
        text, src = J.extract_answer(llm, "How do I roll back?", [BREAD, ROLLBACK])
        assert src == 2 and "rollback" in text
        assert J.extract_answer(llm, "How hot should the oven be?", [BREAD])[1] is None


def test_settings_errors_name_the_variable():
    assert J.load_judge("", "http://x") is None
    with pytest.raises(ValueError, match="RAG_ANSWER_CHECK"):
        J.load_judge("maybe", "http://127.0.0.1:1")
    with pytest.raises(ValueError, match="RAG_LLM_URL"):
        J.load_judge("llm", "")


def _q(qid, dists, correct=(), kind="answerable"):
    return calibrate.QueryDistances(qid, tuple(dists), frozenset(correct), kind)


def test_joint_sweep_at_judge_cut_zero_is_the_distance_gate():
    ans = [_q("a1", [0.3, 0.5], {1}), _q("a2", [0.55, 0.7], {2}), _q("a3", [0.8], {1})]
    ood = [
        _q("o1", [0.45], kind="near"),
        _q("o2", [0.6], kind="near"),
        _q("o3", [0.9], kind="unrelated"),
    ]
    scores = {"a1": {1: 0.9, 2: 0.2}, "a2": {1: 0.1, 2: 0.8}, "a3": {1: 0.7}}
    oscores = {"o1": {1: 0.3}, "o2": {1: 0.95}, "o3": {1: 0.0}}
    ja = [calibrate.JudgedQuery(q, scores[q.query_id]) for q in ans]
    jo = [calibrate.JudgedQuery(q, oscores[q.query_id]) for q in ood]
    cuts = [0.5, 0.65, 1.0]
    rows = calibrate.joint_sweep(ja, jo, cuts, judge_cuts=[0.0, 0.5, 0.99])
    plain = {r.cut: r for r in calibrate.sweep(ans, ood, cuts=cuts)}
    for r in rows:
        if r.judge_cut == 0.0:
            p = plain[r.cut]
            assert (r.answered_correct, r.bluffs_near, r.bluffs_unrelated) == (
                p.answered_correct,
                p.bluffs_near,
                p.bluffs_unrelated,
            )
            assert r.refused_judge == 0
    at = {(r.cut, r.judge_cut): r for r in rows}
    # cut 1.0, judge 0.5: a1 (0.9), a2 (0.8 via rank 2), a3 (0.7) answer; only o2 bluffs
    r = at[(1.0, 0.5)]
    assert (r.answered_correct, r.refused_judge, r.bluffs_near, r.bluffs_unrelated) == (3, 0, 1, 0)
    assert at[(1.0, 0.99)].refused_judge == 3 and at[(1.0, 0.99)].bluff_rate == 0.0
    choice = calibrate.choose_joint(rows, max_bluff_rate=0.34)
    assert (choice.cut, choice.judge_cut, choice.row.answered_correct) == (1.0, 0.5, 3)
    assert choice.satisfied and "judge" in choice.reason
    strict = calibrate.choose_joint(rows, max_bluff_rate=0.0)
    assert strict.row.bluff_rate == 0.0 and strict.satisfied


def test_judge_score_needs_every_kept_rank():
    q = calibrate.JudgedQuery(_q("a", [0.2, 0.3], {1}), {1: 0.4})
    assert q.judge_score(0.25) == 0.4 and q.judge_score(0.1) is None
    with pytest.raises(ValueError, match="no judge score"):
        q.judge_score(0.5)


def _hit(content, d, rank=1):
    return Hit(
        chunk_id=f"c{rank}",
        document_id="doc.md",
        section="S",
        start=0,
        end=len(content),
        content=content,
        text=content,
        page=None,
        score=1.0,
        rank=rank,
        retriever="hybrid",
        cosine_distance=d,
        title="T",
    )


def test_context_says_which_gate_refused():
    hit = _hit(ROLLBACK, 0.2)

    def context(threshold: float):
        return build_context(
            "q",
            [hit],
            threshold=threshold,
            canonical_text=lambda d: ROLLBACK,
            document_path=lambda d: "/tmp/doc.md",
        )

    far = context(0.1)
    assert far.no_answer and far.refused_by == "distance"
    assert far.reason.startswith("nothing under cosine distance")
    ctx = context(0.5)
    assert not ctx.no_answer and ctx.refused_by is None and ctx.reason == ""
    judged = ctx.refused_by_judge({"score": 0.12, "cut": 0.4})
    assert judged.no_answer and judged.refused_by == "judge" and judged.citations == []
    assert judged.reason == JUDGE_REASON and JUDGE_REASON in judged.message
    assert "0.12 < 0.40" in judged.message and judged.prompt == ""


def test_calibration_is_read_back_for_a_table_version(tmp_path):
    from rag_assets.lib.index.store import IndexStore

    store = IndexStore(tmp_path)
    path = J.calibration_path(tmp_path, "t", 3)
    path.parent.mkdir(parents=True)
    path.write_text('{"cut": 0.6, "judge": {"cut": 0.7, "judge_cut": 0.35}}')
    assert J.calibrated(store, "t", 3) == {"cut": 0.7, "judge_cut": 0.35}
    assert J.calibrated(store, "t", 4) is None
    path.write_text('{"cut": 0.6, "judge": null}')
    assert J.calibrated(store, "t", 3) is None


# -- the real thing ---------------------------------------------------------------------------
@pytest.mark.slow
def test_real_index_ask_refuses_by_judge_and_answers(
    tmp_path: Path, real_embedder, llama_server_small
):
    """A real index (sample corpus), the real 0.5B model: with the distance gate wide open, an
    off-topic question is refused by the judge and an on-topic one keeps its sources."""
    import shutil

    from rag_assets.lib.evaluate.questions import load_needle_set
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.query.retrieve import Index
    from rag_assets_tests.helpers import SAMPLE_DOCS, SAMPLE_EVAL

    docs = tmp_path / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    index_folder(docs, tmp_path / "index", strategy("E"), real_embedder)
    index = Index.open(tmp_path / "index", embedder=real_embedder, distance_cut=2.0)
    judge = J.load_judge("llm", llama_server_small, cache_dir=tmp_path / "cache", cut=0.5)
    assert judge is not None
    judge.sources = 2  # two requests per question keep the model time small
    judge.llm.client.timeout = 600  # a busy CI machine can queue a request for minutes
    index.judge = judge
    off = index.ask("What is the capital city of Australia?", rerank=False)
    assert off.no_answer and off.refused_by == "judge", off.judge
    assert off.judge is not None and off.judge["score"] < 0.5
    assert "judge" in index.timings.stages
    from rag_assets.lib.query.output import ask_json

    out = ask_json(off, None, index.published)  # what `ask --json` prints
    assert out["refused_by"] == "judge" and out["reason"] == JUDGE_REASON
    assert out["judge"]["score"] == off.judge["score"] and out["citations"] == []
    q = load_needle_set(SAMPLE_EVAL).questions[0]
    on = index.ask(q.queries["course"], rerank=False)
    assert on.judge is not None and len(on.judge["per_source"]) <= 2
    assert all(0.0 <= p <= 1.0 for p in on.judge["per_source"])
    # not asserted: on-topic scoring above off-topic. The 0.5B model does not separate them
    # (measured 0.28 vs 0.30); the judge's quality is measured with the 1.5B model instead.


def _overlap_judge(body):
    """Deterministic stand-in: P(yes) = share of the question's long words in the passage."""
    text = user_text(body)
    question = text.split("Passage:")[0].lower()
    passage = text.split("Passage:")[-1].lower()
    words = {w for w in re.findall(r"[a-z]{6,}", question)} - {"question", "passage"}
    p = min(0.98, max(0.02, len([w for w in words if w in passage]) / max(1, len(words))))
    return "Yes", {"Yes": p, "No": 1 - p}


@pytest.mark.slow
def test_eval_calibrates_the_joint_gate_and_the_asset_agrees(tmp_path: Path, real_embedder):
    """evaluate_needles with a judge on a real index: the refusal object keeps its keys, adds
    gate "distance+judge", never answers fewer than the distance gate at its own bluff target,
    and the refusal_threshold asset's calibration from the persisted scores picks the same pair."""
    import shutil

    from rag_assets.defs.evaluation import _judge_calibration
    from rag_assets.lib.evaluate.evaluate import evaluate_needles
    from rag_assets.lib.evaluate.questions import load_needle_set
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy
    from rag_assets.lib.query.retrieve import Index
    from rag_assets_tests.helpers import SAMPLE_DOCS, SAMPLE_EVAL

    docs = tmp_path / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    index_folder(docs, tmp_path / "index", strategy("E"), real_embedder)
    index = Index.open(tmp_path / "index", embedder=real_embedder)
    qset = load_needle_set(SAMPLE_EVAL)
    plain, _ = evaluate_needles(index, qset, ["hybrid"])
    with fake_llm(_overlap_judge) as (url, _):
        index.judge = J.load_judge("llm", url, cache_dir=tmp_path / "cache")
        result, refusal = evaluate_needles(index, qset, ["hybrid"])
    ref, base = result["refusal"], plain["refusal"]
    assert base["gate"] == "distance" and ref["gate"] == "distance+judge"
    assert set(base) - {"gate"} <= set(ref)
    assert ref["answered"] >= base["answered"] and ref["threshold"] >= base["threshold"]
    assert (
        ref["bluffs"] / ref["out_of_domain"] <= 0.10
        or base["bluffs"] / base["out_of_domain"] > 0.10
    )
    assert ref["curve"] and all(r["cut"] == ref["threshold"] for r in ref["curve"])
    for gate in (ref, base, ref["distance_only"]):  # per-query outcomes tally to the counts
        ans = list(gate["outcomes"]["answerable"].values())
        ood = list(gate["outcomes"]["out_of_domain"].values())
        assert ans.count("correct") == gate["answered"] and ood.count("bluff") == gate["bluffs"]
    assert refusal is not None and refusal.judge_scores
    data = {
        "answerable": [
            q.__dict__ | {"correct_ranks": sorted(q.correct_ranks)} for q in refusal.answerable
        ],
        "ood": [q.__dict__ | {"correct_ranks": []} for q in refusal.ood],
        "judge_scores": {
            k: {str(r): s for r, s in v.items()} for k, v in refusal.judge_scores.items()
        },
        "judge_sources": index.judge.sources,
    }
    cal = _judge_calibration(data, 0.10)
    assert cal is not None and (cal["cut"], cal["judge_cut"]) == (
        ref["threshold"],
        ref["judge_cut"],
    )
