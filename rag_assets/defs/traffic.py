"""The query log in the graph (issue 33, group ``traffic``).

- ``query_log`` (observable source): the log kept with the index. Each observation records
  its figures (queries per day, refusal rate, nearest-distance and latency percentiles, review
  counts) as numeric metadata, which the UI plots; its data version is the digest of the
  reviews, so only a new or changed review makes ``eval_questions`` stale (an unchanged log
  costs nothing). Observed on ``RAG_REINDEX_CRON`` and in every ``rag-assets index`` run.
- ``query_log_drift`` (check, WARN): the refusal rate or the median nearest distance of the
  newest asks far outside their trailing windows (:mod:`rag_assets.lib.evaluate.traffic_watch`).
- ``content_gaps``: the most frequent refused or ``should_refuse`` questions grouped by
  similarity, a Markdown and a JSON file in the store (``reports/content-gaps.md``).
- ``not_worse_on_traffic`` (blocking check on ``refusal_threshold``): on a model or fusion
  change, every logged question replayed on the candidate before it is published
  (:mod:`rag_assets.lib.evaluate.replay`); fails when the paired sign tests on reviewed
  questions say the candidate is significantly worse.
- ``traffic_reviews_sensor``: requests ``eval_questions`` and the evaluation after it when the
  reviews changed since the evaluation last read them, so the cut follows the traffic.

Users' questions stay in the index store: the metadata here are counts and figures only.
"""


import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.resources import EmbeddingModel, LanceIndex, RerankModel
from rag_assets.lib.evaluate import traffic_watch as watch
from rag_assets.lib.evaluate.traffic import FOLDER
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.index.store.querylog import FEEDBACK_TABLE, QUERIES_TABLE, QueryLog

QUERY_LOG_KEY = dg.AssetKey("query_log")
GAPS_MD = "reports/content-gaps.md"
GAPS_JSON = "reports/content-gaps.json"
REPLAY_NAME = "replay"  # evaluation/<table>@<version>.replay.json / .replay.md

_METRIC_COLUMNS = ["id", "at_ns", "interface", "decision", "nearest_distance", "latency_ms"]

AC = dg.AutomationCondition


# -- the traffic question set (used by eval_questions and retrieval_eval) ---------------------
def traffic_choice(
    store: IndexStore, texts: dict[str, str], configured: Any, log: Any
) -> tuple[Any, dict[str, Any]]:
    """``question_source.traffic_decision`` on this store: the set written to
    ``evaluation/traffic`` (files locally, ``_rag_files`` rows on object storage)."""
    from rag_assets.lib.evaluate.question_source import traffic_decision

    qlog = QueryLog(store)
    if not qlog.exists(FEEDBACK_TABLE) or not qlog.reviews():
        if store.file_names(FOLDER):  # every review purged: the old set goes too
            store.write_files(dict.fromkeys(store.file_names(FOLDER)))
        return None, {}
    digest = qlog.reviews_digest()
    if not store.remote:
        decision, progress = traffic_decision(qlog, texts, store.file_path(FOLDER), configured)
    else:
        with tempfile.TemporaryDirectory(prefix="rag-traffic-") as tmp:
            folder = Path(tmp) / "traffic"
            decision, progress = traffic_decision(
                qlog, texts, folder, configured, shown=store.file_location(FOLDER)
            )
            store.write_tree(FOLDER, folder)
    progress["digest"] = digest
    if decision is not None:
        decision.traffic = progress
        if decision.source.endswith("traffic"):
            log.info(f"evaluation set: {decision.label} ({decision.counts})")
    return decision, progress


def traffic_progress(store: IndexStore) -> dict[str, Any]:
    """Review progress of this store's log ({} when it has no reviews)."""
    from rag_assets.lib.evaluate.traffic import review_progress

    qlog = QueryLog(store)
    if not qlog.exists(FEEDBACK_TABLE):
        return {}
    return review_progress(qlog) | {"digest": qlog.reviews_digest()}


