"""The adapted encoder as an artefact of the index (issue 32): where it is stored, which model
the embedding stamps name, and the one call that decides, trains, measures and records.

Stored with the index, through the store's files (:mod:`rag_assets.lib.index.store.files`: files
under the index directory, ``_rag_files`` rows on object storage):

- ``adapted/models/<revision>/``: each proposed model, a sentence-transformers folder named by
  its content hash (:func:`rag_assets.lib.index.versioning.model_revision`, the embedding
  stamps' ``revision``). Old ones stay: a rollback to a table embedded with one needs it.
- ``adapted/record.json``: the last decision (:class:`AdaptationRecord`): proposed or not, the
  base model and revision, the recipe and its parameters, the pairs' hash, the seed, the loss
  curve, the held-out self-retrieval MRR of the base and the adapted model, and the content
  hashes of the chunks it was trained on (what the retrain policy compares with).

A proposed model is embedded under its own stamps: model ``<base id>@adapted-<key>`` (the key
hashes base model, base revision, recipe, pairs and seed) and revision = its folder's content
hash, so its vectors go to a table of their own, which serves only after the evaluation gate,
one ``rollback`` away from the base model's. Queries follow the published table
(:func:`query_spec`): a table embedded by an adapted model is queried by that model (copied
from an object store once into ``RAG_WORK_DIR/adapted-models/<revision>``, checked by hash).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_assets.lib.index.adapt import (
    SEPARATION_BLUFF_RATE,
    TRAINING_FILE,
    PairSet,
    Recipe,
    SelfRetrieval,
    Separation,
    Training,
    build_pairs,
    held_out_measures,
    train_encoder,
)
from rag_assets.lib.index.adapt_policy import RetrainPolicy, changed_share, retrain_due
from rag_assets.lib.index.embed import Embedder, ModelNotAvailable, ModelSpec, resolve_device
from rag_assets.lib.index.versioning import Stamps, model_revision
from rag_assets.lib.types import sha256_text

if TYPE_CHECKING:
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.types import Chunk

ADAPTED_MARK = "@adapted-"  # in the model id of every adapted model
RECORD_FILE = "adapted/record.json"
MODELS_DIR = "adapted/models"
CACHE_DIR = "adapt-cache"  # under RAG_WORK_DIR: trained folders by adaptation key (resumable)
LOCAL_MODELS = "adapted-models"  # under RAG_WORK_DIR: object-store models copied for loading
PROPOSED, NOT_PROPOSED, NOT_TRAINED = "proposed", "not proposed", "not trained"
HASH_CHARS = 16  # hex characters of a chunk hash kept in the record
MIN_PAIRS = 150
"""Automatic adaptation's floor in training pairs (issue 44): about 17 held-out sentences, the
fewest on which the gate's two checks were seen to tell an over-trained model from a useful one
(docs/adaptation.md#when-auto-trains). ``RAG_ADAPT=on`` trains under it as well."""
SEPARATION_TOLERANCE = 0.005  # share of the held-out sentences (at least one), see decide
PROBE_STEPS = 4  # auto: steps timed before the whole training is projected against the budget
WAITS = (
    "nothing is published yet: the base model's table is published first, then the encoder is "
    "adapted and its table gated against it (RAG_ADAPT=auto)"
)


@dataclass(frozen=True)
class AutoBounds:
    """When ``RAG_ADAPT=auto`` trains (issue 44): after a first publish, with at least
    ``min_pairs`` pairs, and on a CPU only when the training, projected from its first steps,
    fits ``budget_s`` seconds (0 = no bound; on CUDA it always fits)."""

    min_pairs: int = MIN_PAIRS
    budget_s: float = 1800.0


class OverBudget(Exception):
    """The training's first steps project it past ``RAG_ADAPT_BUDGET_S`` (auto only)."""

    def __init__(self, projected_s: float, steps: int, per_step_s: float) -> None:
        super().__init__(f"{projected_s:.0f} s projected")
        self.projected_s, self.steps, self.per_step_s = projected_s, steps, per_step_s


@dataclass
class AdaptationRecord:
    """The last adaptation of this index (``adapted/record.json``)."""

    status: str  # "proposed" | "not proposed"
    reason: str  # why it was (not) proposed
    model_id: str  # "<base>@adapted-<key>"
    revision: str  # content hash of the model folder (the embedding stamps' revision)
    key: str  # hash of base model, base revision, recipe, pairs, seed
    base_model: str
    base_revision: str
    recipe: str  # Recipe.stamp: version + digest of the parameters
    recipe_params: dict[str, Any]
    pairs_hash: str
    seed: int
    counts: dict[str, int]  # pairs, held_out, sentences, chunks, ...
    steps: int
    train_seconds: float
    loss_curve: list[float]
    self_retrieval: dict[str, Any]  # {"base": {...}, "adapted": {...}, "wins", "losses"}
    trained_at: str
    trained_because: str
    device: str
    trained_chunks: list[str] = field(default_factory=list)  # chunk text hashes (16 hex)

    @property
    def proposed(self) -> bool:
        return self.status == PROPOSED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """Everything but the chunk hashes (for status, metadata and logs)."""
        d = self.to_dict()
        d.pop("trained_chunks")
        d["chunks_trained_on"] = len(self.trained_chunks)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AdaptationRecord:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class AdaptOutcome:
    """What :func:`adapt_encoder` did in this run."""

    record: AdaptationRecord | None  # the record now in effect (None: never adapted)
    trained: bool  # a training (or a cached one) was done and measured in this run
    reason: str  # why it trained, or why the current model stays
    changed_share: float  # chunks new or changed since the last training
    from_cache: bool = False  # the trained folder came from RAG_WORK_DIR/adapt-cache
    waits: bool = False  # auto: nothing published yet, the base model's table goes first


def is_adapted(model_id: str) -> bool:
    return ADAPTED_MARK in model_id


def read_record(store: IndexStore) -> AdaptationRecord | None:
    text = store.read_text(RECORD_FILE)
    return None if text is None else AdaptationRecord.from_dict(json.loads(text))


def chunk_hashes(chunks: Sequence[Chunk]) -> list[str]:
    """The hashes the retrain policy compares: sha256 of each chunk's embedded text."""
    return [sha256_text(c.text)[:HASH_CHARS] for c in chunks]


def effective_stamps(
    base: Stamps, record: AdaptationRecord | None, published: bool = True
) -> Stamps:
    """The stamps embeddings are written with: the adapted model's when the record proposes one
    trained from this very base model and the index has a published version (``published``:
    on a new index the base model's table is published first, so that the adapted one is gated
    against it and one ``rollback`` away from it), else ``base`` unchanged."""
    if record is None or not record.proposed or not published:
        return base
    if (record.base_model, record.base_revision) != (base.model, base.revision):
        return base
    return replace(base, model=record.model_id, revision=record.revision)


def model_dir(store: IndexStore, revision: str, cache_root: str | Path) -> Path | None:
    """A local folder holding the stored adapted model ``revision`` (None when the index has
    none): the index's own folder locally; from an object store, a copy under
    ``cache_root/adapted-models/<revision>`` made once and checked against the hash."""
    name = f"{MODELS_DIR}/{revision}"
    if not store.remote:
        path = store.file_path(name)
        return path if (path / "modules.json").is_file() else None
    dest = Path(cache_root) / LOCAL_MODELS / revision
    if (dest / "modules.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{revision}-", dir=dest.parent))
    try:
        if not store.read_tree(name, tmp / "m"):
            return None
        got = model_revision(tmp / "m")
        if got != revision:
            raise ModelNotAvailable(
                f"the adapted model {revision} stored in {store.uri} hashes to {got}: the copy "
                "is damaged; run `rag-assets adapt --force` to train it again"
            )
        (tmp / "m").rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def spec_for(
    stamps: Stamps, base: ModelSpec, store: IndexStore, cache_root: str | Path
) -> ModelSpec | None:
    """The model that embeds for ``stamps`` when they name an adapted model trained from
    ``base`` (None: they do not; the caller keeps ``base``). Prompts, output size and precision
    are the base's (the adapted folder keeps the base's configuration)."""
    if not is_adapted(stamps.model):
        return None
    folder = model_dir(store, stamps.revision, cache_root)
    if folder is None:
        raise ModelNotAvailable(
            f"the table is embedded with {stamps.model} (rev {stamps.revision}), which is not "
            f"stored in {store.uri} ({MODELS_DIR}/{stamps.revision}): run `rag-assets rollback` "
            "to the base model's table, or `rag-assets adapt --force` and index again"
        )
    prov = json.loads((folder / TRAINING_FILE).read_text())
    if (prov.get("base_model"), prov.get("base_revision")) != (base.model_id, base.revision):
        return None  # adapted from another base: the stamp check names the difference
    return replace(base, model_id=stamps.model, path=folder, revision=stamps.revision)


