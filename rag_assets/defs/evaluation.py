"""Evaluation, calibration and publishing assets (downstream of chunk_embeddings).

A model change re-materialises chunk_embeddings into a new table; these assets then measure
that table, calibrate its refusal cut, and only then switch the published pointer to it.
"""

import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.adapt import adaptation_report, report_line
from rag_assets.defs.progress import SearchCounter
from rag_assets.defs.questions import generated_folder, read_decision
from rag_assets.defs.resources import (
    ASSET_LEASE_WAIT_S,
    DocumentsFolder,
    EmbeddingModel,
    LanceIndex,
    QuestionSet,
    RerankModel,
)
from rag_assets.defs.traffic_set import traffic_copy
from rag_assets.lib.evaluate import calibrate
from rag_assets.lib.evaluate.day0 import (
    day0_cache_dir,
    other_topics,
    other_topics_digest,
    other_topics_distances,
)
from rag_assets.lib.evaluate.evaluate import (
    ablation,
    compare_to_published,
    default_retriever,
    evaluate_needles,
    markdown_tables,
    plot_refusal,
)
from rag_assets.lib.evaluate.question_source import (
    MIN_MATCHING_SHARE,
    TRAFFIC_SOURCES,
    Decision,
    files_digest,
)
from rag_assets.lib.evaluate.questions import load_needle_set
from rag_assets.lib.index.pipeline import digest, index_folder
from rag_assets.lib.index.store import IndexStore, Published, now_iso, shown_uri
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import PRESETS, ChunkStrategy
from rag_assets.lib.ingest.chunk import strategy as chunk_strategy
from rag_assets.lib.query.cite import DEFAULT_DISTANCE_CUT
from rag_assets.lib.query.output import DAY0_NOTE
from rag_assets.lib.query.retrieve import Index

#: What the evaluation gate depends on beside chunk_embeddings: these re-run only together.
EVALUATED_TAIL = ("retrieval_eval", "refusal_threshold", "published_index")


def eval_name(entry: Published, name: str) -> str:
    """The store file (:mod:`rag_assets.lib.index.store.files`) of one table version's
    evaluation artefact: a file under ``<index>/evaluation/``, or a ``_rag_files`` row."""
    return f"evaluation/{entry.table}@{entry.version}.{name}"


def _read_json(store: IndexStore, entry: Published, name: str) -> dict[str, Any] | None:
    text = store.read_text(eval_name(entry, name))
    return None if text is None else dict(json.loads(text))


def _need_json(store: IndexStore, entry: Published, name: str) -> dict[str, Any]:
    data = _read_json(store, entry, name)
    if data is None:
        raise FileNotFoundError(
            f"{store.file_location(eval_name(entry, name))} is missing: materialise "
            "retrieval_eval and refusal_threshold for this table version first"
        )
    return data


