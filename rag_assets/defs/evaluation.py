"""Evaluation, calibration and publishing assets (downstream of chunk_embeddings).

A model change re-materialises chunk_embeddings into a new table; these assets then measure
that table, calibrate its refusal cut, and only then switch the published pointer to it.
"""

import json
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.resources import (
    DocumentsFolder,
    EmbeddingModel,
    LanceIndex,
    QuestionSet,
    RerankModel,
)
from rag_assets.lib import calibrate
from rag_assets.lib.chunk import PRESETS, ChunkStrategy
from rag_assets.lib.chunk import strategy as chunk_strategy
from rag_assets.lib.cite import DEFAULT_DISTANCE_CUT
from rag_assets.lib.evaluate import ablation, evaluate_needles, markdown_tables, plot_refusal
from rag_assets.lib.pipeline import digest, index_folder
from rag_assets.lib.questions import load_needle_set
from rag_assets.lib.retrieve import Index
from rag_assets.lib.store import IndexStore, Published, now_iso
from rag_assets.lib.versioning import Stamps


def _eval_path(uri: str, entry: Published, name: str) -> Path:
    p = Path(uri) / "evaluation" / f"{entry.table}@{entry.version}.{name}"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def build_evaluation_assets(
    chunk_embeddings: Any, stamps: Stamps, strategy: ChunkStrategy, automation: Any
) -> list[Any]:
    @dg.asset(
        deps=[chunk_embeddings],
        group_name="evaluation",
        code_version="eval-1",
        automation_condition=automation,
        check_specs=[
            dg.AssetCheckSpec("recall_at_20_above_floor", asset="retrieval_eval", blocking=True)
        ],
    )
    def retrieval_eval(
        context: dg.AssetExecutionContext,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
        rerank_model: RerankModel,
        questions: QuestionSet,
    ) -> dg.MaterializeResult:
        """Recall@1/4/8/20 and MRR with Wilson 95 % intervals for every retriever, paired
        sign tests, on the freshly embedded (not yet published) table."""
        store = lance_index.store()
        entry = store.staging()
        qdir = Path(questions.path)
        if not (qdir / "questions.jsonl").exists():
            context.log.warning(f"no question set at {qdir}: evaluation skipped")
            return dg.MaterializeResult(
                data_version=dg.DataVersion(digest({"table": entry.table, "questions": None})),
                metadata={"questions": 0, "note": f"no question set at {qdir} (RAG_EVAL_DIR)"},
                check_results=[
                    dg.AssetCheckResult(
                        check_name="recall_at_20_above_floor",
                        passed=True,
                        metadata={"note": "no question set: nothing to gate on"},
                    )
                ],
            )
        index = Index(store, entry, embedding_model.embedder(), rerank_model.reranker())
        result, refusal = evaluate_needles(
            index,
            load_needle_set(qdir),
            strategy=strategy.name,
            max_bluff_rate=questions.max_bluff_rate,
        )
        _eval_path(store.uri, entry, "json").write_text(json.dumps(result, indent=2))
        if refusal is not None:
            _eval_path(store.uri, entry, "refusal.json").write_text(
                json.dumps(
                    {
                        "retriever": refusal.retriever,
                        "answerable": [
                            q.__dict__ | {"correct_ranks": sorted(q.correct_ranks)}
                            for q in refusal.answerable
                        ],
                        "ood": [q.__dict__ | {"correct_ranks": []} for q in refusal.ood],
                    }
                )
            )
        main = "rerank" if "rerank" in result["retrievers"] else "hybrid"
        r20 = result["retrievers"][main]["recall@20"]["value"] if result["needles"] else 0.0
        stable = {k: v for k, v in result.items() if k != "notes"}
        return dg.MaterializeResult(
            data_version=dg.DataVersion(digest(stable)),
            metadata={
                "table": entry.table,
                "needles": result["needles"],
                "destroyed": result["destroyed"],
                "broken_questions": len(result["broken_questions"]),
                f"{main}_recall@20": r20,
                "results": dg.MetadataValue.md(markdown_tables(result)),
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name="recall_at_20_above_floor",
                    passed=r20 >= questions.recall_floor,
                    metadata={
                        "retriever": main,
                        "recall@20": r20,
                        "floor": questions.recall_floor,
                        "valid_questions": result["needles"],
                        "notes": "; ".join(result["notes"]) or "none",
                    },
                )
            ],
        )

    @dg.asset(
        deps=[retrieval_eval],
        group_name="evaluation",
        code_version="calibrate-1",
        automation_condition=automation,
    )
    def refusal_threshold(
        context: dg.AssetExecutionContext, lance_index: LanceIndex, questions: QuestionSet
    ) -> dg.MaterializeResult:
        """The cosine-distance cut under which the gate answers: the largest cut whose bluff
        rate on out-of-domain questions is at most the target (RAG_MAX_BLUFF_RATE)."""
        store = lance_index.store()
        entry = store.staging()
        src = _eval_path(store.uri, entry, "refusal.json")
        out = _eval_path(store.uri, entry, "threshold.json")
        if not src.exists():
            cut, policy, reason = DEFAULT_DISTANCE_CUT, "default", "no out-of-domain questions"
            meta: dict[str, Any] = {}
        else:
            data = json.loads(src.read_text())
            answerable = [_qd(q) for q in data["answerable"]]
            ood = [_qd(q) for q in data["ood"]]
            rows = calibrate.sweep(answerable, ood)
            choice = calibrate.choose_cut(rows, max_bluff_rate=questions.max_bluff_rate)
            cut, policy, reason = choice.cut, choice.policy, choice.reason
            png = plot_refusal(answerable, ood, cut, _eval_path(store.uri, entry, "distances.png"))
            meta = {
                "sweep": dg.MetadataValue.md(calibrate.sweep_table_markdown(rows, chosen=cut)),
                "plot": dg.MetadataValue.md(_png_md(png)),
                "plot_path": dg.MetadataValue.path(str(png)),
                "answered_correct": choice.row.answered_correct,
                "refused_answerable": choice.row.refused_answerable,
                "bluffs_near": choice.row.bluffs_near,
                "bluffs_unrelated": choice.row.bluffs_unrelated,
            }
        if questions.distance_cut:
            reason = f"RAG_DISTANCE_CUT={questions.distance_cut} overrides the calibrated {cut:.3f}"
            cut, policy = float(questions.distance_cut), "override"
        out.write_text(json.dumps({"cut": cut, "policy": policy, "reason": reason}))
        return dg.MaterializeResult(
            data_version=dg.DataVersion(
                digest({"table": entry.table, "cut": cut, "policy": policy})
            ),
            metadata={"cut": cut, "policy": policy, "reason": reason, **meta},
        )

    @dg.asset(
        deps=[refusal_threshold],
        group_name="serving",
        code_version="publish-1",
        automation_condition=automation,
        kinds={"lancedb"},
    )
    def published_index(lance_index: LanceIndex) -> dg.MaterializeResult:
        """Switches the query pointer to the evaluated table version, with its calibrated cut.
        Runs only after the embedding and evaluation checks passed."""
        store = lance_index.store()
        entry = store.staging()
        th = json.loads(_eval_path(store.uri, entry, "threshold.json").read_text())
        previous = store.published()
        new = Published(
            table=entry.table,
            version=entry.version,
            documents_version=entry.documents_version,
            stamps=entry.stamps,
            threshold=th["cut"],
            threshold_policy=th["policy"],
            rows=entry.rows,
            published_at=now_iso(),
        )
        store.publish(new)
        return dg.MaterializeResult(
            data_version=dg.DataVersion(
                digest({k: v for k, v in new.to_dict().items() if k != "published_at"})
            ),
            metadata={
                "table": new.table,
                "table_version": new.version,
                "dagster/row_count": new.rows,
                "threshold": new.threshold,
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

    return [retrieval_eval, refusal_threshold, published_index, strategy_ablation]


def _qd(d: dict[str, Any]) -> calibrate.QueryDistances:
    return calibrate.QueryDistances(
        d["query_id"], tuple(d["distances"]), frozenset(d["correct_ranks"]), d["kind"]
    )


def _png_md(path: Path) -> str:
    import base64

    data = base64.b64encode(path.read_bytes()).decode()
    return f"![cosine distance distributions](data:image/png;base64,{data})"