def query_spec(index_uri: str, base: ModelSpec, cache_root: str | Path) -> ModelSpec:
    """The model queries of ``index_uri`` are embedded with: the published table's adapted
    model when it was adapted from ``base``, else ``base`` (no index, nothing published, a
    table of the base model or of another one: the caller's stamp check decides)."""
    from rag_assets.lib.index.store import IndexStore, is_remote

    if not is_remote(index_uri) and not Path(index_uri).expanduser().is_dir():
        return base
    store = IndexStore(index_uri)
    pub = store.published(strict=False)
    if pub is None:
        return base
    return spec_for(pub.stamps, base, store, cache_root) or base


def adaptation_key(base: ModelSpec, recipe: Recipe, pairs: PairSet) -> str:
    """Hash of what determines the weights: base model and revision, recipe, pairs, seed."""
    blob = json.dumps(
        [base.model_id, base.revision, base.query_prompt, base.document_prompt, recipe.stamp,
         pairs.digest, recipe.seed],
    )  # fmt: skip
    return sha256_text(blob)[:HASH_CHARS]


def adapt_encoder(
    store: IndexStore,
    chunks: Sequence[Chunk],
    base: ModelSpec,
    recipe: Recipe,
    policy: RetrainPolicy,
    cache_root: str | Path,
    *,
    force: bool = False,
    device: str = "auto",
    threads: int = 2,
    batch_size: int = 16,
    last_tick: dt.datetime | None = None,
    log: Callable[[str], None] = lambda _m: None,
    writing: Callable[[], AbstractContextManager[Any]] = nullcontext,
    progress: Callable[[int, int, float], None] | None = None,
    unrelated: Sequence[str] = (),
    auto: AutoBounds | None = None,
    published: bool = True,
) -> AdaptOutcome:
    """Decide (``policy``), train (or reuse the cached training of the same key), measure the
    held-out self-retrieval MRR of the base and the adapted model, and record the outcome in the
    index: proposed (stored in the index, the embeddings follow it) only when the adapted model
    beats its base on that MRR and, given ``unrelated`` questions (the graph passes the 221
    shipped ones), keeps the corpus as far from them as its base does (issue 44,
    :class:`~rag_assets.lib.index.adapt.Separation`: over-training brings them closer).

    ``device``: ``RAG_DEVICE`` (``auto``, ``cpu``, ``cuda``, …; an explicit device torch cannot
    use is refused before anything is written); ``threads``: torch threads while training;
    ``writing()``: a context held while the index is written (the writer lease), not while
    training; ``progress(step, steps, loss)``: called after every training step.

    ``auto`` (``RAG_ADAPT=auto``, issue 44): nothing is trained before a table is ``published``
    (the base serves first: the outcome says it waits), a corpus under ``auto.min_pairs`` pairs
    and a CPU training projected past ``auto.budget_s`` are recorded as ``not trained`` with the
    reason (the retrain policy then decides when to look again, as after any training)."""
    torch_device = resolve_device(device)  # ValueError naming RAG_DEVICE, before any work
    previous = read_record(store)
    hashes = chunk_hashes(chunks)
    share = changed_share(hashes, previous.trained_chunks if previous else [])
    same = previous is not None and (
        previous.base_model,
        previous.base_revision,
        previous.recipe,
    ) == (base.model_id, base.revision, recipe.stamp)
    due, why = retrain_due(
        policy,
        share,
        trained_at=previous.trained_at if previous else None,
        same_base_and_recipe=same,
        last_tick=last_tick,
        force=force,
    )
    if not due:
        return AdaptOutcome(previous, False, why, share)
    if auto is not None and not published:
        return AdaptOutcome(previous, False, WAITS, share, waits=True)
    log(f"adapting {base.model_id}: {why}")
    pair_set = build_pairs(chunks, recipe)
    key = adaptation_key(base, recipe, pair_set)
    model_id = f"{base.model_id}{ADAPTED_MARK}{key[:10]}"
    provenance = {
        "base_model": base.model_id,
        "base_revision": base.revision,
        "recipe": recipe.stamp,
        "recipe_params": recipe.params(),
        "pairs_hash": pair_set.digest,
        "seed": recipe.seed,
        "key": key,
        "model_id": model_id,
        "counts": pair_set.counts(),
        "steps": recipe.steps_for(len(pair_set.pairs)),
    }
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if not pair_set.pairs:
        record = _record(NOT_PROPOSED, "no training pairs in the corpus", provenance, "", None,
                         {}, now, why, torch_device, hashes)  # fmt: skip
        with writing():
            store.write_file(RECORD_FILE, json.dumps(record.to_dict()))
        return AdaptOutcome(record, True, record.reason, share)
    budget = 0.0 if auto is None or torch_device.startswith("cuda") else auto.budget_s
    skip = _too_few(len(pair_set.pairs), auto)
    if not skip:
        try:
            folder, training, cached = trained_folder(
                base, pair_set, recipe, cache_root, model_id, provenance, torch_device, threads,
                log, progress, budget_s=budget,
            )  # fmt: skip
        except OverBudget as over:
            skip = _over_budget(over, budget, torch_device)
    if skip:
        record = _record(NOT_TRAINED, skip, provenance, "", None, {}, now, why, torch_device,
                         hashes)  # fmt: skip
        with writing():
            store.write_file(RECORD_FILE, json.dumps(record.to_dict()))
        log(f"{model_id}: not trained ({skip})")
        return AdaptOutcome(record, False, skip, share)
    revision = model_revision(folder)
    adapted = replace(base, model_id=model_id, path=folder, revision=revision)
    measured = _measure(
        folder.parent, base, adapted, chunks, pair_set, batch_size, device, threads, unrelated
    )
    status, reason = decide(measured, bool(pair_set.held_out))
    record = _record(status, reason, provenance, revision, training, measured, now, why,
                     torch_device, hashes)  # fmt: skip
    with writing():
        if status == PROPOSED and not store.file_names(f"{MODELS_DIR}/{revision}"):
            store.write_tree(f"{MODELS_DIR}/{revision}", folder)  # one commit on object storage
        store.write_file(RECORD_FILE, json.dumps(record.to_dict()))
    log(f"{model_id}: {status} ({reason})")
    return AdaptOutcome(record, True, why, share, from_cache=cached)