def build_evaluation_assets(
    chunk_embeddings: Any,
    stamps: Stamps,
    strategy: ChunkStrategy,
    automation: Any,
    eval_questions: Any,
) -> list[Any]:
    eval_code_version = "eval-4"  # issue 50: + the answer verifier's detection

    @dg.asset(
        deps=[chunk_embeddings, eval_questions],
        group_name="evaluation",
        code_version=eval_code_version,
        automation_condition=automation,
        output_required=False,  # not re-run (and nothing downstream) when its inputs are unchanged
    )
    def retrieval_eval(
        context: dg.AssetExecutionContext,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
        rerank_model: RerankModel,
        questions: QuestionSet,
    ) -> Iterator[dg.MaterializeResult]:
        """Recall@1/4/8/20 and MRR with Wilson 95 % intervals for every retriever, paired
        sign tests, on the freshly embedded (not yet published) table, with the questions
        `eval_questions` chose (hand-written, reviewed or generated).

        With no such set (*unrelated-only*), recall is not measured: the shipped unrelated
        questions are run through the gate so that `refusal_threshold` can still choose a cut.
        Skipped when Dagster's data versions say nothing it reads changed since it, the cut and
        the publish last ran."""
        store = lance_index.store()
        entry = store.staging()
        decision = read_decision(store) or Decision("unrelated-only", None)
        qdir = Path(decision.path) if decision.path else None
        if decision.source == "generated" and store.remote:  # rows: a local working copy
            qdir = generated_folder(store, lance_index.work_dir)
        if decision.source in TRAFFIC_SOURCES and store.remote:  # issue 33: a scratch copy
            qdir = traffic_copy(store)
        fingerprint = _inputs_fingerprint(qdir, decision, questions, rerank_model)
        unchanged = _evaluation_unchanged(context, store, entry, fingerprint, questions)
        if unchanged:
            context.log.info(f"evaluation not re-run: {unchanged}")
            return
        carried = _carried_over(store, entry, fingerprint)
        if carried is not None:  # issue 34: only metadata changed, the figures hold
            yield _carry_over(context, store, entry, *carried)
            return
        total = 0
        # the staged table's own model: an adapted one when it is embedded with it (issue 32)
        embedder = embedding_model.embedder_for_table(store, entry.stamps, lance_index.work_dir)
        index = Index(store, entry, embedder, rerank_model.reranker())
        searches = SearchCounter(context, index)  # issue 31: progress lines, phase by phase
        refusal = None
        if qdir is None or not decision.counts.get("questions"):
            result: dict[str, Any] = {"needles": 0, "notes": [], "retrievers": {}}
            verdict = _verdict(
                "unrelated-only" if entry.rows else "empty",
                "; ".join(decision.notes) or "no question set for this corpus: recall not measured",
            )
            if not entry.rows:
                verdict["reason"] = (
                    "the table has no chunks: nothing to publish (is RAG_DOCUMENTS_DIR empty?)"
                )
        else:
            qset = load_needle_set(qdir)
            total = len(qset.questions)
            index.judge = rerank_model.judge()  # RAG_ANSWER_CHECK=llm: calibrate the judge too
            searches.start("questions", _planned_searches(qset, index))
            result, refusal = evaluate_needles(
                index,
                qset,
                strategy=strategy.name,
                max_bluff_rate=questions.max_bluff_rate,
            )
            verdict = _corpus_verdict(result, total, qdir, entry.rows)
            if verdict["evaluation"] == "evaluated":  # issue 50: the answer verifier, per table
                result["verification"] = _verification(context, index, qset, rerank_model)
        verdict["source"] = decision.label
        verdict["source_counts"] = decision.counts
        needs_unrelated = (
            refusal is None
            or not decision.complete
            or decision.source == "generated"  # its near-misses are bounded by the model-free cut
            or len(refusal.ood) < calibrate.MIN_OOD_QUESTIONS
        )
        # issue 53: the day-0 cut's questions about other topics, nearest chunk each (one batch)
        other: list[calibrate.QueryDistances] = []
        if needs_unrelated and entry.rows:
            searches.start("other-topics", len(other_topics()))
            other = other_topics_distances(index, day0_cache_dir())
            searches.finish()
        main = "rerank" if "rerank" in result["retrievers"] else "hybrid"
        r20 = (
            result["retrievers"][main]["recall@20"]["value"]
            if verdict["evaluation"] == "evaluated"
            else 0.0
        )
        verdict |= {"retriever": main, "recall@20": r20, "fingerprint": fingerprint}
        verdict["questions_digest"] = files_digest(qdir) if qdir else None
        result["verdict"] = verdict
        result["upgrade"] = _against_published(store, entry, result)
        result["adaptation"] = adaptation_report(store, entry.stamps)  # issue 32, or None
        refusal_name = eval_name(entry, "refusal.json")
        calibrates = refusal is not None and verdict["evaluation"] == "evaluated"
        refusal_text = None  # no sweep: an earlier run's must not calibrate this version
        if calibrates or other:
            refusal_text = json.dumps(
                {
                    "retriever": refusal.retriever if refusal else default_retriever(index),
                    "source": decision.label,
                    "complete": decision.complete,
                    "answerable": [
                        q.__dict__ | {"correct_ranks": sorted(q.correct_ranks)}
                        for q in (refusal.answerable if calibrates and refusal else [])
                    ],
                    "ood": [
                        q.__dict__ | {"correct_ranks": []}
                        for q in (refusal.ood if calibrates and refusal else [])
                    ],
                    # issue 53: the questions about other topics, nearest chunk's distance each
                    "other_topics": {
                        "digest": other_topics_digest(),
                        "ids": [q.query_id for q in other],
                        "distances": [q.distances[0] for q in other],
                    },
                    "judge_scores": refusal.judge_scores if calibrates and refusal else None,
                    "judge_sources": index.judge.sources if index.judge else None,
                }
            )
        # the report and its sweep together: one commit on object storage
        store.write_files(
            {eval_name(entry, "json"): json.dumps(result, indent=2), refusal_name: refusal_text}
        )
        stable = {k: v for k, v in result.items() if k != "notes"}
        if verdict["evaluation"] in ("unevaluated", "unrelated-only"):
            context.log.warning(f"{verdict['evaluation']}: {verdict['reason']}")
        yield dg.MaterializeResult(
            data_version=dg.DataVersion(digest(stable)),
            metadata={
                "table": entry.table,
                "evaluation": verdict["evaluation"],
                "evaluation_note": verdict["reason"],
                "question_source": decision.label,
                "question_set": dg.MetadataValue.path(
                    str(qdir or "shipped questions about other topics")
                ),
                "other_topics_questions": dg.MetadataValue.int(len(other)),
                "questions": dg.MetadataValue.int(total),
                "needles": dg.MetadataValue.int(result["needles"]),
                "destroyed": dg.MetadataValue.int(result.get("destroyed", 0)),
                "broken_questions": dg.MetadataValue.int(len(result.get("broken_questions", []))),
                f"{main}_recall@20": dg.MetadataValue.float(float(r20)),
                **_numeric_eval_metadata(result),
                **_verification_metadata(result.get("verification")),
                "inputs_fingerprint": fingerprint,
                "against_published": dg.MetadataValue.md(
                    result["upgrade"]["table"] if result["upgrade"] else "nothing to compare with"
                ),
                "results": dg.MetadataValue.md(
                    (
                        markdown_tables(result)
                        if result["retrievers"]
                        else f"**{verdict['evaluation']}**: {verdict['reason']}"
                    )
                    + _adaptation_md(result["adaptation"])
                ),
                **_adaptation_metadata(result["adaptation"]),
            },
        )

    @dg.asset_check(
        asset=retrieval_eval,
        blocking=True,
        description="Blocking gate: recall@20 of the default retriever (rerank when a model is "
        "configured, else hybrid) is at least RAG_RECALL_FLOOR on the question set. Fails "
        "blocking on an index with no chunks; passes with a WARN explanation when the table is "
        "unevaluated (no question set belongs to this corpus), so the index still publishes.",
    )
    def recall_at_20_above_floor(
        lance_index: LanceIndex, questions: QuestionSet
    ) -> dg.AssetCheckResult:
        store = lance_index.store()
        result = _need_json(store, store.staging(), "json")
        v = result["verdict"]
        meta = {
            "evaluation": v["evaluation"],
            "reason": v["reason"],
            "retriever": v["retriever"],
            "recall@20": dg.MetadataValue.float(float(v["recall@20"])),
            "floor": dg.MetadataValue.float(float(questions.recall_floor)),
            "valid_questions": dg.MetadataValue.int(int(result["needles"])),
            "notes": "; ".join(result.get("notes", [])) or "none",
        }
        if v["evaluation"] == "unrelated-only":  # healthy, just not measured: not a failure
            meta["recall"] = "not measured: no question set for this corpus (see eval_questions)"
            return dg.AssetCheckResult(passed=True, metadata=meta)
        if v["evaluation"] == "unevaluated":
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=meta
            )
        if v["evaluation"] == "empty":
            return dg.AssetCheckResult(passed=False, metadata=meta)
        return dg.AssetCheckResult(passed=v["recall@20"] >= questions.recall_floor, metadata=meta)

    @dg.asset_check(
        asset=retrieval_eval,
        blocking=True,
        description="Blocking gate on a model upgrade: when the published table was evaluated on "
        "the same questions, the new table publishes only if it is not significantly worse "
        "(paired sign tests, p < 0.05, on hit@4 and on answered-with-the-needle at each table's "
        "calibrated cut). Passes when there is nothing to compare with.",
    )
    def not_worse_than_published(lance_index: LanceIndex) -> dg.AssetCheckResult:
        store = lance_index.store()
        result = _need_json(store, store.staging(), "json")
        up = result.get("upgrade")
        if not up:
            return dg.AssetCheckResult(
                passed=True,
                metadata={"compared": "no published table evaluated on the same questions"},
            )
        meta: dict[str, Any] = {"table": dg.MetadataValue.md(up["table"])}
        for name, test in up["tests"].items():
            meta[f"{name}/wins"] = dg.MetadataValue.int(int(test["wins"]))
            meta[f"{name}/losses"] = dg.MetadataValue.int(int(test["losses"]))
            meta[f"{name}/p"] = dg.MetadataValue.float(float(test["p"]))
        return dg.AssetCheckResult(passed=not up["worse"], metadata=meta)

    @dg.asset(
        deps=[retrieval_eval],
        group_name="evaluation",
        code_version="calibrate-4",
        automation_condition=automation,
    )
    def refusal_threshold(
        context: dg.AssetExecutionContext, lance_index: LanceIndex, questions: QuestionSet
    ) -> dg.MaterializeResult:
        """The cosine-distance cut under which the gate answers: the largest cut whose bluff
        rate on out-of-domain questions is at most the target (RAG_MAX_BLUFF_RATE). Its source is
        recorded: *calibrated* (swept on the question set's answerable and out-of-domain
        questions, at least 20 of them), *unrelated-only* (no usable set, issue 53: the largest cut
        at which at most a tenth of the target share of 3,082 shipped questions about other
        topics find a source; it fails closed), *default* (0.675: nothing to calibrate on) or
        *override* (RAG_DISTANCE_CUT)."""
        store = lance_index.store()
        entry = store.staging()
        verdict = _need_json(store, entry, "json")["verdict"]
        data: dict[str, Any] = _read_json(store, entry, "refusal.json") or {}
        answerable = [_qd(q) for q in data.get("answerable", [])]
        ood = [_qd(q) for q in data.get("ood", [])]
        other = _other_topics(data)  # issue 53: the day-0 cut's questions
        meta: dict[str, Any] = {}
        warning = ""  # issue 53: the day-0 cut failed closed (a folder close to many topics)
        calibrates = bool(answerable) and len(ood) >= calibrate.MIN_OOD_QUESTIONS
        if answerable and not calibrates:
            # a set with too few out-of-domain questions calibrates nothing: say so, by count
            context.log.warning(
                f"only {len(ood)} out-of-domain questions in the question set (fewer than "
                f"{calibrate.MIN_OOD_QUESTIONS}): not calibrating on them; add near-miss and "
                "unrelated questions to out_of_domain.jsonl"
            )
        if calibrates:
            rows = calibrate.sweep(answerable, ood)
            choice = calibrate.choose_cut(rows, max_bluff_rate=questions.max_bluff_rate)
            cut, policy, reason, source = choice.cut, choice.policy, choice.reason, "calibrated"
            if data.get("source", "").startswith("generated") and len(other) >= (
                calibrate.MIN_OOD_QUESTIONS
            ):
                # a small model's near-miss questions are easy to refuse: never go above the
                # day-0 cut the questions about other topics allow (issue 53)
                bound = calibrate.choose_day0_cut(other, questions.max_bluff_rate)
                if bound.cut < cut:
                    cut, reason = (
                        bound.cut,
                        (f"{bound.reason}; the generated set alone allowed {choice.cut:.3f}"),
                    )
            png_name = eval_name(entry, "distances.png")
            png = _plot_png(answerable, ood, cut)
            store.write_file(png_name, png)
            r = choice.row
            meta = {
                "sweep": dg.MetadataValue.md(calibrate.sweep_table_markdown(rows, chosen=cut)),
                "plot": dg.MetadataValue.md(_png_md(png)),
                "plot_path": dg.MetadataValue.path(store.file_location(png_name)),
                "answered_correct": dg.MetadataValue.int(int(r.answered_correct)),
                "refused_answerable": dg.MetadataValue.int(int(r.refused_answerable)),
                "bluffs": dg.MetadataValue.int(int(r.bluffs_near + r.bluffs_unrelated)),
                "bluffs_near": dg.MetadataValue.int(int(r.bluffs_near)),
                "bluffs_unrelated": dg.MetadataValue.int(int(r.bluffs_unrelated)),
            }
        elif len(other) >= calibrate.MIN_OOD_QUESTIONS:
            choice = calibrate.choose_day0_cut(other, questions.max_bluff_rate)
            cut, policy, reason, source = choice.cut, choice.policy, choice.reason, "unrelated-only"
            warning = choice.warning
            if warning:
                context.log.warning(warning)
            if answerable:
                reason += f" (the question set has only {len(ood)} out-of-domain questions)"
            meta = {
                "other_topics_answered": dg.MetadataValue.int(int(choice.row.bluffs_unrelated)),
                "other_topics_questions": dg.MetadataValue.int(len(other)),
                "fails_closed": bool(warning),
            }
        else:
            why = (
                f"unevaluated ({verdict['reason']})"
                if verdict["evaluation"] != "evaluated"
                else f"{len(ood)} out-of-domain questions, fewer than {calibrate.MIN_OOD_QUESTIONS}"
            )
            cut, policy, source = DEFAULT_DISTANCE_CUT, "default", "default"
            reason = f"default cut {DEFAULT_DISTANCE_CUT}: {why}"
        if calibrates and "traffic" in str(verdict.get("source", "")):  # issue 43: bounded
            pub = store.published(strict=False)
            cut, held = calibrate.bounded_traffic_cut(cut, pub.threshold if pub else None)
            if held:
                reason = f"{reason}; {held}"
                context.log.warning(held)
        judged = _judge_calibration(data, questions.max_bluff_rate) if calibrates else None
        if judged is not None:  # the answer check's (distance cut, judge cut), issue 9
            meta["judge"] = dg.MetadataValue.md(judged.pop("table"))
            meta["judge_cut"] = dg.MetadataValue.float(float(judged["judge_cut"]))
            meta["judge_distance_cut"] = dg.MetadataValue.float(float(judged["cut"]))
            meta["judge_answered_correct"] = dg.MetadataValue.int(
                int(judged["row"]["answered_correct"])
            )
            meta["judge_refused_ood"] = dg.MetadataValue.int(int(judged["row"]["refused_ood"]))
        if questions.distance_cut:
            reason = f"RAG_DISTANCE_CUT={questions.distance_cut} overrides the {source} {cut:.3f}"
            cut, policy, source = float(questions.distance_cut), "override", "override"
        if answerable and ood:  # issue 31: the question set's outcome at the cut published
            meta |= _outcome_at(calibrate.sweep(answerable, ood, cuts=[cut])[0])
            before = store.published(strict=False)
            if before is not None and before.threshold is not None and before.threshold != cut:
                # issue 43: the trade beside the figures it was chosen on (in-sample): what
                # the same questions got at the cut published until now
                at = calibrate.sweep(answerable, ood, cuts=[float(before.threshold)])[0]
                meta["published_cut"] = dg.MetadataValue.float(float(before.threshold))
                meta |= {f"at_published_cut/{k}": v for k, v in _outcome_at(at).items()}
        store.write_file(
            eval_name(entry, "threshold.json"),
            json.dumps(
                {
                    "cut": cut,
                    "policy": policy,
                    "source": source,
                    "reason": reason,
                    "evaluation": verdict["evaluation"],
                    "evaluation_note": verdict["reason"],
                    "evaluation_source": verdict.get("source", ""),
                    "evaluation_counts": verdict.get("source_counts", {}),
                    "judge": judged,
                    "warning": warning,
                    # issue 53: said beside every answer while no question set checked the cut
                    "note": DAY0_NOTE if source in ("unrelated-only", "default") else "",
                }
            ),
        )
        return dg.MaterializeResult(
            data_version=dg.DataVersion(  # issue 30: per table version, so publish re-runs
                digest(
                    {
                        "table": entry.table,
                        "version": entry.version,
                        "documents_version": entry.documents_version,
                        "cut": cut,
                        "policy": policy,
                        "source": source,
                    }
                )
            ),
            metadata={
                "cut": dg.MetadataValue.float(float(cut)),
                "cut_source": source,
                "policy": policy,
                "reason": reason,
                "warning": warning or "none",
                **meta,
            },
        )

    @dg.asset_check(
        asset=refusal_threshold,
        blocking=False,
        description="Non-blocking (issue 53): the refusal cut was checked against questions near "
        "these documents (a question set: hand-written, reviewed, generated or reviewed traffic). "
        "Warns for a day-0 cut (no question set, no model): it refuses questions about other "
        "topics, but a question close to the documents that they do not answer may still get "
        "sources, and ask, the page and MCP say so beside every answer until a question set "
        "measures it; also when the day-0 cut failed closed.",
    )
    def refusal_cut_checked_on_near_questions(lance_index: LanceIndex) -> dg.AssetCheckResult:
        store = lance_index.store()
        th = _need_json(store, store.staging(), "threshold.json")
        note = str(th.get("warning") or th.get("note") or "")
        return dg.AssetCheckResult(
            passed=not note,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "cut": dg.MetadataValue.float(float(th["cut"])),
                "cut_source": str(th.get("source", "")),
                "reason": note or str(th.get("reason", "")),
            },
        )

    @dg.asset(
        deps=[refusal_threshold],
        group_name="serving",
        code_version="publish-2",
        automation_condition=automation,
        kinds={"lancedb"},
    )
    def published_index(
        context: dg.AssetExecutionContext, lance_index: LanceIndex
    ) -> dg.MaterializeResult:
        """Switches the query pointer to the evaluated table version, with its cut, and records
        whether the table was evaluated and where the cut came from. Runs only after the
        embedding and evaluation checks passed."""
        store = lance_index.store()
        entry = store.staging()
        th = _need_json(store, entry, "threshold.json")
        previous = store.published(strict=False)
        new = replace(
            entry,
            threshold=th["cut"],
            threshold_policy=th["policy"],
            published_at=now_iso(),
            evaluation=th["evaluation"],
            evaluation_note=th["evaluation_note"],
            threshold_source=th["source"],
            evaluation_source=th.get("evaluation_source", ""),
            evaluation_counts=th.get("evaluation_counts", {}),
            threshold_warning=str(th.get("warning") or ""),
        )
        # the writer lease (issue 25), as chunk_embeddings takes it: re-entrant under
        # `rag-assets index`, waited for in a sensor or UI run
        with store.hold(context.run.run_id, wait_s=ASSET_LEASE_WAIT_S):
            store.publish(new)
        return dg.MaterializeResult(
            data_version=dg.DataVersion(
                digest({k: v for k, v in new.to_dict().items() if k != "published_at"})
            ),
            metadata={
                "table": new.table,
                "table_version": dg.MetadataValue.int(new.version),
                "dagster/row_count": dg.MetadataValue.int(new.rows),
                "threshold": dg.MetadataValue.float(float(new.threshold or 0.0)),
                "threshold_source": new.threshold_source,
                "evaluation": new.evaluation,
                "evaluation_note": new.evaluation_note,
                "evaluation_source": new.evaluation_source or new.evaluation,
                "threshold_warning": new.threshold_warning or "none",  # issue 30
                "index_uri": dg.MetadataValue.path(shown_uri(store.uri)),
                "previous": f"{previous.table}@{previous.version}" if previous else "none",
            },
        )

    @dg.asset(
        deps=[chunk_embeddings],
        group_name="evaluation",
        code_version="ablation-1",
    )
    def strategy_ablation(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        embedding_model: EmbeddingModel,
        rerank_model: RerankModel,
        questions: QuestionSet,
    ) -> dg.MaterializeResult:
        """On demand: chunk strategies A–F × retrievers on the evaluation corpus, destroyed
        answers, and paired sign tests of each strategy against E."""
        embedder = embedding_model.embedder()
        qset = load_needle_set(Path(questions.path))
        root = Path(documents.work_dir) / "ablation"
        results: dict[str, Any] = {}
        for name in PRESETS:
            strat = chunk_strategy(name, strategy.target)
            built = index_folder(documents.path, root, strat, embedder, publish=False)
            index = Index(IndexStore(root), built.entry, embedder, rerank_model.reranker())
            results[name], _ = evaluate_needles(index, qset, strategy=name)
            context.log.info(f"strategy {name}: {results[name]['destroyed']} destroyed")
        _, md = ablation(results)
        (root / "ablation.json").write_text(json.dumps(results, indent=2))
        return dg.MaterializeResult(metadata={"results": dg.MetadataValue.md(md)})

    return [
        retrieval_eval,
        recall_at_20_above_floor,
        not_worse_than_published,
        refusal_threshold,
        refusal_cut_checked_on_near_questions,
        published_index,
        strategy_ablation,
    ]


