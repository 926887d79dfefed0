"""The query log in the graph (issue 33, group ``traffic``).

- ``query_log`` (observable source): the log kept with the index. Each observation records
  its figures (queries per day, refusal rate, nearest-distance and latency percentiles, review
  counts) as numeric metadata, which the UI plots; its data version is the digest of the
  reviews, so only a new or changed review makes ``eval_questions`` stale (an unchanged log
  costs nothing). Observed on ``RAG_REINDEX_CRON`` and in every ``rag-assets index`` run.
- ``query_log_drift`` (check, WARN): the refusal rate or the median nearest distance of the
  newest asks far outside their trailing windows (:mod:`rag_assets.lib.evaluate.traffic_watch`).
- ``content_gaps``: the most frequent refused or ``should_refuse`` questions grouped by
  similarity, a Markdown and a JSON file in the store (``reports/content-gaps.md``); refusals
  caused by access (a group token's question the index answers for the administrator) are
  counted apart, not ranked (issue 43).
- ``not_worse_on_traffic`` (blocking check on ``refusal_threshold``): on a model change (a new
  table, with the fusion configured beside it), every logged question replayed on the candidate
  before it is published
  (:mod:`rag_assets.lib.evaluate.replay`); fails when the paired sign tests on reviewed
  questions say the candidate is significantly worse.
- ``traffic_reviews_sensor``: requests ``eval_questions`` and the evaluation after it when the
  reviews changed since the evaluation last read them, so the cut follows the traffic.

Users' questions stay in the index store: the metadata here are counts and figures only.
"""

import json
import time
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.evaluation import EVALUATED_TAIL, eval_name
from rag_assets.defs.questions import read_decision
from rag_assets.defs.resources import EmbeddingModel, LanceIndex, RerankModel
from rag_assets.defs.traffic_set import GAPS_JSON, GAPS_MD, QUERY_LOG_KEY
from rag_assets.lib.evaluate import traffic_watch as watch
from rag_assets.lib.index.store import IndexStore, is_remote
from rag_assets.lib.index.store.querylog import (
    FEEDBACK_TABLE,
    QUERIES_TABLE,
    LogDamaged,
    QueryLog,
)

GAPS_KEYS = ("grouped_by", "groups", "refused_for_access")
"""What the report's JSON holds (the questions are in its groups)."""

REPLAY_NAME = "replay"  # evaluation/<table>@<version>.replay.json / .replay.md

_METRIC_COLUMNS = [
    "id", "at_ns", "interface", "decision", "refused_by", "nearest_distance", "latency_ms"
]  # fmt: skip

AC = dg.AutomationCondition


