"""The evaluation set as an asset: ``eval_questions`` (group evaluation).

It decides which questions evaluate this corpus (hand-written or reviewed at RAG_EVAL_DIR, merged
with reviewed traffic from the query log; else reviewed traffic alone once it has the counts the
calibration needs (issue 33, :mod:`rag_assets.lib.evaluate.traffic`); else written by the model at
RAG_LLM_URL, else the shipped questions about other topics alone (issue 53); see
:mod:`rag_assets.lib.evaluate.question_source`) and records the choice for ``retrieval_eval`` and
``refusal_threshold``. It reads the chunks, not the embeddings: a model upgrade re-evaluates on
the same questions, and an edit re-asks only the needles it changed (every model request is
cached on disk under the served model's name).
"""

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.resources import DocumentsFolder, LanceIndex, QuestionSet
from rag_assets.defs.traffic_set import (
    QUERY_LOG_KEY,
    traffic_choice,
    traffic_metadata,
    traffic_progress,
)
from rag_assets.lib.evaluate import question_source as qs
from rag_assets.lib.evaluate.traffic import progress_line
from rag_assets.lib.index.pipeline import digest
from rag_assets.lib.index.store import IndexStore, is_remote
from rag_assets.lib.ingest.chunk import ChunkStrategy

DECISION_FILE = "questions.json"  # under <index>/evaluation/: what retrieval_eval reads

DECISION = f"evaluation/{DECISION_FILE}"  # a store file (a _rag_files row on object storage)

GENERATED = "evaluation/generated"  # the generated set's folder in the store


class QuestionWriter(dg.ConfigurableResource):
    """The model that writes the generated evaluation set (RAG_LLM_URL; empty: none) and the
    seconds one run may spend on it (RAG_EVAL_BUDGET_S)."""

    llm_url: str = ""
    llm_model: str = ""
    llm_api_key: str = ""
    work_dir: str = "data/work"  # RAG_WORK_DIR: replies cached under llm-cache/
    budget_s: float = qs.DEFAULT_BUDGET_S
    seed: int = 0

    def client(self) -> Any:
        from rag_assets.lib.query.judge import llm_cache_dir, make_client

        return make_client(
            self.llm_url,
            self.llm_model or None,
            self.llm_api_key or None,
            llm_cache_dir(self.work_dir),
        )


def generated_dir(index_uri: str) -> Path:
    """The generated set's folder of a local index."""
    return Path(index_uri) / GENERATED


def decision_path(index_uri: str) -> Path:
    """The decision file of a local index."""
    return Path(index_uri) / DECISION


def read_decision(store: IndexStore | str) -> qs.Decision | None:
    """What ``eval_questions`` last chose for this index; a local directory that does not
    exist is not created."""
    if isinstance(store, str):
        if not is_remote(store):
            f = decision_path(store)
            return qs.Decision.from_dict(json.loads(f.read_text("utf-8"))) if f.is_file() else None
        store = IndexStore(store)
    text = store.read_text(DECISION)
    return None if text is None else qs.Decision.from_dict(json.loads(text))


def generated_folder(store: IndexStore, work_dir: str) -> Path:
    """The folder of the generated set as files: a local index's own folder; for an object-store
    index a working copy under RAG_WORK_DIR, refreshed from the store's rows (another worker may
    have written them), which :func:`save_generated` sends back."""
    if not store.remote:
        return store.file_path(GENERATED)
    name = hashlib.sha256(store.uri.encode()).hexdigest()[:16]
    local = Path(work_dir) / "object-store" / name / GENERATED
    if not store.read_tree(GENERATED, local):
        shutil.rmtree(local, ignore_errors=True)
    return local


def save_generated(store: IndexStore, folder: Path) -> None:
    """The generated set into the store (object storage: one commit); a local index wrote it
    in place."""
    if store.remote and folder.is_dir():
        store.write_tree(GENERATED, folder)


def decide(
    documents: DocumentsFolder,
    questions: QuestionSet,
    writer: QuestionWriter,
    store: IndexStore,
    work_dir: str,
    strategy: ChunkStrategy,
    log: Any,
) -> qs.Decision:
    """The question source for the current documents (see the module docstring)."""
    from rag_assets.lib.index.artefacts import Artefacts

    artefacts = Artefacts(store.uri, documents.work_dir)  # issue 42: the bucket's, if remote
    docs = [d for d in artefacts.documents() if d.ok]
    texts = {d.document_id: d.text for d in docs}
    configured = qs.configured_set(questions.path, texts)
    notes: list[str] = []
    # issue 33: reviewed traffic from the query log, merged with a hand-written set, or alone
    # once it has the counts calibration needs
    usable = configured if configured is not None and configured.source != "unevaluated" else None
    chosen, progress = traffic_choice(store, texts, usable, log)
    if chosen is not None:
        return chosen
    if progress.get("reviewed"):
        notes.append(progress_line(progress))
    if configured is not None and configured.source != "unevaluated":
        return configured
    if configured is not None:
        notes += configured.notes
    out_dir = generated_folder(store, work_dir)
    if writer.llm_url.strip() and docs:
        from rag_assets.lib.models.llm import LLMError

        corpus = {
            d.document_id: {"text": d.text, "title": d.title, "headings": d.headings} for d in docs
        }
        n_chunks = len(artefacts.chunks(strategy.pipeline_version))
        try:
            decision = qs.generate_set(
                corpus,
                n_chunks,
                writer.client(),
                out_dir,
                budget_s=writer.budget_s,
                seed=writer.seed,
                progress=log.debug,
            )
        except (LLMError, OSError, ValueError) as exc:
            last = qs.last_generated(out_dir)
            why = f"the model at RAG_LLM_URL failed ({str(exc).splitlines()[0][:200]})"
            if last is not None:
                last.notes = [*notes, f"{why}: kept the last generated set"]
                log.warning(last.notes[-1])
                return last
            notes.append(
                f"{why}: no generated set yet, calibrating on the questions about other topics"
            )
            log.warning(notes[-1])
        else:
            save_generated(store, out_dir)
            decision.notes = notes + decision.notes
            if decision.complete:
                return decision
            log.warning(decision.notes[-1])
            return decision
    elif not docs:
        notes.append("no documents: nothing to write questions about")
    else:
        notes.append(
            "no question set for this corpus and no model to write one (set RAG_EVAL_DIR to a "
            "set, or RAG_LLM_URL to have one written): the cut comes from the shipped questions "
            "about other topics"
        )
    return qs.Decision("unrelated-only", None, notes=notes)


