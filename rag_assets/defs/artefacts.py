"""The IO manager of the graph's intermediate data (issue 42): ``extracted_documents``,
``chunks`` and ``backfill_plan`` return their values and the assets after them take them as
inputs; this IO manager stores them where :class:`rag_assets.lib.index.artefacts.Artefacts`
says: ``RAG_WORK_DIR`` for a local index, ``<index>/_rag_work/`` in the bucket for an
object-store one. So a run on any worker reads what a run on another wrote, with no volume
shared between them.

Why this and not ``UPathIOManager`` or dagster-aws's ``S3PickleIOManager``: the artefacts stay
the Parquet (and JSON) files they were, readable by any tool, written through pyarrow's file
system for the index URI (pyarrow is already the project's), so no new dependency
(``universal_pathlib`` and ``s3fs``, or ``dagster-aws`` and ``boto3``) and no pickles; and a
local index keeps exactly its old files.
"""

from typing import Any

import dagster as dg

from rag_assets.lib.index.artefacts import Artefacts, plan_file

ARTEFACTS = "rag_artefacts"
"""The IO manager's resource key; the producing assets name it as their ``io_manager_key``."""

DOCUMENTS, CHUNKS, PLAN = "extracted_documents", "chunks", "backfill_plan"


def artefacts_of(documents: Any, lance_index: Any) -> Artefacts:
    """The artefacts the IO manager keeps, for a step that reads them beside its inputs (the
    previous extraction, the check, the question and adaptation steps): the index of
    ``lance_index`` (a ``LanceIndex``), the work dir of ``documents`` (a ``DocumentsFolder``)."""
    return Artefacts(lance_index.uri, documents.work_dir)


def artefact_in(asset: str) -> dg.AssetIn:
    """An input loaded by this IO manager (also when the upstream asset is not in the job or
    in the Definitions at hand, as in a batch run or a test's partial graph)."""
    return dg.AssetIn(key=dg.AssetKey(asset), input_manager_key=ARTEFACTS)


class ArtefactIOManager(dg.ConfigurableIOManager):
    """Extracted documents, chunks and the batch plan, in RAG_WORK_DIR (a local index) or
    under the object-store index's prefix (RAG_INDEX_URI)."""

    index_uri: str = "data/index"  # RAG_INDEX_URI
    work_dir: str = "data/work"  # RAG_WORK_DIR
    pipeline: str = ""  # the chunking strategy's pipeline version (chunks and plan are per one)

    def artefacts(self) -> Artefacts:
        return Artefacts(self.index_uri, self.work_dir)

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        name = _name(context.asset_key)
        store = self.artefacts()
        if name == DOCUMENTS:
            store.save_documents(obj)
        elif name == CHUNKS:
            store.save_chunks(self.pipeline, obj)
        else:
            store.save_plan(self.pipeline, obj)

    def load_input(self, context: dg.InputContext) -> Any:
        name = _name(context.asset_key)
        store = self.artefacts()
        if name == DOCUMENTS:
            return store.documents()
        if name == CHUNKS:
            try:
                return store.chunks(self.pipeline)
            except FileNotFoundError as exc:
                raise dg.Failure(str(exc)) from None
        plan = store.plan(self.pipeline)
        if plan is None:
            raise dg.Failure(
                f"no backfill plan at {store.location(plan_file(self.pipeline))}: materialise "
                "backfill_plan first"
            )
        return plan


def _name(key: dg.AssetKey | None) -> str:
    # the last part: a RagIndex component's keys carry its name in front (issue 51)
    name = key.path[-1] if key is not None else ""
    if name not in (DOCUMENTS, CHUNKS, PLAN):
        raise dg.Failure(f"the artefact IO manager keeps {DOCUMENTS}, {CHUNKS} and {PLAN}: {name}?")
    return name