# -- the assets -------------------------------------------------------------------------------
def _metadata(values: dict[str, float | int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, int):
            out[k] = dg.MetadataValue.int(v)
        elif v == v:  # NaN: nothing measured, no point plotted
            out[k] = dg.MetadataValue.float(float(v))
    return out


def build_traffic_assets(cron: str, fusion: str) -> list[Any]:
    """``query_log``, its drift check, ``content_gaps`` and the replay check."""

    @dg.observable_source_asset(
        key=QUERY_LOG_KEY,
        group_name="traffic",
        description="The questions asked of the index (/ask, /search, MCP, `rag-assets ask`) and "
        "their reviews, kept with the index. Observed: queries per day, refusal rate, "
        "nearest-distance and latency percentiles (last 24 h), review counts. Data version: "
        "the reviews, so only new reviews re-evaluate.",
        automation_condition=AC.cron_tick_passed(cron),
    )
    def query_log(lance_index: LanceIndex) -> dg.ObserveResult:
        try:
            return _observe_log(QueryLog(lance_index.store()))
        except LogDamaged as exc:  # issue 43: on object storage, reported; publishing goes on
            return dg.ObserveResult(
                data_version=dg.DataVersion("damaged"), metadata={"damaged": str(exc)}
            )

    def _observe_log(log: QueryLog) -> dg.ObserveResult:
        if not log.exists(QUERIES_TABLE):
            return dg.ObserveResult(
                data_version=dg.DataVersion(log.reviews_digest()),
                metadata={"entries": dg.MetadataValue.int(0)},
            )
        entries = log.entries(columns=_METRIC_COLUMNS)
        figures = watch.log_metrics(entries, log.reviews(), time.time_ns())
        return dg.ObserveResult(
            data_version=dg.DataVersion(log.reviews_digest()), metadata=_metadata(figures)
        )

    @dg.asset_check(
        asset=QUERY_LOG_KEY,
        name="query_log_drift",
        description=f"WARN when the refusal rate or the median nearest distance of the last "
        f"{watch.DRIFT_WINDOW} asks lies outside the mean ± {watch.SIGMAS:g} sd of the "
        f"{watch.MIN_TRAILING}-{watch.MAX_TRAILING} windows of {watch.DRIFT_WINDOW} asks before "
        f"(and moved by at least {watch.MIN_REFUSAL_MOVE:g} / {watch.MIN_DISTANCE_MOVE:g}): "
        "users are asking about something the corpus lacks.",
    )
    def query_log_drift(lance_index: LanceIndex) -> dg.AssetCheckResult:
        log = QueryLog(lance_index.store())
        try:
            entries = log.entries(columns=_METRIC_COLUMNS) if log.exists(QUERIES_TABLE) else []
        except LogDamaged as exc:  # issue 43: on object storage; said by query_log already
            return dg.AssetCheckResult(
                passed=True, severity=dg.AssetCheckSeverity.WARN, metadata={"damaged": str(exc)}
            )
        d = watch.drift(entries)
        meta: dict[str, Any] = {"status": d.status, "windows": dg.MetadataValue.int(d.windows)}
        meta["reasons"] = "; ".join(d.reasons) or "none"
        for name, value in d.current.items():
            if value == value:
                meta[f"current/{name}"] = dg.MetadataValue.float(float(value))
        for name, value in d.trailing_mean.items():
            meta[f"trailing_mean/{name}"] = dg.MetadataValue.float(float(value))
            meta[f"trailing_sd/{name}"] = dg.MetadataValue.float(float(d.trailing_sd[name]))
        return dg.AssetCheckResult(
            passed=d.status != "warn", severity=dg.AssetCheckSeverity.WARN, metadata=meta
        )

    @dg.asset(
        deps=[QUERY_LOG_KEY],
        group_name="traffic",
        code_version="content-gaps-1",
        automation_condition=AC.cron_tick_passed(cron) & ~AC.in_progress(),
        kinds={"markdown"},
    )
    def content_gaps(
        context: dg.AssetExecutionContext,
        lance_index: LanceIndex,
        embedding_model: EmbeddingModel,
    ) -> dg.MaterializeResult:
        """The questions the index refused, or reviewers marked should_refuse, grouped by
        similarity (the index's embedding model), most asked first: what the documents do not
        cover. A Markdown report and its JSON in the index store (reports/content-gaps.md);
        the metadata here are counts only."""
        store = lance_index.store()
        try:
            report = watch.gap_report(
                QueryLog(store, warn=context.log.warning),
                store,
                embedding_model.embedder,
                warn=context.log.warning,
            )
        except LogDamaged as exc:  # issue 43: on object storage, reported; publishing goes on
            context.log.warning(str(exc))
            return dg.MaterializeResult(metadata={"damaged": str(exc)})
        groups, questions, grouped_by = report["groups"], report["questions"], report["grouped_by"]
        from rag_assets.lib.query.log import now

        md = watch.gaps_markdown(groups, now()[0], grouped_by, report["refused_for_access"])
        store.write_files({GAPS_MD: md, GAPS_JSON: json.dumps({k: report[k] for k in GAPS_KEYS})})
        return dg.MaterializeResult(
            metadata={
                "groups": dg.MetadataValue.int(len(groups)),
                "questions": dg.MetadataValue.int(len(questions)),
                "asked": dg.MetadataValue.int(sum(n for _, n, _ in questions)),
                "largest_group": dg.MetadataValue.int(groups[0]["asked"] if groups else 0),
                "refused_for_access": dg.MetadataValue.int(report["refused_for_access"]),
                "report": dg.MetadataValue.path(store.file_location(GAPS_MD)),
            }
        )

    @dg.asset_check(
        asset="refusal_threshold",
        name="not_worse_on_traffic",
        blocking=True,
        description="Blocking gate on a model change: every logged question is replayed on the "
        "candidate table at its calibrated cut (with RAG_FUSION); reports top-4 agreement with "
        "what users were shown and decision flips, and fails when the paired sign tests on "
        "reviewed questions (hit@4, answered with the needle, refusals) say the candidate is "
        "significantly worse (p < 0.05). Passes when nothing changed or nothing was logged.",
    )
    def not_worse_on_traffic(
        lance_index: LanceIndex, embedding_model: EmbeddingModel, rerank_model: RerankModel
    ) -> dg.AssetCheckResult:
        store = lance_index.store()
        report, why = replay_candidate(
            store,
            # the candidate's own encoder: its adapted model when it is embedded with one
            lambda stamps: embedding_model.embedder_for_table(store, stamps, lance_index.work_dir),
            rerank_model.reranker(),
            fusion,
        )
        if report is None:
            return dg.AssetCheckResult(passed=True, metadata={"replayed": why})
        meta: dict[str, Any] = {
            "replay": dg.MetadataValue.md(report["table"]),
            "questions": dg.MetadataValue.int(report["questions"]),
            "answered_to_refused": dg.MetadataValue.int(report["flips"]["answered_to_refused"]),
            "refused_to_answered": dg.MetadataValue.int(report["flips"]["refused_to_answered"]),
            "report": dg.MetadataValue.path(why),
        }
        for key in ("top4_agreement", "top1_same"):
            if report[key] is not None:
                meta[key] = dg.MetadataValue.float(float(report[key]))
        for name, test in report["tests"].items():
            meta[f"{name}/wins"] = dg.MetadataValue.int(int(test["wins"]))
            meta[f"{name}/losses"] = dg.MetadataValue.int(int(test["losses"]))
            meta[f"{name}/p"] = dg.MetadataValue.float(float(test["p"]))
        if report["worse"]:
            meta["reason"] = (
                f"the candidate is significantly worse on reviewed traffic "
                f"({', '.join(_worse_line(n, report['tests'][n]) for n in report['worse'])}, "
                f"p < 0.05); the published table keeps serving (replay: {why})"
            )
        return dg.AssetCheckResult(passed=not report["worse"], metadata=meta)

    return [query_log, query_log_drift, content_gaps, not_worse_on_traffic]


def _worse_line(name: str, test: dict[str, Any]) -> str:
    return f"{name}: {int(test['wins'])} wins, {int(test['losses'])} losses, p {test['p']:.3g}"


def replay_candidate(
    store: IndexStore, embedder: Any, reranker: Any, fusion: str, *, force: bool = False
) -> tuple[dict[str, Any] | None, str]:
    """Replay the log on the staged table (at its calibrated cut, with ``fusion``: the
    configuration the upgrade brings) when it is a model change (another table than the
    published one), or with ``force``. Returns (report, where it was written) or (None, why
    not). ``embedder``: the candidate's query embedder, or a function of the candidate's stamps
    that returns it (issue 44: a table embedded with an adapted model is asked with that model,
    never with the base one; called only when there is something to replay)."""
    from rag_assets.lib.evaluate.replay import replay
    from rag_assets.lib.query.fusion import parse_fusion
    from rag_assets.lib.query.retrieve import Index

    log = QueryLog(store)
    try:
        entries = log.entries() if log.exists() else []
    except LogDamaged as exc:  # issue 43: on object storage; the candidate is judged without
        return None, str(exc)
    if not entries:
        return None, "no logged questions"
    published = store.published(strict=False)
    staged = store.staging()
    chosen = parse_fusion(fusion)
    # a new table is a model (or chunking) change; RAG_FUSION is the service's own setting,
    # so a fusion change alone is replayed by `rag-assets replay --fusion` before it serves
    if published is not None and published.table == staged.table and not force:
        return None, f"no model change ({staged.table} serves already): not replayed"
    th = store.read_text(eval_name(staged, "threshold.json"))
    if th is None:
        return None, "the candidate has no calibrated cut yet"
    cut = float(json.loads(th)["cut"])
    if not hasattr(embedder, "encode_queries"):  # a function of the candidate's stamps
        embedder = embedder(staged.stamps)
    candidate = Index(store, staged, embedder, reranker, distance_cut=cut, fusion=chosen)
    report = replay(candidate, entries, log.reviews(trusted=True), cut=cut)
    name = eval_name(staged, f"{REPLAY_NAME}.json")
    store.write_files(
        {
            name: json.dumps(report, indent=2),
            eval_name(staged, f"{REPLAY_NAME}.md"): report["table"],
        }
    )
    return report, store.file_location(name)


def build_reviews_sensor(index_uri: str, name: str = "") -> dg.SensorDefinition:
    """``traffic_reviews_sensor``: re-evaluates when the reviews changed since
    ``eval_questions`` last read them (the digest it recorded in the store). ``name``: the
    ``RagIndex`` component's (issue 51; its keys are prefixed with it)."""
    from rag_assets.defs.namespace import key, qualified

    selection = [key(name, a) for a in (QUERY_LOG_KEY.path[-1], "eval_questions", *EVALUATED_TAIL)]

    @dg.sensor(
        name=qualified(name, "traffic_reviews_sensor"),
        minimum_interval_seconds=120,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(*selection),
        description="Requests eval_questions and the evaluation, calibration and publish after it "
        "when reviews in the query log changed since the evaluation last read them: the cut "
        "follows reviewed traffic with no manual run. Reading the reviews' digest is all an "
        "unchanged log costs.",
    )
    def traffic_reviews_sensor(context: dg.SensorEvaluationContext) -> Any:
        if not is_remote(index_uri) and not Path(index_uri).expanduser().is_dir():
            return dg.SkipReason("no index yet")  # a query never creates the directory
        store = IndexStore(index_uri)
        if store.published(strict=False) is None:
            return dg.SkipReason("nothing published yet")
        log = QueryLog(store)
        if not log.exists(FEEDBACK_TABLE):
            return dg.SkipReason("no reviews in the query log")
        digest = log.reviews_digest()
        decision = read_decision(store)
        if decision is not None and (decision.traffic or {}).get("digest") == digest:
            return dg.SkipReason("the evaluation has read every review")
        if decision is None and not log.reviews(trusted=True):
            return dg.SkipReason("no reviews in the query log")
        return dg.RunRequest(
            run_key=f"reviews-{digest[:16]}",
            asset_selection=selection,
            tags={"rag/reason": "new reviews in the query log"},
        )

    return traffic_reviews_sensor
