"""The ``adapted_encoder`` asset (issue 32): the configured model fine-tuned on the corpus.

On where it pays (issue 44, ``RAG_ADAPT=auto``, the default): nothing is trained before the base
model's table is published (the first answers never wait for a training), then a corpus that
gives enough pairs is trained when its training fits ``RAG_ADAPT_BUDGET_S`` (on CUDA, always).
With ``RAG_ADAPT=off`` the asset is not in the graph and every table, code version and query is
exactly what it was without it. With ``auto`` or ``on`` it sits between
``chunks`` and ``chunk_embeddings``: each run it applies the retrain policy
(``RAG_ADAPT_RETRAIN``, :mod:`rag_assets.lib.index.adapt_policy`), trains when it says so
(:mod:`rag_assets.lib.index.adapt`), measures the held-out self-retrieval MRR of the base and the
adapted model, and records the outcome in the index (:mod:`rag_assets.lib.index.adapted`). Its
data version is the model the embeddings are to be written with: a newly proposed model makes
``chunk_embeddings`` stale (a new table, evaluated, gated by ``not_worse_than_published``, one
``rollback`` away), a kept one or one not proposed changes nothing downstream.
``rag-assets adapt`` runs it (one run, ``adapt_job``, :func:`rag_assets.defs.run.run_adapt`);
``--force`` retrains now.
(No ``from __future__ import annotations`` here: Dagster reads the context annotations.)
"""

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

import dagster as dg

from rag_assets.defs.progress import StepProgress
from rag_assets.defs.resources import (
    ASSET_LEASE_WAIT_S,
    DocumentsFolder,
    EmbeddingModel,
    LanceIndex,
)
from rag_assets.lib.evaluate.questions_gen import unrelated_questions
from rag_assets.lib.index.adapt import Recipe
from rag_assets.lib.index.adapt_policy import RetrainPolicy, parse_policy
from rag_assets.lib.index.adapted import (
    WAITS,
    AdaptOutcome,
    AutoBounds,
    adapt_encoder,
    effective_stamps,
    is_adapted,
    read_record,
)
from rag_assets.lib.index.pipeline import digest
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import ChunkStrategy
from rag_assets.settings import Settings, adapt_mode

ADAPT_SETTING = "RAG_ADAPT"
ADAPT_JOB = "adapt_job"  # `rag-assets adapt`: ingest + adapted_encoder, one run
FORCE_TAG = "rag/adapt-force"  # "1": retrain whatever the policy says
DEFAULT_TRAIN_THREADS = 2  # torch threads while training when RAG_EMBED_THREADS is unset
BASE_RECIPE = Recipe()
"""The measured recipe; ``RAG_ADAPT_STEPS`` / ``RAG_ADAPT_MAX_STEPS`` replace its step fields."""


@dataclass(frozen=True)
class AdaptConfig:
    """The recipe and the retrain policy, resolved once when the definitions are built."""

    recipe: Recipe
    policy: RetrainPolicy
    threads: int  # torch threads while training
    auto: AutoBounds | None = None  # RAG_ADAPT=auto's floor and budget (None: on)

    @property
    def code_suffix(self) -> str:
        """What ``chunk_embeddings``' code version carries unless ``RAG_ADAPT=off``: switching
        adaptation on or changing the recipe is a code change of the embedding step."""
        return f";adapt={self.recipe.stamp}"