def _too_few(pairs: int, auto: AutoBounds | None) -> str:
    """Why automatic adaptation does not train a corpus of ``pairs`` pairs ("" = it does)."""
    if auto is None or pairs >= auto.min_pairs:
        return ""
    return (
        f"the corpus gives {pairs} training pairs, fewer than the {auto.min_pairs} automatic "
        "adaptation needs to measure the result (RAG_ADAPT=on trains anyway)"
    )


def _over_budget(over: OverBudget, budget_s: float, device: str) -> str:
    return (
        f"the training would take about {over.projected_s / 60:.0f} min ({over.steps} steps at "
        f"{over.per_step_s:.1f} s on {device}), over RAG_ADAPT_BUDGET_S={budget_s:g}: raise it, "
        "train on a GPU (RAG_DEVICE=cuda) or run `rag-assets adapt --force`"
    )


def separation_tolerance(held_out: int) -> int:
    """Held-out sentences the separation may lose before the gate refuses a model: one, or
    :data:`SEPARATION_TOLERANCE` of them on a large corpus. Measured (issue 44, docs/adaptation.md):
    a useful training moves it by one or two sentences either way (course corpus, 160 held out:
    +2 at 25 and 50 steps, -1 at 100, answers 30 → 43 of 64); over-training loses 3 to 14
    (200 and 400 steps), and the BEIR corpora, whose nDCG@10 falls, lose 0.8-1.0 %."""
    return max(1, int(SEPARATION_TOLERANCE * held_out))