def build_eval_questions_asset(chunks: Any, strategy: ChunkStrategy, automation: Any) -> Any:
    @dg.asset(
        deps=[chunks, QUERY_LOG_KEY],  # issue 33: reviewed traffic (data version: the reviews)
        group_name="evaluation",
        code_version="eval-questions-1",
        automation_condition=automation,
        kinds={"python"},
    )
    def eval_questions(
        context: dg.AssetExecutionContext,
        documents: DocumentsFolder,
        questions: QuestionSet,
        question_writer: QuestionWriter,
        lance_index: LanceIndex,
    ) -> dg.MaterializeResult:
        """The questions that evaluate this corpus and calibrate its refusal cut.

        In order: a set at RAG_EVAL_DIR that belongs to these documents (*hand-written*, or
        *reviewed* when it is an edited export of a generated set), merged with reviewed
        queries from the query log (*+traffic*); else the reviewed queries alone (*traffic*,
        once there are 20 answerable and 20 out-of-domain ones); else a set written by the
        model at RAG_LLM_URL (*generated*, at most RAG_EVAL_BUDGET_S seconds a run, resumed from
        the cache by later runs); else the shipped unrelated questions alone (*unrelated-only*:
        a cut with no recall figure). Rows and provenance are in the set's folder (`path`)."""
        store = lance_index.store()
        decision = decide(
            documents,
            questions,
            question_writer,
            store,
            lance_index.work_dir,
            strategy,
            context.log,
        )
        if not decision.traffic:  # issue 33: how far reviewed traffic is, whatever was chosen
            decision.traffic = traffic_progress(store)
        store.write_file(DECISION, json.dumps(decision.to_dict(), indent=2) + "\n")
        for note in decision.notes:
            context.log.info(note)
        meta: dict[str, Any] = {
            "source": decision.label,
            "complete": decision.complete,
            "notes": "; ".join(decision.notes) or "none",
            **{k: dg.MetadataValue.int(int(v)) for k, v in decision.counts.items()},
        }
        if decision.path:
            meta["path"] = dg.MetadataValue.path(decision.path)
            meta["preview"] = dg.MetadataValue.md(_preview(Path(decision.path)))
        for k, v in decision.cost.items():
            meta[f"cost/{k}"] = dg.MetadataValue.float(float(v))
        meta |= traffic_metadata(decision.traffic)  # counts only: questions stay in the store
        stable = {
            k: v for k, v in decision.to_dict().items() if k not in ("cost", "notes", "traffic")
        }
        if decision.path:
            stable["files"] = qs.files_digest(Path(decision.path))
        return dg.MaterializeResult(data_version=dg.DataVersion(digest(stable)), metadata=meta)

    return eval_questions


def _preview(folder: Path, n: int = 8) -> str:
    """The first rows as a Markdown table (UI)."""
    rows = ["| id | needle | course | ticket |", "|---|---|---|---|"]
    f = folder / "questions.jsonl"
    if f.is_file():
        lines = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
        for q in [q for q in lines if "traffic" not in q][:n]:  # users' questions stay out
            cells = [q["id"], q["needle"], q["queries"]["course"], q["queries"]["ticket"]]
            rows.append("| " + " | ".join(c.replace("|", "\\|")[:120] for c in cells) + " |")
    return "\n".join(rows)


def build_continuation_sensor(index_uri: str, name: str = "") -> dg.SensorDefinition:
    """Finishes an unfinished generated set: while ``eval_questions`` left one (its budget ran
    out on a slow endpoint), request the evaluated tail again. The run key is the set's progress,
    so a run that made none (the endpoint is down) is not requested twice. ``name``: the
    ``RagIndex`` component's (issue 51; its keys are prefixed with it)."""
    from rag_assets.defs.namespace import key, qualified

    tail = ("retrieval_eval", "refusal_threshold", "published_index")  # evaluation.EVALUATED_TAIL

    @dg.sensor(
        name=qualified(name, "eval_questions_sensor"),
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING,
        asset_selection=dg.AssetSelection.assets(
            *(key(name, a) for a in ("eval_questions", *tail))
        ),
        description="Requests eval_questions and the evaluation after it while the generated "
        "question set is unfinished (RAG_EVAL_BUDGET_S ran out in the last run).",
    )
    def eval_questions_sensor(context: dg.SensorEvaluationContext) -> Any:
        decision = read_decision(index_uri)
        if decision is None or decision.source != "generated" or decision.complete:
            return dg.SkipReason("no unfinished generated question set")
        c = decision.counts
        key = f"questions-{c.get('questions', 0)}-near-{c.get('near', 0)}"
        return dg.RunRequest(run_key=key, tags={"rag/reason": "finish the generated questions"})

    return eval_questions_sensor