def adapt_config(settings: Settings) -> AdaptConfig | None:
    """None when ``RAG_ADAPT`` is off (``off``, ``0``), or ``auto`` with an encoder this process
    cannot train (issue 51: a model server, a model without weights here); else the recipe, the
    policy and, for ``auto`` (the default), the pairs floor and ``RAG_ADAPT_BUDGET_S``. ``on``
    with such an encoder is a ValueError, in one line (refused before anything runs)."""
    from rag_assets.lib.index.adapt_scope import refusal, why_not_trainable

    mode = adapt_mode(settings.adapt)
    if mode == "off":
        return None
    refused = refusal(settings)
    if refused:
        raise ValueError(refused)
    if mode == "auto" and why_not_trainable(settings):
        return None
    policy = parse_policy(settings.adapt_retrain)
    if policy.cron:
        from dagster._utils.schedules import is_valid_cron_string

        if not is_valid_cron_string(policy.cron):
            raise ValueError(
                f"RAG_ADAPT_RETRAIN: cron:{policy.cron!r} is not a valid five-field cron "
                "expression (e.g. cron:0 3 * * 0)"
            )
    recipe = replace(BASE_RECIPE, steps=settings.adapt_steps, max_steps=settings.adapt_max_steps)
    auto = AutoBounds(budget_s=settings.adapt_budget_s) if mode == "auto" else None
    return AdaptConfig(recipe, policy, settings.embed_threads or DEFAULT_TRAIN_THREADS, auto)


def run_stamps(stamps: Stamps, store: Any, adapt: Any) -> Stamps:
    """The stamps a run embeds with: the adapted model's when adaptation is on, the index's
    record proposes one trained from this base model and a version is published (the one it is
    gated against), else ``stamps``."""
    if adapt is None:
        return stamps
    return effective_stamps(stamps, read_record(store), store.published(strict=False) is not None)


def build_adapt_asset(
    config: AdaptConfig | None, chunks: Any, stamps: Stamps, strategy: ChunkStrategy
) -> Any:
    """The ``adapted_encoder`` asset, or None when adaptation is off."""
    if config is None:
        return None
    AC = dg.AutomationCondition
    # eager (the chunks changed: the policy decides), a recipe or base model change, and, unlike
    # the other assets, missing: switching RAG_ADAPT on makes chunk_embeddings' code version
    # change, and the sensor must train before it embeds (once: not after a failed training)
    missing = AC.missing() & ~AC.any_deps_missing() & ~AC.in_progress() & ~AC.execution_failed()
    fires = AC.eager() | AC.code_version_changed() | missing.with_label("missing")
    if config.policy.cron:
        fires = fires | AC.cron_tick_passed(config.policy.cron, "UTC")
    automation = (fires & AC.all_deps_blocking_checks_passed()).with_label("adapt_policy")
    recipe, policy = config.recipe, config.policy

    @dg.asset(
        deps=[chunks],
        group_name="embedding",
        code_version=f"{stamps.model}|{stamps.revision}|{recipe.stamp}",
        automation_condition=automation,
        kinds={"pytorch"},
    )
    def adapted_encoder(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        embedding_model: EmbeddingModel,
        lance_index: LanceIndex,
    ) -> dg.MaterializeResult:
        """The configured encoder fine-tuned on this corpus's own sentences (inverse-cloze
        pairs, in-batch negatives; no questions used), trained when the retrain policy says so
        (RAG_ADAPT_RETRAIN) and proposed only when it beats its base on held-out sentences
        of the corpus (self-retrieval MRR). A proposed model is what `chunk_embeddings` embeds
        with next: a new table, evaluated and gated like any model upgrade."""
        from rag_assets.defs.artefacts import artefacts_of

        chunk_list = artefacts_of(documents, lance_index).chunks(strategy.pipeline_version)
        base = embedding_model.embedder().spec
        store = lance_index.store()
        force = context.run.tags.get(FORCE_TAG, "") == "1"
        tick = _last_tick(policy.cron)
        steps_done = StepProgress(context, "adapt/training", "steps")  # issue 44: lines, a bar
        outcome = adapt_encoder(
            store,
            chunk_list,
            base,
            recipe,
            policy,
            lance_index.work_dir,
            force=force,
            device=embedding_model.device,
            threads=config.threads,
            batch_size=embedding_model.batch_size,
            last_tick=tick,
            log=context.log.info,
            # the writer lease (issue 25) around the writes only, not the training: re-entrant
            # under `rag-assets index`, waited for in a sensor or UI run
            writing=lambda: store.hold(context.run.run_id, wait_s=ASSET_LEASE_WAIT_S),
            progress=lambda step, steps, loss: steps_done(step, steps, f"loss {loss:.3f}"),
            unrelated=unrelated_questions(),  # issue 44: the separation the gate keeps
            auto=config.auto,  # issue 44: after a first publish, enough pairs, in the budget
            published=store.published(strict=False) is not None,
        )
        effective = run_stamps(stamps, store, config)
        return dg.MaterializeResult(
            data_version=dg.DataVersion(
                digest({"model": effective.model, "revision": effective.revision})
            ),
            metadata=adapt_metadata(outcome, effective),
        )

    return adapted_encoder