def traffic_metadata(progress: dict[str, Any]) -> dict[str, Any]:
    """Numeric metadata of the review progress (plotted in the UI; no question text)."""
    if not progress:
        return {}
    need = progress.get("needed", {})
    return {
        "traffic/reviewed": dg.MetadataValue.int(int(progress.get("reviewed", 0))),
        "traffic/answerable": dg.MetadataValue.int(int(progress.get("answerable", 0))),
        "traffic/out_of_domain": dg.MetadataValue.int(int(progress.get("out_of_domain", 0))),
        "traffic/needed_answerable": dg.MetadataValue.int(int(need.get("answerable", 0))),
        "traffic/needed_out_of_domain": dg.MetadataValue.int(int(need.get("out_of_domain", 0))),
        "traffic/dropped": dg.MetadataValue.int(int(progress.get("dropped", 0))),
    }


_COPY: dict[str, tempfile.TemporaryDirectory[str]] = {}


def traffic_copy(store: IndexStore) -> Path:
    """A scratch copy of an object-store index's traffic set (for code that reads files); the
    previous copy is removed, the last one when the process ends."""
    for old in list(_COPY):
        _COPY.pop(old).cleanup()
    tmp = tempfile.TemporaryDirectory(prefix="rag-traffic-")
    _COPY[tmp.name] = tmp
    folder = Path(tmp.name) / "traffic"
    store.read_tree(FOLDER, folder)
    return folder


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
        log = QueryLog(lance_index.store())
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
        entries = log.entries(columns=_METRIC_COLUMNS) if log.exists(QUERIES_TABLE) else []
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
        log = QueryLog(store)
        entries = log.entries(columns=["id", "question", "decision"]) if log.exists() else []
        questions = watch.gap_questions(entries, log.reviews())
        embed, grouped_by = None, "shared words"
        if questions:
            try:
                embedder = embedding_model.embedder()
                embed, grouped_by = embedder.encode_queries, f"{embedder.spec.model_id} embeddings"
            except Exception as exc:  # noqa: BLE001 - words group them too
                context.log.warning(f"content gaps grouped by words: the model failed ({exc})")
        groups = watch.content_gaps(questions, embed)
        from rag_assets.lib.query.log import now

        md = watch.gaps_markdown(groups, now()[0], grouped_by)
        store.write_files(
            {GAPS_MD: md, GAPS_JSON: json.dumps({"grouped_by": grouped_by, "groups": groups})}
        )
        return dg.MaterializeResult(
            metadata={
                "groups": dg.MetadataValue.int(len(groups)),
                "questions": dg.MetadataValue.int(len(questions)),
                "asked": dg.MetadataValue.int(sum(n for _, n, _ in questions)),
                "largest_group": dg.MetadataValue.int(groups[0]["asked"] if groups else 0),
                "report": dg.MetadataValue.path(store.file_location(GAPS_MD)),
            }
        )

    @dg.asset_check(
        asset="refusal_threshold",
        name="not_worse_on_traffic",
        blocking=True,
        description="Blocking gate on a model or fusion change: every logged question is "
        "replayed on the candidate table at its calibrated cut; reports top-4 agreement with "
        "what users were shown and decision flips, and fails when the paired sign tests on "
        "reviewed questions (hit@4, answered with the needle, refusals) say the candidate is "
        "significantly worse (p < 0.05). Passes when nothing changed or nothing was logged.",
    )
    def not_worse_on_traffic(
        lance_index: LanceIndex, embedding_model: EmbeddingModel, rerank_model: RerankModel
    ) -> dg.AssetCheckResult:
        store = lance_index.store()
        report, why = replay_candidate(
            store, embedding_model.embedder(), rerank_model.reranker(), fusion
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
        return dg.AssetCheckResult(passed=not report["worse"], metadata=meta)

    return [query_log, query_log_drift, content_gaps, not_worse_on_traffic]


def replay_candidate(
    store: IndexStore, embedder: Any, reranker: Any, fusion: str, *, force: bool = False
) -> tuple[dict[str, Any] | None, str]:
    """Replay the log on the staged table (at its calibrated cut, with ``fusion``) when it is a
    model change (another table than the published one) or a fusion change (the log's newest
    entry was served with another fusion), or with ``force``. Returns (report, where it was
    written) or (None, why not)."""
    from rag_assets.defs.evaluation import _eval_name
    from rag_assets.lib.evaluate.replay import replay
    from rag_assets.lib.query.fusion import parse_fusion
    from rag_assets.lib.query.retrieve import Index

    log = QueryLog(store)
    entries = log.entries() if log.exists() else []
    if not entries:
        return None, "no logged questions"
    published = store.published(strict=False)
    staged = store.staging()
    chosen = parse_fusion(fusion)
    served = str(entries[-1].get("fusion") or "")
    changed = published is None or published.table != staged.table or served != chosen.label
    if not changed and not force:
        return None, (
            f"no model or fusion change ({staged.table}, fusion {chosen.label}): not replayed"
        )
    th = store.read_text(_eval_name(staged, "threshold.json"))
    if th is None:
        return None, "the candidate has no calibrated cut yet"
    cut = float(json.loads(th)["cut"])
    candidate = Index(store, staged, embedder, reranker, distance_cut=cut, fusion=chosen)
    report = replay(candidate, entries, log.reviews(), cut=cut)
    name = _eval_name(staged, f"{REPLAY_NAME}.json")
    store.write_files(
        {
            name: json.dumps(report, indent=2),
            _eval_name(staged, f"{REPLAY_NAME}.md"): report["table"],
        }
    )
    return report, store.file_location(name)


def build_reviews_sensor(index_uri: str) -> dg.SensorDefinition:
    """``traffic_reviews_sensor``: re-evaluates when the reviews changed since
    ``eval_questions`` last read them (the digest it recorded in the store)."""
    from rag_assets.defs.evaluation import EVALUATED_TAIL

    @dg.sensor(
        name="traffic_reviews_sensor",
        minimum_interval_seconds=120,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(QUERY_LOG_KEY, "eval_questions", *EVALUATED_TAIL),
        description="Requests eval_questions and the evaluation, calibration and publish after it "
        "when reviews in the query log changed since the evaluation last read them: the cut "
        "follows reviewed traffic with no manual run. Reading the reviews' digest is all an "
        "unchanged log costs.",
    )
    def traffic_reviews_sensor(context: dg.SensorEvaluationContext) -> Any:
        from rag_assets.defs.build import open_existing
        from rag_assets.defs.questions import read_decision

        store = open_existing(index_uri)
        if store is None or store.published(strict=False) is None:
            return dg.SkipReason("nothing published yet")
        log = QueryLog(store)
        if not log.exists(FEEDBACK_TABLE):
            return dg.SkipReason("no reviews in the query log")
        digest = log.reviews_digest()
        decision = read_decision(store)
        if decision is not None and (decision.traffic or {}).get("digest") == digest:
            return dg.SkipReason("the evaluation has read every review")
        if decision is None and not log.reviews():
            return dg.SkipReason("no reviews in the query log")
        return dg.RunRequest(
            run_key=f"reviews-{digest[:16]}",
            asset_selection=[QUERY_LOG_KEY, dg.AssetKey("eval_questions")]
            + [dg.AssetKey(k) for k in EVALUATED_TAIL],
            tags={"rag/reason": "new reviews in the query log"},
        )

    return traffic_reviews_sensor


def forget_derived(store: IndexStore) -> list[str]:
    """After a purge: remove what was made from the purged questions (the traffic set, the
    content-gap report), for the next run to make again; returns the names removed."""
    names = [*store.file_names(FOLDER), *(n for n in (GAPS_MD, GAPS_JSON) if store.read_file(n))]
    if names:
        store.write_files(dict.fromkeys(names))
    if not store.remote:
        shutil.rmtree(store.file_path(FOLDER), ignore_errors=True)
    return names
