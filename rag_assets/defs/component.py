"""``rag_assets.RagIndex``: one index as a Dagster component (issue 51).

A Dagster project holds as many indexes as it has ``RagIndex`` folders in its ``defs``:
``dg scaffold defs rag_assets.RagIndex handbook`` writes ``defs/handbook/defs.yaml``, every
attribute commented with its default. Each index's assets are under the key prefix of its
folder's name (``handbook/chunks``), in the group of that name, with its own jobs
(``handbook__index_job``), sensors, checks and backfill partitions
(:mod:`rag_assets.defs.namespace`): materialising one never touches another.

The attributes are the settings that shape an index (:data:`rag_assets.lib.index.declaration.
DECLARED_FIELDS`), named as their ``RAG_*`` variables are, lower-case, with the same defaults and
rules (a bad value is refused by ``dg check defs`` in one line naming the attribute), plus
``index_uri``, whose default is ``data/<name>/index`` (two indexes never share one). Relative
paths are from the project root. What the YAML sets is given to every build of the index and kept
in its declaration; what it leaves out comes from the index's declaration, then the code
location's environment (where machine settings and secrets such as ``RAG_EMBED_API_KEY`` stay),
then the default. ``rag-assets status/ask/serve/ui/index --index data/handbook/index`` work on
the index as on one the CLI built, and a component may name an index the CLI built.
(No ``from __future__ import annotations`` here: pydantic and Dagster read the annotations.)
"""

import os
import textwrap
from dataclasses import fields as dataclass_fields
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg
import pydantic

from rag_assets.lib.index.declaration import DECLARED_FIELDS, declared_settings
from rag_assets.settings import ENV, Settings, check_value

#: the attributes that are paths: a relative one is taken from the project root
PATH_ATTRIBUTES = ("index_uri", "documents_dir", "sources", "eval_dir", "embedding_model")

ATTRIBUTE_HELP = {
    "index_uri": "where the index lives: a folder, or s3://, gs://, az:// (default "
    "data/<name>/index)",
    "documents_dir": "the documents: a folder, or one s3://, gs://, az://, git+https:// or "
    "https:// location",
    "sources": "a sources file (TOML) indexing several locations into this index (docs/sources.md)",
    "include": "comma-separated gitignore-style globs: only matching files are indexed",
    "exclude": "comma-separated gitignore-style globs: matching files are not indexed",
    "chunk_strategy": "A-F: E = boundaries + [Title > Section] header",
    "chunk_target": "characters of content per chunk",
    "embedding_model": "a local sentence-transformers folder (empty: the packaged "
    "all-MiniLM-L6-v2)",
    "embed_url": "a model server's OpenAI-compatible base URL (embeds instead of a local model)",
    "embed_model": "the model the server lists (empty: its only one)",
    "embed_dims": "Matryoshka truncation (0: the model's own size)",
    "query_prompt": "the query prompt (empty: the model's own)",
    "document_prompt": "the document prompt (empty: the model's own)",
    "embed_precision": "fp32, fp16 or bf16",
    "ocr_min_confidence": "OCR'd PDF pages below this confidence are not indexed",
    "failed_policy": "rows of a document whose extraction now fails: keep or drop",
    "expand": "llm: doc2query views written by a model",
    "expand_n": "questions written per chunk",
    "adapt": "auto (adapts a local encoder where it pays), on or off",
    "adapt_budget_s": "auto on a CPU: the longest training it starts, in seconds",
    "adapt_steps": "training steps (0: one epoch, at least 100)",
    "adapt_max_steps": "the cap on training steps",
    "adapt_retrain": "when to train again: changed:F, cron:EXPR or never",
    "eval_dir": "the question set (needle format) the index is evaluated on",
    "eval_budget_s": "seconds of model time a run may spend writing questions",
    "recall_floor": "blocking floor for recall@20",
    "max_bluff_rate": "calibration: the largest cut with at most this bluff rate",
    "reindex_cron": "when the documents are observed",
    "source_max_delete_share": "share of a source's documents one listing may delete",
    "fusion": "rrf, rrf:dense=2, dense or bm25",
    "rerank_model": "a local CrossEncoder folder, or llm",
    "rerank_url": "a /rerank server",
    "rerank_depth": "hybrid top-k the reranker scores",
    "answer_check": "llm: the judge after the distance gate",
    "answer_verify": "flag, drop or refuse a written answer's unsupported sentences",
    "query_rewrite": "llm: the model rewrites the question",
    "distance_cut": "override the calibrated refusal cut",
    "base_url": "the link template documents are cited with (empty: file paths)",
    "query_log": "on or off: questions and their reviews kept with the index",
    "query_log_days": "unreviewed log entries older than this are removed (0: kept)",
    "query_log_redact": "on: e-mail addresses and long digit runs masked in the log",
    "backfill_batch_rows": "set it to add the fan-out backfill: NAME__embedding_backfill, one "
    "run per batch of about this many chunks (partitions NAME__embedding_batches)",
}