def _last_tick(cron: str) -> dt.datetime | None:
    if not cron:
        return None
    from dagster._utils.schedules import get_latest_completed_cron_tick

    return get_latest_completed_cron_tick(cron, dt.datetime.now(dt.UTC), "UTC")


def adapt_metadata(outcome: AdaptOutcome, effective: Stamps) -> dict[str, Any]:
    """The asset's metadata: numbers Dagster plots across runs (loss, MRR, pairs, time), the
    loss curve as a list and a plot, and what the embeddings are written with."""
    r = outcome.record
    meta: dict[str, Any] = {
        "trained": dg.MetadataValue.int(int(outcome.trained)),
        "decision": outcome.reason,
        "changed_since_training": dg.MetadataValue.float(round(outcome.changed_share, 4)),
        "embedding_model": effective.model,
        "embedding_revision": effective.revision,
    }
    if outcome.waits:  # issue 44: auto trains after the base model's first publish
        meta["deferred"] = WAITS
    if r is None:
        return meta
    if r.proposed and effective.model != r.model_id and r.base_model == effective.model:
        meta["deferred"] = (
            "nothing is published yet: the base model's table is published first, then the "
            "adapted one is embedded, gated against it and one rollback away from it"
        )
    sr = r.self_retrieval or {}
    base, adapted = sr.get("base") or {}, sr.get("adapted") or {}
    meta |= {
        "status": r.status,
        "reason": r.reason,
        "model": r.model_id,
        "revision": r.revision or "not stored (not proposed)",
        "base_model": f"{r.base_model} (rev {r.base_revision})",
        "recipe": dg.MetadataValue.json({"stamp": r.recipe, **r.recipe_params}),
        "pairs_hash": r.pairs_hash,
        "seed": dg.MetadataValue.int(r.seed),
        "pairs": dg.MetadataValue.int(int(r.counts.get("pairs", 0))),
        "held_out_sentences": dg.MetadataValue.int(int(r.counts.get("held_out", 0))),
        "steps": dg.MetadataValue.int(r.steps),
        "train_seconds": dg.MetadataValue.float(float(r.train_seconds)),
        "trained_at": r.trained_at,
        "device": r.device,
        "loss_curve": dg.MetadataValue.json(list(r.loss_curve)),
    }
    if r.loss_curve:
        curve = r.loss_curve
        meta["final_loss"] = dg.MetadataValue.float(float(curve[-1]))
        meta["mean_loss"] = dg.MetadataValue.float(float(sum(curve) / len(curve)))
        plot = _loss_plot(curve)
        if plot:
            meta["loss_plot"] = dg.MetadataValue.md(plot)
    if base and adapted:
        meta["self_mrr/base"] = dg.MetadataValue.float(float(base["mrr"]))
        meta["self_mrr/adapted"] = dg.MetadataValue.float(float(adapted["mrr"]))
        meta["self_mrr/gain"] = dg.MetadataValue.float(round(adapted["mrr"] - base["mrr"], 4))
        meta["self_hit@1/base"] = dg.MetadataValue.float(float(base["hit@1"]))
        meta["self_hit@1/adapted"] = dg.MetadataValue.float(float(adapted["hit@1"]))
    sep = sr.get("separation") or {}
    if sep:  # issue 44: held-out sentences answered at the unrelated questions' 10 % cut
        meta["separation/base"] = dg.MetadataValue.float(float(sep["base"]["answered"]))
        meta["separation/adapted"] = dg.MetadataValue.float(float(sep["adapted"]["answered"]))
    return meta


