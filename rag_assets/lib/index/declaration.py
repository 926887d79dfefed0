"""An index's declaration (issue 51): the settings that shaped it, kept with it.

At its first build an index records the settings that shape it in ``declaration.json`` beside its
pointer (a row of ``_rag_files`` in the bucket for an object-store index, like every file the
graph keeps there). Every process that opens the index reads it (the CLI, the code location and
its sensors, the service, a ``RagIndex`` component, another machine): a declared setting wins
over the process's environment, which fills only what the declaration leaves unset. A setting is
changed only by giving it to a run that builds the index (``rag-assets index`` or ``backfill``:
a flag or that command's environment; a component: its YAML); the run records the new value,
when and by what, and the value it replaced.

Two kinds of setting are declared (:data:`BUILD_FIELDS`, :data:`ANSWER_FIELDS`):

- what the index is built from and how (documents or sources, chunking, model or model server,
  adaptation, question set and gates, schedule): recorded at the first build with the value in
  effect, given or default, so that no later environment can silently change what was built;
- how it answers (fusion, reranking, the answer check, link templates, the query log): recorded
  when given to a build; until then each process's environment decides, as before.

Secrets (API keys, tokens) and what belongs to a machine (its device, threads, timeouts, working
folder, the hosts a service answers) are never declared. The format: ``{"first_build": ISO,
"settings": {field: {"value": text, "at": ISO, "by": text, "was": text?}}, "notes": {field:
why}}``: values as their ``RAG_*`` variables take them, so a declaration is also a list of
variables a person can read.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rag_assets.settings import ENV, Settings, check_value, setting_error

DECLARATION_FILE = "declaration.json"

BUILD_FIELDS = (
    "documents_dir",
    "sources",
    "include",
    "exclude",
    "chunk_strategy",
    "chunk_target",
    "embedding_model",
    "embed_url",
    "embed_model",
    "embed_dims",
    "query_prompt",
    "document_prompt",
    "embed_precision",
    "ocr_min_confidence",
    "failed_policy",
    "expand",
    "expand_n",
    "adapt",
    "adapt_budget_s",
    "adapt_steps",
    "adapt_max_steps",
    "adapt_retrain",
    "eval_dir",
    "eval_budget_s",
    "recall_floor",
    "max_bluff_rate",
    "reindex_cron",
    "source_max_delete_share",
)
"""What the index is built from and how: declared at the first build, given or not."""

ANSWER_FIELDS = (
    "fusion",
    "rerank_model",
    "rerank_url",
    "rerank_depth",
    "answer_check",
    "answer_verify",  # issue 50: what ask does with a written answer's unsupported sentences
    "query_rewrite",
    "distance_cut",
    "base_url",
    "query_log",
    "query_log_days",
    "query_log_redact",
)
"""How the index answers: declared once given to a build (a flag, the environment of that
``rag-assets index``, a component's YAML); until then each process's environment decides."""

DECLARED_FIELDS = BUILD_FIELDS + ANSWER_FIELDS

FIRST_BUILD = "the first build"
INDEX_RUN = "the index run"


@dataclass(frozen=True)
class Entry:
    """One declared setting: its value (as its ``RAG_*`` variable takes it), when and by what it
    was set, and the value it replaced (None at the first build)."""

    value: str
    at: str
    by: str
    was: str | None = None

    def said(self) -> str:
        """``set at the first build on 2026-12-05`` / ``set by the index run on 2026-12-06,
        was auto``."""
        verb = "at" if self.by == FIRST_BUILD else "by"
        was = f", was {self.was or '(empty)'}" if self.was is not None else ""
        return f"set {verb} {self.by} on {self.at[:10]}{was}"


@dataclass(frozen=True)
class Declaration:
    first_build: str
    entries: dict[str, Entry] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # why a declared value does not apply

    def value(self, name: str) -> str | None:
        entry = self.entries.get(name)
        return entry.value if entry is not None else None

    def to_json(self) -> str:
        return json.dumps(
            {
                "first_build": self.first_build,
                "settings": {
                    k: {
                        "value": e.value,
                        "at": e.at,
                        "by": e.by,
                        **({"was": e.was} if e.was is not None else {}),
                    }
                    for k, e in sorted(self.entries.items())
                },
                "notes": dict(sorted(self.notes.items())),
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, where: str = DECLARATION_FILE) -> Declaration:
        """Parsed and checked: an unknown setting is ignored (a newer version's), a value its
        rule refuses is a ValueError naming the file and the variable."""
        try:
            raw = json.loads(text)
            entries = {}
            for name, e in dict(raw.get("settings") or {}).items():
                if name not in DECLARED_FIELDS:
                    continue
                value = str(e["value"])
                why = check_value(name, value)
                if why:
                    raise ValueError(f"{where}: {setting_error(name, value, why)}")
                was = e.get("was")
                entries[name] = Entry(
                    value, str(e["at"]), str(e["by"]), None if was is None else str(was)
                )
            notes = {str(k): str(v) for k, v in dict(raw.get("notes") or {}).items()}
            return cls(str(raw["first_build"]), entries, notes)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(
                f"{where}: the index's declaration cannot be read ({type(exc).__name__}: {exc}); "
                "`rag-assets index` with the settings it is built from writes it again"
            ) from None

    def as_report(self) -> dict[str, Any]:
        """What ``status --json`` shows: each declared setting by its variable."""
        return {
            "first_build": self.first_build,
            "settings": {
                ENV[k][0]: {"value": e.value, "set": e.said(), "at": e.at, "by": e.by}
                | ({"was": e.was} if e.was is not None else {})
                for k, e in sorted(self.entries.items())
            },
            "notes": {ENV[k][0] if k in ENV else k: v for k, v in sorted(self.notes.items())},
        }


def setting_text(settings: Settings, name: str) -> str:
    """The value of ``name`` in ``settings`` as its ``RAG_*`` variable would give it."""
    value = getattr(settings, name)
    if isinstance(value, float):  # 1800.0 reads as RAG_ADAPT_BUDGET_S=1800 does
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


def typed(name: str, text: str) -> Any:
    """``text`` as the type of the Settings field ``name``."""
    kind = {f.name: f.type for f in fields(Settings)}[name]
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    value = text
    if name == "chunk_strategy":
        return value.strip().upper()
    return value


def read_declaration(uri: str | Path) -> Declaration | None:
    """The declaration of the index at ``uri`` (None: none recorded, or no index there). A local
    index is read as one file, without opening LanceDB; an object-store one from its bucket."""
    text = _read(str(uri))
    if text is None:
        return None
    return Declaration.from_json(text, f"{uri}/{DECLARATION_FILE}")


def _read(uri: str) -> str | None:
    if "://" not in uri:
        path = Path(uri).expanduser() / DECLARATION_FILE
        try:
            return path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
    from rag_assets.lib.index.store import IndexStore

    return IndexStore(uri).read_text(DECLARATION_FILE)


def write_declaration(store: Any, declaration: Declaration) -> None:
    """Beside the pointer (:meth:`IndexStore.write_file`: atomic, or one ``_rag_files`` row)."""
    store.write_file(DECLARATION_FILE, declaration.to_json())


def apply_declaration(
    settings: Settings, declaration: Declaration | None, given: Collection[str] = ()
) -> Settings:
    """``settings`` with every declared value that ``given`` (the fields given to this run)
    does not name. The environment's value of a declared setting is ignored otherwise."""
    if declaration is None:
        return settings
    values = {
        name: typed(name, e.value)
        for name, e in declaration.entries.items()
        if name not in given and name in DECLARED_FIELDS
    }
    if not values:
        return settings
    work = settings.work_dir if settings.work_dir_given else ""
    return replace(settings, **values, work_dir=work)


def record(
    previous: Declaration | None,
    settings: Settings,
    given: Collection[str],
    by: str,
    now: str,
    notes: Mapping[str, str] | None = None,
) -> tuple[Declaration, list[tuple[str, str | None, str]]]:
    """The declaration after a build with ``settings`` (``given``: the fields given to it;
    ``by``: what gave them, e.g. ``the index run``, ``component handbook``), and the changes it
    makes: (field, old value or None, new value). The first build records every build setting
    and the answer settings given; a later one changes only what was given, and adds a build
    setting the declaration lacks (one declared by an older version)."""
    notes = dict(notes or {})
    if previous is None:
        entries = {
            name: Entry(setting_text(settings, name), now, FIRST_BUILD)
            for name in DECLARED_FIELDS
            if name in BUILD_FIELDS or name in given
        }
        return Declaration(now, entries, notes), [(n, None, e.value) for n, e in entries.items()]
    entries = dict(previous.entries)
    changes: list[tuple[str, str | None, str]] = []
    for name in DECLARED_FIELDS:
        text = setting_text(settings, name)
        old = entries.get(name)
        if old is None and (name in BUILD_FIELDS or name in given):
            entries[name] = Entry(text, now, by if name in given else FIRST_BUILD)
            changes.append((name, None, text))
        elif old is not None and name in given and old.value != text:
            entries[name] = Entry(text, now, by, was=old.value)
            changes.append((name, old.value, text))
    if not changes and notes == previous.notes:
        return previous, []
    return Declaration(previous.first_build, entries, notes), changes


def given_in_env(env: Mapping[str, str]) -> set[str]:
    """The declared fields whose ``RAG_*`` variable is in ``env`` (set, even to ""): what the
    environment of a build gives it."""
    return {name for name in DECLARED_FIELDS if ENV[name][0] in env}


def declared_settings(
    settings: Settings, given: Collection[str] = (), *, legacy: bool = False
) -> Settings:
    """The settings a process runs ``settings.index_uri`` with: its declaration's values where
    ``given`` (the fields given to this run: a build's flags and environment, a component's
    YAML) does not name them, the rest from ``settings`` (the environment, the defaults).

    ``legacy``: an index built before declarations (issue 22) records only its folder and
    chunking; those fill in what ``given`` lacks (for the runs that build it, which need them).
    Nothing is created: a missing index or one without a declaration leaves ``settings`` as is."""
    declaration = read_declaration(settings.index_uri)
    if declaration is not None:
        return apply_declaration(settings, declaration, given)
    return source_recorded(settings, given) if legacy else settings


def source_recorded(settings: Settings, given: Collection[str]) -> Settings:
    """Issue 22's rule for an index without a declaration: the folder (or sources file) and the
    chunking recorded with its published (else staged) version fill in what is not given."""
    from rag_assets.lib.index.pipeline import recorded_source
    from rag_assets.lib.index.store import IndexStore, is_remote

    uri = settings.index_uri
    if not is_remote(uri) and not Path(uri).expanduser().is_dir():
        return settings
    source = recorded_source(IndexStore(uri))
    if source is None:
        return settings
    values: dict[str, Any] = {}
    if source.documents.startswith("sources:"):  # issue 41: built from a sources file
        if "sources" not in given and "documents_dir" not in given:
            values["sources"] = source.documents.removeprefix("sources:")
    elif "documents_dir" not in given and "sources" not in given:
        values["documents_dir"] = source.documents
    if "chunk_strategy" not in given and source.strategy:
        values["chunk_strategy"] = source.strategy
        if "chunk_target" not in given and source.target > 0:
            values["chunk_target"] = source.target
    return replace(settings, **values) if values else settings


# -- what a build records ------------------------------------------------------------------------
def intent(
    settings: Settings,
    given: Collection[str] = (),
    by: str = INDEX_RUN,
    notes: Mapping[str, str] | None = None,
) -> str:
    """What a build records, as the text a Dagster resource carries (``LanceIndex.declare``):
    the declared settings' values, which of them were given, by what, and the notes."""
    return json.dumps(
        {
            "values": {n: setting_text(settings, n) for n in DECLARED_FIELDS},
            "given": sorted(set(given) & set(DECLARED_FIELDS)),
            "by": by,
            "notes": dict(notes or {}),
        },
        sort_keys=True,
    )


def record_intent(store: Any, text: str, now: str) -> list[tuple[str, str | None, str]]:
    """Record the build ``text`` (:func:`intent`) describes in ``store``'s declaration (the
    first one, or the changes it gives); the changes made. Called under the writer lease."""
    if not text:
        return []
    raw = json.loads(text)
    values = {n: typed(n, v) for n, v in raw["values"].items() if n in DECLARED_FIELDS}
    settings = replace(Settings(), **values)
    text_prev = store.read_text(DECLARATION_FILE)
    previous = Declaration.from_json(text_prev) if text_prev else None
    new, changes = record(previous, settings, raw["given"], raw["by"], now, raw.get("notes"))
    if new is not previous:
        write_declaration(store, new)
    return changes


# -- what the summary and `status` say -------------------------------------------------------------
def adaptation_line(declaration: Declaration | None) -> str:
    """``adaptation: off, set at the first build on 2026-12-05`` (and why it does not apply,
    when it does not); "" without a declaration."""
    if declaration is None or "adapt" not in declaration.entries:
        return ""
    from rag_assets.settings import adapt_mode

    entry = declaration.entries["adapt"]
    try:
        mode = adapt_mode(entry.value)
    except ValueError:
        mode = entry.value
    line = f"adaptation: {mode}, {entry.said()}"
    note = declaration.notes.get("adapt")
    return f"{line}; {note}" if note else line


def change_lines(
    declaration: Declaration | None, changes: list[tuple[str, str | None, str]]
) -> list[str]:
    """What a build recorded: at the first build one line (how many settings, where to see
    them); later one line per setting it changed or added."""
    if declaration is None or not changes:
        return []
    if all(old is None for _, old, _ in changes) and len(changes) == len(declaration.entries):
        return [
            f"declared: {len(changes)} settings that shape this index, kept with it at its first "
            "build (every process reads them; `rag-assets status --json` lists them)"
        ]
    out = []
    for name, old, new in changes:
        was = "unset" if old is None else repr(old)
        out.append(
            f"declared: {ENV[name][0]}={new!r}, given to this run (was {was}); the index keeps it"
        )
    return out


def ignored_lines(declaration: Declaration | None, env: Mapping[str, str]) -> list[str]:
    """The environment's values this process did not take because the index declares another
    (say so, and how to change it: give it to ``rag-assets index``)."""
    if declaration is None:
        return []
    out = []
    for name, entry in sorted(declaration.entries.items()):
        var = ENV[name][0]
        if var in env and env[var] != entry.value and not _same(name, env[var], entry.value):
            out.append(
                f"not taken: {var}={env[var]!r} from this environment: the index declares "
                f"{entry.value!r} ({entry.said()}); give it to `rag-assets index` to change it"
            )
    return out


def changes_between(
    before: Declaration | None, after: Declaration | None
) -> list[tuple[str, str | None, str]]:
    """What a run recorded: (field, old value or None, new value) for each entry ``after`` holds
    that ``before`` did not hold as it is."""
    if after is None:
        return []
    old = before.entries if before is not None else {}
    return [
        (name, old[name].value if name in old else None, e.value)
        for name, e in sorted(after.entries.items())
        if old.get(name) != e
    ]


def read_store_declaration(store: Any) -> Declaration | None:
    """The declaration kept in an open ``store`` (None: none, or one that cannot be read)."""
    try:
        text = store.read_text(DECLARATION_FILE)
        return Declaration.from_json(text) if text else None
    except ValueError:
        return None


def _same(name: str, a: str, b: str) -> bool:
    """Whether two texts are the same value of the setting ``name`` (``c`` is strategy ``C``,
    ``0.50`` is ``0.5``, ``OFF`` is ``off``)."""
    try:
        x, y = typed(name, a), typed(name, b)
    except ValueError:
        return False
    return x.strip().lower() == y.strip().lower() if isinstance(x, str) else bool(x == y)