def decide(measured: dict[str, Any], held_out: bool) -> tuple[str, str]:
    """(status, one-line reason) of a measured training: proposed only when it beats its base on
    held-out self-retrieval MRR and its :class:`Separation` answers no more than
    :func:`separation_tolerance` fewer held-out sentences than the base's at the cut the
    unrelated questions allow (when it was measured)."""
    before, after = measured["base"]["mrr"], measured["adapted"]["mrr"]
    mrr = f"held-out self-retrieval MRR {before:.4f} → {after:.4f}"
    if not held_out:
        return NOT_PROPOSED, "no held-out sentences to measure it on"
    if after <= before:
        return NOT_PROPOSED, f"it does not beat its base on {mrr}"
    sep = measured.get("separation")
    if not sep:
        return PROPOSED, mrr
    b, a = sep["base"], sep["adapted"]
    n = b["held_out"]
    said = (
        f"at the cut that lets {SEPARATION_BLUFF_RATE:.0%} of the {b['unrelated']} shipped "
        f"unrelated questions through, {round(a['answered'] * n)}/{n} held-out sentences find "
        f"their own passage against {round(b['answered'] * n)}/{n} with the base model"
    )
    lost = round((b["answered"] - a["answered"]) * n)  # held-out sentences no longer answered
    if lost > separation_tolerance(n):
        return NOT_PROPOSED, (
            f"it brings unrelated questions closer to the corpus (over-trained?): {said}, "
            f"although {mrr}; fewer steps (RAG_ADAPT_STEPS) or no adaptation (RAG_ADAPT=off)"
        )
    return PROPOSED, f"{mrr}; separation from unrelated questions kept: {said}"