def _judge_calibration(data: dict[str, Any], max_bluff_rate: float) -> dict[str, Any] | None:
    """The joint (distance cut, judge cut) choice from retrieval_eval's judge scores, with its
    curve at the chosen distance cut as Markdown under "table"; None without a judge."""
    from rag_assets.lib.evaluate.evaluate import joint_cuts

    scores = data.get("judge_scores")
    if not scores:
        return None
    answerable = [_qd(q) for q in data["answerable"]]
    ood = [_qd(q) for q in data["ood"]]
    base = calibrate.choose_cut(calibrate.sweep(answerable, ood), max_bluff_rate=max_bluff_rate)

    sources = int(data.get("judge_sources") or calibrate.DEFAULT_KEEP)

    def judged(q: calibrate.QueryDistances) -> calibrate.JudgedQuery:
        ranks = {int(r): s for r, s in scores[q.query_id].items()}
        return calibrate.JudgedQuery(q, ranks, sources)

    rows = calibrate.joint_sweep(
        [judged(q) for q in answerable], [judged(q) for q in ood], joint_cuts(base.cut)
    )
    choice = calibrate.choose_joint(rows, max_bluff_rate)
    curve = calibrate.judge_curve(rows, choice.cut)
    return choice.to_dict() | {
        "sources": sources,
        "table": calibrate.joint_table_markdown(curve[::5] + [choice.row], chosen=choice.row),
    }