#: attributes besides the declared settings: where the index lives, and the fan-out's batches
EXTRA_ATTRIBUTES = ("index_uri", "backfill_batch_rows")


class RagIndexScaffolder(dg.Scaffolder):
    """``dg scaffold defs rag_assets.RagIndex NAME``: a ``defs.yaml`` with the index's folders
    under ``data/NAME`` and every other attribute commented out, with its default and meaning."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = request.target_path.name
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(
            scaffolded_yaml(request.type_name, name), encoding="utf-8"
        )


def scaffolded_yaml(type_name: str, name: str) -> str:
    """The commented ``defs.yaml`` of an index called ``name``."""
    head = textwrap.dedent(f"""\
        # A RAG index (rag_assets.RagIndex, issue 51): its assets are under the key prefix
        # "{name}/" in the group "{name}", its jobs {name}__index_job and {name}__adapt_job.
        # Every attribute is a RAG_* setting (docs/settings.md) with the same default; relative
        # paths are from the project root. What is set here is given to every build and kept in
        # the index's declaration; what is left out comes from the declaration, then the code
        # location's environment (machine settings and secrets stay there), then the default.
        type: {type_name}

        attributes:
        """)
    lines = []
    for field in ("index_uri", *DECLARED_FIELDS, "backfill_batch_rows"):
        default = _default(field)
        shown = f"data/{name}/index" if field == "index_uri" else default
        if field == "documents_dir":
            shown = f"data/{name}/documents"
        value = _yaml_scalar(shown)
        lines.append(f"  # {ATTRIBUTE_HELP[field]} ({_var(field)})")
        if field in ("index_uri", "documents_dir"):
            lines.append(f"  {field}: {value}")
        else:
            lines.append(f"  # {field}: {value}")
    return head + "\n".join(lines) + "\n"


def _var(field: str) -> str:
    return ENV[field][0] if field in ENV else ""


def _default(field: str) -> Any:
    return RagIndex.model_fields[field].default


YAML_WORDS = {"on", "off", "yes", "no", "true", "false", "y", "n", "null", "~"}


def _yaml_scalar(value: Any) -> str:
    text = str(value)
    if isinstance(value, str) and text.lower() in YAML_WORDS:  # YAML would read a boolean
        return f'"{text}"'
    if isinstance(value, str) and (
        text == "" or text.strip() != text or any(c in text for c in ":#*{}[],&!|>'\"%@`")
    ):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _attribute_fields() -> Any:
    """The attributes as a pydantic model: each declared setting (and ``backfill_batch_rows``)
    with its ``Settings`` type and its ``ENV`` default, so they cannot drift apart, described
    by its variable and :data:`ATTRIBUTE_HELP`; ``index_uri`` defaults to ``""`` =
    ``data/<name>/index``."""
    types = {f.name: f.type for f in dataclass_fields(Settings)}
    spec: dict[str, Any] = {}
    for name in (*EXTRA_ATTRIBUTES, *DECLARED_FIELDS):
        kind = {"int": int, "float": float}.get(str(types[name]), str)
        default = "" if name == "index_uri" else kind(ENV[name][1])
        described = f"{ENV[name][0]}: {ATTRIBUTE_HELP[name]}"
        spec[name] = (kind, pydantic.Field(default, description=described))
    return pydantic.create_model("RagIndexAttributes", __base__=dg.Model, **spec)


@dg.scaffold_with(RagIndexScaffolder)
class RagIndex(dg.Component, dg.Resolvable, _attribute_fields()):  # type: ignore[misc]
    """A RAG index built into LanceDB: extract, chunk, embed, evaluate, calibrate and publish,
    with its checks, sensors and backfill partitions under the name of its defs folder."""

    @pydantic.field_validator(*DECLARED_FIELDS, "backfill_batch_rows", mode="after")
    @classmethod
    def _checked(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        """The setting's own rule (settings.py RULES), named by the attribute (a value a
        template gave, checked once it is resolved)."""
        refuse_value(str(info.field_name), value)
        return value

    @classmethod
    def get_model_cls(cls) -> Any:
        """The attributes' model (Dagster's, from the fields above) with a first check that
        refuses an unknown attribute or a bad value in one line naming it (pydantic's own error
        spans several)."""
        generated = super().get_model_cls()

        class RagIndexAttributes(generated):  # type: ignore[misc, valid-type]
            @pydantic.model_validator(mode="before")
            @classmethod
            def _one_line(cls, data: Any) -> Any:
                refuse_attributes(data)
                return data

        return RagIndexAttributes

    @classmethod
    def get_spec(cls) -> dg.ComponentTypeSpec:
        return dg.ComponentTypeSpec(
            description="A RAG index in LanceDB: documents to a cited, calibrated, evaluated "
            "retrieval index, one per defs folder",
            tags=["rag", "lancedb", "embeddings"],
            produces=["asset", "asset_check", "job", "sensor", "resource"],
        )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from rag_assets.defs.backfill import default_backfill_definitions
        from rag_assets.defs.build import build_definitions
        from rag_assets.defs.namespace import check_name, namespaced

        name = check_name(context.path.name)
        settings, given = self.settings(name, Path(context.project_root), os.environ)
        defs = build_definitions(settings, name, given, by=f"component {name}")
        if "backfill_batch_rows" in self.model_fields_set:  # the fan-out, when asked for: its
            # partitioned asset would keep `dagster asset materialize --select '*'` from running
            defs = dg.Definitions.merge(defs, default_backfill_definitions(settings, name))
        return namespaced(defs, name)

    def settings(self, name: str, root: Path, env: Any) -> tuple[Settings, set[str]]:
        """The settings of this index (see the module docstring) and the fields the YAML gives."""
        given = set(self.model_fields_set) & set(DECLARED_FIELDS)
        base = Settings.from_env(env)  # machine settings and secrets: the environment's
        uri = self.index_uri or f"data/{name}/index"
        uri = _from_root(uri, root)
        work = str(Path(base.work_dir) / name) if base.work_dir_given else ""  # one per index
        values: dict[str, Any] = {
            f: _from_root(getattr(self, f), root) if f in PATH_ATTRIBUTES else getattr(self, f)
            for f in given
        }
        settings = replace(
            base.with_index(uri),
            work_dir=work,
            backfill_batch_rows=self.backfill_batch_rows,
            **values,
        )
        settings = replace(settings, chunk_strategy=settings.chunk_strategy.strip().upper())
        return declared_settings(settings, given, legacy=True), given


class AttributeRefused(Exception):  # noqa: N818 - not a ValueError: pydantic passes it through
    """A ``RagIndex`` attribute refused, in one line naming it (pydantic wraps a ValueError
    into a multi-line report; any other exception it lets through as it is)."""


def refuse_attributes(data: Any) -> None:
    """Refuse (:class:`AttributeRefused`) an attribute ``RagIndex`` does not have, or a value
    its setting's rule refuses; a value a template gives (``{{ env.X }}``) is checked once
    resolved (:meth:`RagIndex._checked`). YAML reads ``query_log: off`` as a boolean: a text
    attribute takes it as ``on`` / ``off``."""
    if not isinstance(data, dict):
        return
    known = [*EXTRA_ATTRIBUTES, *DECLARED_FIELDS]
    for name, value in list(data.items()):
        text_field = name in known and RagIndex.model_fields[name].annotation is str
        if isinstance(value, bool) and text_field:
            data[name] = value = "on" if value else "off"
        if name not in known:
            import difflib

            near = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise AttributeRefused(
                f"RagIndex attribute {name!r}: no such attribute{hint}; the attributes are the "
                "settings of docs/settings.md, lower-case (RAG_CHUNK_TARGET: chunk_target)"
            )
        if isinstance(value, str) and "{{" in value:
            continue
        if name != "index_uri":
            refuse_value(name, value)


def refuse_value(name: str, value: Any) -> None:
    """Refuse (:class:`AttributeRefused`) ``value`` for the attribute ``name`` when its
    setting's type or rule does not take it."""
    annotation = RagIndex.model_fields[name].annotation
    kind = annotation if annotation in (int, float) else None
    if isinstance(value, bool) or (isinstance(kind, type) and not _is_number(value, kind)):
        what = "a whole number" if kind is int else "a number"
        raise AttributeRefused(f"RagIndex attribute {name}={value!r}: give {what} ({_var(name)})")
    why = check_value(name, _text(value))
    if why:
        raise AttributeRefused(f"RagIndex attribute {name}={value!r}: {why} ({_var(name)})")


def _is_number(value: Any, kind: type) -> bool:
    try:
        kind(value)
    except (TypeError, ValueError):
        return False
    return not (kind is int and isinstance(value, float) and not value.is_integer())


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _from_root(value: str, root: Path) -> str:
    """A relative path taken from the project root; a URI or an empty value unchanged."""
    if not value or "://" in value or value.startswith("git+"):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (root / path))