def trained_folder(
    base: ModelSpec,
    pair_set: PairSet,
    recipe: Recipe,
    cache_root: str | Path,
    model_id: str,
    provenance: dict[str, Any],
    device: str,
    threads: int,
    log: Callable[[str], None] = lambda _m: None,
    report: Callable[[int, int, float], None] | None = None,
    budget_s: float = 0.0,
) -> tuple[Path, Training, bool]:
    """The trained model folder of this adaptation key: ``<cache_root>/adapt-cache/<key>/model``
    (trained there first when missing; a killed training leaves only a temporary folder, so
    a re-run trains again and a finished one is reused). Returns (folder, training, cached).
    ``budget_s`` > 0: after :data:`PROBE_STEPS` steps the whole training is projected from
    their pace (the first step, which loads and warms up, apart) and :class:`OverBudget` is
    raised when it exceeds ``budget_s``."""
    root = Path(cache_root) / CACHE_DIR
    done = root / str(provenance["key"])
    if (done / "model" / "modules.json").is_file() and (done / "training.json").is_file():
        log(f"reusing the trained model {done}")
        return done / "model", Training(**json.loads((done / "training.json").read_text())), True
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{provenance['key']}-", dir=root))
    started = time.perf_counter()
    try:
        every = max(1, int(provenance["steps"]) // 10)
        clock: list[float] = []

        def progress(step: int, steps: int, loss: float) -> None:
            clock.append(time.perf_counter())
            if budget_s > 0 and step == min(PROBE_STEPS, steps) and step < steps and step > 1:
                per_step = (clock[-1] - clock[0]) / (step - 1)
                projected = clock[0] - started + per_step * (steps - 1)
                if projected > budget_s:
                    raise OverBudget(projected, steps, per_step)
            if report is not None:
                report(step, steps, loss)
            if step % every == 0 or step == steps:
                log(f"step {step}/{steps}: loss {loss:.4f}")

        training = train_encoder(
            base, pair_set, recipe, tmp / "model", model_id=model_id, provenance=provenance,
            device=device, threads=threads, progress=progress,
        )  # fmt: skip
        (tmp / "training.json").write_text(json.dumps(training.as_dict()))
        if done.exists():
            shutil.rmtree(done)
        tmp.rename(done)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return done / "model", training, False


def _measure(
    cache: Path,
    base: ModelSpec,
    adapted: ModelSpec,
    chunks: Sequence[Chunk],
    pair_set: PairSet,
    batch_size: int,
    device: str,
    threads: int,
    unrelated: Sequence[str] = (),
) -> dict[str, Any]:
    """Held-out self-retrieval of both models, and their separation from ``unrelated``
    questions when given (cached beside the trained folder, per output size and precision:
    ``RAG_EMBED_DIMS`` / ``RAG_EMBED_PRECISION`` change what is measured, not what is
    trained; the separation per list of questions)."""
    asked = sha256_text("\n".join(unrelated))[:8] if unrelated else "none"
    f = cache / f"self_retrieval-{base.dims}-{base.precision}-{asked}.json"
    if f.is_file():
        return dict(json.loads(f.read_text()))
    ordered = sorted(chunks, key=lambda c: c.chunk_id)
    results: dict[str, SelfRetrieval] = {}
    separation: dict[str, Separation | None] = {}
    for name, spec in (("base", base), ("adapted", adapted)):
        emb = Embedder(spec, batch_size=batch_size, threads=threads or None, device=device)
        results[name], separation[name] = held_out_measures(
            emb, ordered, pair_set.held_out, unrelated
        )
    a, b = results["adapted"].ranks, results["base"].ranks
    out: dict[str, Any] = {
        "base": results["base"].as_dict(),
        "adapted": results["adapted"].as_dict(),
        "wins": sum(x < y for x, y in zip(a, b, strict=True)),  # adapted ranks its chunk higher
        "losses": sum(x > y for x, y in zip(a, b, strict=True)),
    }
    sb, sa = separation["base"], separation["adapted"]
    if sb is not None and sa is not None:
        out["separation"] = {"base": sb.as_dict(), "adapted": sa.as_dict()}
    f.write_text(json.dumps(out))
    return out


def _record(
    status: str,
    reason: str,
    provenance: dict[str, Any],
    revision: str,
    training: Training | None,
    measured: dict[str, Any],
    now: str,
    why: str,
    device: str,
    hashes: list[str],
) -> AdaptationRecord:
    return AdaptationRecord(
        status=status,
        reason=reason,
        model_id=str(provenance["model_id"]),
        revision=revision,
        key=str(provenance["key"]),
        base_model=str(provenance["base_model"]),
        base_revision=str(provenance["base_revision"]),
        recipe=str(provenance["recipe"]),
        recipe_params=dict(provenance["recipe_params"]),
        pairs_hash=str(provenance["pairs_hash"]),
        seed=int(provenance["seed"]),
        counts=dict(provenance["counts"]),
        steps=training.steps if training else 0,
        train_seconds=training.seconds if training else 0.0,
        loss_curve=list(training.loss_curve) if training else [],
        self_retrieval={
            k: ({kk: vv for kk, vv in v.items() if kk != "ranks"} if isinstance(v, dict) else v)
            for k, v in measured.items()
        },
        trained_at=now,
        trained_because=why,
        device=device,
        trained_chunks=hashes,
    )


def adaptation_status(
    store: IndexStore,
    enabled: bool,
    policy: RetrainPolicy,
    current: Sequence[str] | None = None,
    *,
    mode: str = "",
) -> dict[str, Any]:
    """What ``status`` shows: on or off (``mode``: ``auto``, ``on``, ``off``), the policy, the
    last training (no chunk hashes), the share of the published rows changed since it, whether
    the published table is adapted, and which model serves and why (issue 44)."""
    record = read_record(store)
    pub = store.published(strict=False)
    adapted = bool(pub and is_adapted(pub.stamps.model))
    mode = mode or ("on" if enabled else "off")
    out: dict[str, Any] = {
        "enabled": enabled,
        "mode": mode,
        "policy": policy.label,
        "published_model_adapted": adapted,
        "serving": serving(pub is not None, adapted, record, mode),
        "last_training": record.summary() if record else None,
        "changed_since_training": None,
    }
    if record is not None and current is not None:
        out["changed_since_training"] = round(changed_share(current, record.trained_chunks), 4)
    return out


def serving(published: bool, adapted: bool, record: AdaptationRecord | None, mode: str) -> str:
    """Which model answers and why, in one line (issue 44)."""
    if not published:
        return "nothing is published yet"
    if adapted:
        return "the adapted model: it passed its held-out checks and the evaluation gate"
    if mode == "off":
        return "the base model: adaptation is off (RAG_ADAPT=off)"
    if record is None:
        return (
            "the base model: not adapted yet (it is trained after the first publish, by the "
            "same `rag-assets index`, the next scheduled run or `rag-assets adapt`)"
        )
    if record.proposed:
        return (
            "the base model: the adapted model was proposed but its table is not published "
            "(the next `rag-assets index` embeds it; an evaluation gate that failed says why)"
        )
    return f"the base model: the adapted encoder was {record.status} ({record.reason})"


def status_lines(report: dict[str, Any] | None) -> list[str]:
    """The plain-text lines of ``rag-assets status`` for :func:`adaptation_status`."""
    if not report or (not report["enabled"] and report["last_training"] is None):
        return []
    mode = report.get("mode", "on")
    state = {"on": "on", "auto": "auto (RAG_ADAPT)"}.get(mode, "off (RAG_ADAPT)")
    if report.get("why_not"):  # issue 51: an encoder this index's processes cannot train
        return [f"adapted encoder: {state}, {report['why_not']}"]
    lines = [f"adapted encoder: {state}; retrain policy {report['policy']}"]
    if report.get("serving"):
        lines.append(f"  serving: {report['serving']}")
    last = report["last_training"]
    if last is None:
        lines.append("  last training: none yet (`rag-assets adapt` or the next index run)")
        return lines
    sr = last.get("self_retrieval") or {}
    mrr = ""
    if sr.get("base") and sr.get("adapted"):
        mrr = (
            f", held-out self-MRR {sr['base']['mrr']:.3f} → {sr['adapted']['mrr']:.3f} "
            f"({sr['base']['queries']} sentences)"
        )
    lines.append(
        f"  last training: {last['trained_at']} {last['model_id']} rev {last['revision'] or '-'}: "
        f"{last['status']}{mrr}"
    )
    sep = sr.get("separation") or {}
    if sep:  # issue 44
        n = sep["base"]["held_out"]
        lines.append(
            f"  separation from unrelated questions: {round(sep['base']['answered'] * n)} → "
            f"{round(sep['adapted']['answered'] * n)} of {n} held-out sentences answered at "
            "the cut that lets 10 % of them through"
        )
    lines.append(
        f"  {last['counts'].get('pairs', 0)} pairs, {last['steps']} steps, "
        f"{last['train_seconds']:.0f} s on {last['device']}; because {last['trained_because']}"
    )
    changed = report.get("changed_since_training")
    if changed is not None:
        lines.append(f"  changed since: {100 * changed:.1f} % of the published chunks")
    lines.append(
        f"  published table adapted: {'yes' if report['published_model_adapted'] else 'no'}"
    )
    return lines
