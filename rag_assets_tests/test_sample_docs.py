"""The bundled sample documents tell the truth about the product they ship with.

They are the first thing a user reads through ``rag-assets ask``, so every name they use must
exist: asset, check, job, sensor and resource names (read from the code location's
definitions), ``rag-assets`` commands and their flags (read from the CLI's parser), ``RAG_*``
settings (read from ``settings.ENV``), the files and folders they say things are stored in
(read from the functions that write them), the stamp fields (read from ``Stamps``). Their
Python examples run, and every needle of ``data/eval`` is still in them verbatim.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rag_assets_tests.helpers import REPO, SAMPLE_DOCS, SAMPLE_EVAL

SOURCES = [*sorted(SAMPLE_DOCS.glob("*.md")), REPO / "data" / "pdf_source" / "glossary.md"]
FENCE = re.compile(r"^(```|~~~)(\w*)\n(.*?)^\1\s*$", re.M | re.S)
SNAKE = re.compile(r"(?<![\w./-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w-])")
SETTING = re.compile(r"\bRAG_[A-Z0-9_]+\b")
COMMAND = re.compile(r"\brag-assets ([a-z][\w-]*)((?: [^`\n]*)?)")


def _prose(text: str) -> str:
    """The text without its fenced code blocks (examples of other people's Markdown)."""
    return FENCE.sub("", text)


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _prose(text))


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in SOURCES}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Names in the code location (default settings: what a user of the sample corpus gets)."""
    from rag_assets.defs.build import build_definitions
    from rag_assets.settings import Settings

    defs = build_definitions(Settings())
    ag = defs.resolve_asset_graph()
    return {
        "assets": {k.to_user_string() for k in ag.get_all_asset_keys()},
        "checks": {k.name for k in ag.asset_check_keys},
        "jobs": {j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__")},
        "sensors": {s.name for s in defs.sensors or []},
        "resources": set(defs.resources or {}),
    }


def _cli() -> dict[str, set[str]]:
    from rag_assets.cli import _parser

    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {o for a in sub._actions for o in a.option_strings}
        for name, sub in subs.choices.items()
    }


def test_every_snake_case_name_is_a_graph_name_or_a_stamp_field(texts, graph):
    from rag_assets.lib.index.versioning import Stamps

    known = set().union(*graph.values()) | {f.name for f in dataclasses.fields(Stamps)}
    known.add("rag_assets")  # the package
    unknown = sorted((doc, name) for doc, name in _pairs(texts) if name not in known)
    assert not unknown, f"sample documents name what does not exist: {sorted(unknown)}"


def _pairs(texts: dict[str, str]) -> set[tuple[str, str]]:
    return {(doc, n) for doc, text in texts.items() for n in SNAKE.findall(_prose(text))}


def test_the_documents_name_every_asset_of_the_graph(texts, graph):
    named = {span for text in texts.values() for span in _spans(text)}
    missing = graph["assets"] - named
    assert not missing, f"assets no sample document describes (add to 01-*.md): {missing}"
    table = texts["01-pipeline-overview.md"].split("## The asset graph", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \|", table.split("\n## ", 1)[0], flags=re.M)
    assert set(rows) <= graph["assets"] and len(rows) == len(set(rows)) >= 7


def test_every_setting_named_exists(texts):
    from rag_assets.settings import ENV

    settings = {env for env, _ in ENV.values()} | {"RAG_DEBUG"}  # RAG_DEBUG: cli.py
    used = {(doc, s) for doc, text in texts.items() for s in SETTING.findall(text)}
    assert used, "the sample documents name no setting at all?"
    assert not {u for u in used if u[1] not in settings}


def test_every_command_and_flag_named_exists(texts):
    cli = _cli()
    used = [(doc, m) for doc, text in texts.items() for m in COMMAND.findall(text)]
    assert len(used) >= 5
    for doc, (command, rest) in used:
        assert command in cli, f"{doc}: `rag-assets {command}` is not a command"
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest):
            assert flag in cli[command], f"{doc}: `rag-assets {command} {flag}` does not exist"


def test_every_storage_path_named_is_where_the_code_writes(texts, tmp_path):
    from rag_assets.defs.evaluation import eval_name
    from rag_assets.defs.expansion import questions_cache_dir
    from rag_assets.lib.index import store
    from rag_assets.lib.index.adapted import RECORD_FILE
    from rag_assets.lib.index.pipeline import chunks_path, save_documents
    from rag_assets.settings import ENV, WORK_SUBDIR, Settings

    work = tmp_path / "work"
    work_dirs = {
        save_documents(work, []).parent.name,
        chunks_path(work, "chunk1:E").parent.name,
        questions_cache_dir(work).parent.name,
    }
    entry = SimpleNamespace(table="t", version=1)
    index_names = {
        store.POINTER_FILE,
        store.HISTORY_FILE,
        store.STAGING_FILE,
        store.MANIFESTS_DIR,
        eval_name(entry, "x.json").split("/")[0],
        store.FILES_TABLE,
        RECORD_FILE.split("/")[0],  # issue 44: the adapted encoder, with the index
    }
    defaults = {default for _, default in ENV.values() if default.startswith("data/")}
    work_prefix = Settings().work_dir + "/"  # data/index/.rag-work/
    index_names.add(WORK_SUBDIR)
    checked = 0
    for doc, text in texts.items():
        for span in _spans(text):
            if " " in span or not re.fullmatch(r"[\w./-]+", span):
                continue
            if span.startswith(work_prefix):  # issue 31: the demo's work is in its index
                assert span.removeprefix(work_prefix).strip("/") in work_dirs, (doc, span)
            elif span.startswith("data/"):
                assert span.rstrip("/") in defaults, (doc, span)
            elif span.startswith("rag_assets/"):
                assert (REPO / span).exists(), (doc, span)
            elif "." in span or span.endswith("/"):
                assert span.rstrip("/") in index_names, (doc, span)
            else:
                continue
            checked += 1
    assert checked >= 6


def test_stamp_table_lists_exactly_the_stamp_fields(texts):
    from rag_assets.lib.index.versioning import Stamps

    section = texts["03-versions-and-invalidation.md"].split("## What a stamp set contains")[1]
    section = section.split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \|", section, flags=re.M)
    fields = [f.name for f in dataclasses.fields(Stamps)]
    assert [r for r in rows if r != "field"] == fields
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    assert f"A stamp set has {words[len(fields)]} fields." in section


def test_python_examples_run(texts, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the examples use the project's relative paths
    blocks = [
        (doc, m.group(3))
        for doc, text in texts.items()
        for m in FENCE.finditer(text)
        if m.group(2) == "python"
    ]
    assert blocks
    for doc, code in blocks:
        exec(compile(code, doc, "exec"), {"__name__": "__example__"})
        if "extract_folder" in code:  # prints one line per document
            out = capsys.readouterr().out
            assert "01-pipeline-overview.md ok" in out and "broken-scan.pdf failed" in out


def test_dagster_module_in_the_runbook_exists(texts):
    import importlib.util

    modules = re.findall(r"dagster dev -m ([\w.]+)", texts["06-operations-runbook.md"])
    assert modules and all(importlib.util.find_spec(m) for m in modules)


def test_eval_needles_are_still_in_the_sample_documents():
    from rag_assets.lib.evaluate.questions import check_needles, load_needle_set
    from rag_assets.lib.ingest.extract import extract_folder

    qset = load_needle_set(SAMPLE_EVAL)
    docs = {d.document_id: d.text for d in extract_folder(Path(SAMPLE_DOCS)).documents if d.ok}
    assert len(qset.questions) == 12
    assert check_needles(qset.questions, docs) == []