def _loss_plot(curve: list[float]) -> str:
    """The loss curve as an inline PNG (Markdown), or "" when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return ""
    import base64
    import io

    fig, ax = plt.subplots(figsize=(5, 2.5), dpi=80)
    ax.plot(range(1, len(curve) + 1), curve, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("ranking loss")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return f"![training loss](data:image/png;base64,{data})"


def adaptation_report(store: Any, stamps: Stamps) -> dict[str, Any] | None:
    """What the evaluation report says of adaptation for a table with ``stamps``: the last
    training of this index when it was adapted from this table's base model (or is this
    table's model): status, held-out self-retrieval MRR before/after, and whether this table is
    embedded by it. None when the index was never adapted."""
    record = read_record(store)
    if record is None:
        return None
    applies = is_adapted(stamps.model)
    if not applies and (record.base_model, record.base_revision) != (stamps.model, stamps.revision):
        return None
    return {
        "status": record.status,
        "reason": record.reason,
        "model": record.model_id,
        "revision": record.revision,
        "trained_at": record.trained_at,
        "self_retrieval": record.self_retrieval,
        "this_table_adapted": applies,
        "this_table_is_the_record": applies and stamps.revision == record.revision,
    }


def report_line(report: dict[str, Any] | None) -> str:
    """One Markdown line for the evaluation results, or ""."""
    if not report:
        return ""
    sr = report.get("self_retrieval") or {}
    if not (sr.get("base") and sr.get("adapted")):
        return f"**adapted encoder**: {report['status']} ({report['reason']})"
    b, a = sr["base"], sr["adapted"]
    table = "this table is embedded with it" if report["this_table_adapted"] else "base model"
    return (
        f"**held-out self-retrieval MRR** ({b['queries']} corpus sentences never trained on): "
        f"base {b['mrr']:.3f} → adapted {a['mrr']:.3f}; {report['status']}; {table}"
    )


def summary(md: dict[str, Any], settings: Settings | None) -> str:
    """What ``rag-assets adapt`` (and ``index``'s summary) says about the adapted encoder."""
    lines = [f"adapted encoder: {md.get('decision', '')}"]
    if "status" in md:
        line = f"  {md['model']}: {md['status']}"
        if md.get("reason") and str(md["reason"]) not in str(md.get("decision", "")):
            line += f" ({md['reason']})"  # issue 43: why, not only in --json
        if "self_mrr/base" in md:
            line += (
                f"; held-out self-retrieval MRR {md['self_mrr/base']:.3f} → "
                f"{md['self_mrr/adapted']:.3f} ({md['held_out_sentences']} sentences)"
            )
        lines.append(line)
        if "separation/base" in md:  # issue 44
            n = int(md["held_out_sentences"])
            lines.append(
                f"  separation from unrelated questions: {round(md['separation/base'] * n)} → "
                f"{round(md['separation/adapted'] * n)} of {n} held-out sentences answered at the "
                "cut that lets 10 % of the shipped unrelated questions through"
            )
        if md.get("trained"):
            loss = f", loss {md['final_loss']:.3f}" if "final_loss" in md else ""
            lines.append(
                f"  {md['pairs']} pairs, {md['steps']} steps in {md['train_seconds']:.0f} s on "
                f"{md['device']}{loss}"
            )
    lines.append(f"  embeddings are written with: {md.get('embedding_model', '?')}")
    if md.get("deferred") and md["deferred"] != md.get("decision"):
        lines.append(f"  ({md['deferred']})")
    if settings is not None and adapt_mode(settings.adapt) == "off":
        lines.append(
            "  RAG_ADAPT is off: `rag-assets index` keeps the base model; set RAG_ADAPT=auto to "
            "embed with the adapted one (a new table, published only through the gate)"
        )
    return "\n".join(lines)