def _qd(d: dict[str, Any]) -> calibrate.QueryDistances:
    return calibrate.QueryDistances(
        d["query_id"], tuple(d["distances"]), frozenset(d["correct_ranks"]), d["kind"]
    )


def _plot_png(
    answerable: list[calibrate.QueryDistances], ood: list[calibrate.QueryDistances], cut: float
) -> bytes:
    """The distance plot as PNG bytes (drawn in a scratch folder, stored by the caller)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rag-plot-") as tmp:
        return plot_refusal(answerable, ood, cut, Path(tmp) / "distances.png").read_bytes()


def _png_md(png: bytes) -> str:
    import base64

    data = base64.b64encode(png).decode()
    return f"![cosine distance distributions](data:image/png;base64,{data})"


def _verdict(evaluation: str, reason: str) -> dict[str, Any]:
    return {"evaluation": evaluation, "reason": reason}


def _corpus_verdict(result: dict[str, Any], total: int, qdir: Path, rows: int) -> dict[str, Any]:
    """Is this table evaluated by the question set? (``empty`` fails the gate.)"""
    if rows == 0:
        return _verdict(
            "empty", "the table has no chunks: nothing to publish (is RAG_DOCUMENTS_DIR empty?)"
        )
    found = int(result["needles"])
    if found < MIN_MATCHING_SHARE * total:
        return _verdict(
            "unevaluated",
            f"the question set {qdir} does not belong to this corpus: {total - found} of "
            f"{total} needles are not in these documents (set RAG_EVAL_DIR to a set written "
            "for them)",
        )
    return _verdict("evaluated", f"{found} of {total} questions have their needle in the corpus")


def _inputs_fingerprint(
    qdir: Path | None, decision: Decision, questions: Any, rerank_model: Any
) -> str:
    """What evaluation reads beside the table: the question files' bytes (and the shipped
    questions about other topics), where they came from, and the gate and reranker settings
    (resource config is not part of Dagster's data versions)."""
    files = {}
    for name in ("questions.jsonl", "out_of_domain.jsonl"):
        f = qdir / name if qdir else None
        files[name] = hashlib.sha256(f.read_bytes()).hexdigest() if f and f.is_file() else None
    files["other_topics"] = other_topics_digest()  # issue 53: the day-0 cut's questions
    config = {
        "questions": {k: getattr(questions, k) for k in sorted(type(questions).model_fields)},
        # issue 42: not the worker's cache folder (RAG_WORK_DIR): each machine has its own
        "rerank": {
            k: getattr(rerank_model, k)
            for k in sorted(type(rerank_model).model_fields)
            if k != "work_dir"
        },
        "source": [decision.label, decision.complete],
    }
    return digest({"files": files, "config": config})


def _against_published(
    store: IndexStore, entry: Published, result: dict[str, Any]
) -> dict[str, Any] | None:
    """The upgrade comparison when the published table is another table evaluated on the very
    same question files (a model change), else None."""
    previous = store.published(strict=False)
    if previous is None or previous.table == entry.table or not result.get("retrievers"):
        return None
    old = _read_json(store, previous, "json")
    if old is None:
        return None
    same = old.get("verdict", {}).get("questions_digest")
    if not same or same != result["verdict"].get("questions_digest"):
        return None
    return compare_to_published(result, old)


def _outcome_at(row: calibrate.SweepRow) -> dict[str, Any]:
    """The gate's outcome on the question set at one cut, as refusal_threshold metadata (the
    summary's one refusal line reads it: issue 31)."""
    ints = {
        "answered_correct": row.answered_correct,
        "answered_wrong": row.answered_wrong,
        "refused_answerable": row.refused_answerable,
        "bluffs": row.bluffs_near + row.bluffs_unrelated,
        "bluffs_near": row.bluffs_near,
        "bluffs_unrelated": row.bluffs_unrelated,
        "answerable_questions": row.n_answerable,
        "out_of_domain_questions": row.n_near + row.n_unrelated,
    }
    return {k: dg.MetadataValue.int(int(v)) for k, v in ints.items()}


def _planned_searches(qset: Any, index: Index) -> int:
    """The searches :func:`evaluate_needles` makes: every query of every retriever, then the
    out-of-domain questions through the default one (a progress total, issue 31)."""
    retrievers = 4 if index.reranker is not None else 3
    queries = sum(len(q.query_list()) for q in qset.questions)
    return retrievers * queries + len(qset.out_of_domain)


def _other_topics(data: dict[str, Any]) -> list[calibrate.QueryDistances]:
    """The day-0 cut's questions from a sweep file (``refusal.json``); none when it was written
    for another version of the questions (a re-run of ``retrieval_eval`` writes them again)."""
    got = data.get("other_topics") or {}
    if got.get("digest") != other_topics_digest():
        return []
    return [
        calibrate.QueryDistances(i, (float(d),), frozenset(), "unrelated")
        for i, d in zip(got.get("ids", []), got.get("distances", []), strict=True)
    ]


def _carried_over(
    store: IndexStore, entry: Published, fingerprint: str
) -> tuple[dict[str, Any], Published] | None:
    """(evaluation report, its version) when ``entry`` differs from the published version of the
    same table only in its documents' metadata (issue 34: the same chunk ids and texts, so the
    same vectors and rankings) and that version was evaluated on the same inputs; else None."""
    previous = store.published(strict=False)
    if previous is None or previous.table != entry.table or previous.version == entry.version:
        return None
    old = _read_json(store, previous, "json")
    if not old or (old.get("verdict") or {}).get("fingerprint") != fingerprint:
        return None
    if _chunk_set(store, previous) != _chunk_set(store, entry):
        return None
    return old, previous


def _chunk_set(store: IndexStore, entry: Published) -> frozenset[tuple[str, str]]:
    from rag_assets.lib.index.store import scan

    tbl = store.open_table(entry.table, entry.version)
    rows = scan(tbl, ["chunk_id", "content_hash"])
    pairs = zip(rows["chunk_id"].to_pylist(), rows["content_hash"].to_pylist(), strict=True)
    return frozenset(pairs)


def _carry_over(
    context: dg.AssetExecutionContext,
    store: IndexStore,
    entry: Published,
    old: dict[str, Any],
    source: Published,
) -> dg.MaterializeResult:
    """``retrieval_eval``'s result for a metadata-only version: ``source``'s report and refusal
    sweep copied under ``entry``'s name (one commit on object storage), so the cut is
    calibrated from the same figures and the version publishes without evaluating again."""
    stable = {k: v for k, v in old.items() if k != "notes"}
    verdict = old["verdict"]
    report = {**old, "verdict": {**verdict, "carried_over_from": source.key}}
    store.write_files(
        {
            eval_name(entry, "json"): json.dumps(report, indent=2),
            eval_name(entry, "refusal.json"): store.read_file(eval_name(source, "refusal.json")),
        }
    )
    note = f"only metadata changed since {source.key}: its evaluation carried over"
    context.log.info(note)
    return dg.MaterializeResult(
        data_version=dg.DataVersion(digest(stable)),
        metadata={
            "table": entry.table,
            "evaluation": verdict["evaluation"],
            "evaluation_note": verdict["reason"],
            "carried_over_from": source.key,
            "inputs_fingerprint": verdict["fingerprint"],
            "results": dg.MetadataValue.md(
                markdown_tables(old) if old.get("retrievers") else f"**{note}**"
            ),
        },
    )


def _current_data_version(instance: Any, key: dg.AssetKey) -> str | None:
    from dagster._core.definitions.data_version import extract_data_version_from_entry

    record = instance.get_latest_data_version_record(key)
    if record is None:
        return None
    version = extract_data_version_from_entry(record.event_log_entry)
    return version.value if version else None


def _evaluation_unchanged(
    context: dg.AssetExecutionContext,
    store: IndexStore,
    entry: Published,
    fingerprint: str,
    questions: Any,
) -> str | None:
    """Why the evaluated tail need not re-run, or None when it must.

    The same rule Dagster's stale status (and so the automation sensor) applies, for the three
    assets together: each one's last materialisation was made by its current code version from
    its inputs' current data versions. Besides: the question files and gate settings are those
    of the last evaluation, the last gate passed, and this index still holds the artefacts of
    the staged table version (a new index directory re-evaluates), and that version is the
    published one (issue 30: a run killed between staging and publishing left it unpublished;
    the re-run evaluates and publishes it).
    """
    instance = context.instance
    prefix = context.asset_key.path[:-1]  # issue 51: a RagIndex component's keys are prefixed
    last = instance.get_latest_materialization_event(dg.AssetKey([*prefix, "retrieval_eval"]))
    if last is None or last.asset_materialization is None:
        return None
    recorded = last.asset_materialization.metadata.get("inputs_fingerprint")
    if getattr(recorded, "value", None) != fingerprint:
        return None
    layer = context.job_def.asset_layer
    for name in EVALUATED_TAIL:
        key = dg.AssetKey([*prefix, name])
        provenance = context.get_asset_provenance(key)
        if provenance is None or not layer.has(key):
            return None
        if provenance.code_version != layer.get(key).code_version:
            return None
        for dep, version in provenance.input_data_versions.items():
            if _current_data_version(instance, dep) != version.value:
                return None
    result = _read_json(store, entry, "json")
    if result is None or store.read_file(eval_name(entry, "threshold.json")) is None:
        return None
    verdict = result.get("verdict") or {}
    if verdict.get("evaluation") == "empty" or (
        verdict.get("evaluation") == "evaluated"
        and verdict.get("recall@20", 0.0) < questions.recall_floor
    ):
        return None
    pub = store.published(strict=False)
    if pub is None:
        return None
    if (pub.table, pub.version, pub.documents_version) != (
        entry.table,
        entry.version,
        entry.documents_version,
    ):  # issue 30: a run killed after staging: what it staged is not published yet
        return None
    return (
        f"the data versions of chunk_embeddings, retrieval_eval and refusal_threshold are those "
        f"run {last.run_id[:8]} evaluated, calibrated and published; question set unchanged"
    )


def _adaptation_md(report: dict[str, Any] | None) -> str:
    line = report_line(report)
    return f"\n\n{line}" if line else ""


def _adaptation_metadata(report: dict[str, Any] | None) -> dict[str, dg.MetadataValue]:
    """Held-out self-retrieval MRR of the base and the adapted encoder (issue 32), plotted."""
    sr = (report or {}).get("self_retrieval") or {}
    if not (sr.get("base") and sr.get("adapted")):
        return {}
    return {
        "adaptation/self_mrr_base": dg.MetadataValue.float(float(sr["base"]["mrr"])),
        "adaptation/self_mrr_adapted": dg.MetadataValue.float(float(sr["adapted"]["mrr"])),
        "adaptation/status": dg.MetadataValue.text(str(report["status"] if report else "")),
    }


def _verification(
    context: dg.AssetExecutionContext, index: Index, qset: Any, rerank_model: Any
) -> dict[str, Any]:
    """Issue 50: the answer verifier on this table's needles (each cited with its chunk must be
    supported; changed, it must not be) and, with a model at RAG_LLM_URL, the faithfulness of
    the answers it writes for the questions (every reply cached by the served model)."""
    from rag_assets.lib.evaluate.verify_eval import answer_faithfulness, index_detection

    detection = index_detection(index, qset.questions)
    out: dict[str, Any] = {"detection": {k: v for k, v in detection.items() if k != "rows"}}
    out["detection_rows"] = detection["rows"]
    if rerank_model.llm_url:
        from rag_assets.lib.query.cite import PROMPT_INSTRUCTION
        from rag_assets.lib.query.generate import ANSWER_MAX_TOKENS, map_markers
        from rag_assets.lib.query.judge import llm_cache_dir, make_client

        client = make_client(
            rerank_model.llm_url,
            rerank_model.llm_model,
            rerank_model.llm_api_key,
            llm_cache_dir(rerank_model.work_dir),
        )

        def write(ctx: Any) -> str:  # what `ask` sends, through the on-disk cache
            messages = [
                {"role": "system", "content": PROMPT_INSTRUCTION},
                {"role": "user", "content": ctx.user_message},
            ]
            reply = client.chat(messages, max_tokens=ANSWER_MAX_TOKENS, temperature=0.0)
            return map_markers(reply.text, len(ctx.citations)).text

        try:
            out["faithfulness"] = answer_faithfulness(index, qset.questions, write)
        except Exception as exc:  # noqa: BLE001 - a model server down: recall still counts
            context.log.warning(f"answer faithfulness not measured: {exc}")
            out["faithfulness"] = {"error": " ".join(str(exc).split())[:300]}
    return out


def _verification_metadata(report: dict[str, Any] | None) -> dict[str, dg.MetadataValue]:
    """The verifier's rates (and the generated answers' faithfulness) as plottable metadata."""
    if not report:
        return {}
    det = report["detection"]
    out: dict[str, dg.MetadataValue] = {}
    names = {
        "originals": "verify/originals_supported",
        "number": "verify/changed_number_flagged",
        "negation": "verify/negation_flagged",
        "term": "verify/swapped_term_flagged",
        "elsewhere": "verify/elsewhere_flagged",
        "changed": "verify/changed_flagged",
    }
    for key, name in names.items():
        row = det.get(key) or {}
        if row.get("rate") is not None:
            out[name] = dg.MetadataValue.float(float(row["rate"]))
            out[f"{name}_of"] = dg.MetadataValue.int(int(row["total"]))
    for key in ("supported_share", "citation_recall", "citation_precision"):
        value = (report.get("faithfulness") or {}).get(key)
        if isinstance(value, int | float):
            out[f"answers/{key}"] = dg.MetadataValue.float(float(value))
    return out


def _numeric_eval_metadata(result: dict[str, Any]) -> dict[str, dg.MetadataValue]:
    """Floats/ints Dagster plots across materialisations (the Markdown tables stay too)."""
    out: dict[str, dg.MetadataValue] = {}
    for name, summary in sorted(result.get("retrievers", {}).items()):
        for k, v in summary.items():
            if k.startswith("recall@") and isinstance(v, dict):
                out[f"{name}/{k}"] = dg.MetadataValue.float(float(v["value"]))
        if "mrr" in summary:
            out[f"{name}/mrr"] = dg.MetadataValue.float(float(summary["mrr"]))
    refusal = result.get("refusal")
    if refusal:
        for k in ("answered", "refused_answerable", "bluffs"):
            out[f"refusal/{k}"] = dg.MetadataValue.int(int(refusal[k]))
    return out
