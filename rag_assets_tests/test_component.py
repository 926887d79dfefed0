"""Issue 51 on the real thing: a Dagster project in a temporary folder with two ``RagIndex``
components, as a team adds them to theirs. ``dg list components`` shows the type, ``dg scaffold
defs rag_assets.RagIndex`` writes the first one's ``defs.yaml`` (the second is written by hand),
``dg check defs`` and ``dg list defs`` pass, and ``dagster asset materialize --select '*'`` builds
both in one run: each answers from its own documents and never from the other's, each has its own
jobs, sensors, checks and group, and a run of one leaves the other alone. The handbook's index is
first built by the CLI (``rag-assets index``), which the component then takes over; the CLI then
runs ``status`` and ``index`` on the wiki's, which the component built, with nothing but
``--index``. A bad attribute is refused by ``dg check defs`` in one line naming it.

The dg and dagster commands are processes (as a team runs them): one project, built once for the
module, and as few of them as cover the asks (each pays for an interpreter importing Dagster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rag_assets.defs.run import ensure_instance_config
from rag_assets.lib.index.declaration import read_declaration
from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.helpers import cli_here

pytestmark = pytest.mark.slow

DOCS = {
    "handbook": {
        "tea.md": "# Brewing green tea\n\n## Water\n\nGreen tea wants water at about eighty "
        "degrees, never boiling. Steep the leaves for two minutes.\n",
        "bikes.md": "# Bicycle chains\n\n## Cleaning\n\nWipe the chain with a dry rag, then add "
        "one drop of oil to every link. A dirty chain wears the cassette.\n",
    },
    "wiki": {
        "rollback.md": "# Rolling back\n\n## The command\n\nRun rag-assets rollback to publish "
        "the previous table version again. The old table stays on disk until it is compacted.\n",
        "backups.md": "# Database backups\n\n## Schedule\n\nThe database is dumped every night "
        "at two o'clock and the dumps are kept for thirty days in cold storage.\n",
    },
}
NEEDLES = {
    "handbook": [
        ("h1", "tea.md", "Green tea wants water at about eighty degrees, never boiling.",
         "What water temperature does green tea need?"),
        ("h2", "bikes.md", "Wipe the chain with a dry rag, then add one drop of oil to every link.",
         "How should a bicycle chain be cleaned and oiled?"),
    ],
    "wiki": [
        ("w1", "rollback.md", "Run rag-assets rollback to publish the previous table version "
         "again.", "How do I publish the previous table version again?"),
        ("w2", "backups.md", "The database is dumped every night at two o'clock and the dumps "
         "are kept for thirty days in cold storage.", "How long are database dumps kept?"),
    ],
}  # fmt: skip
PYPROJECT = """\
[project]
name = "ragteam"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["rag-assets"]

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "ragteam"
"""
DEFINITIONS = """\
from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""
WIKI_YAML = """\
type: rag_assets.RagIndex

attributes:
  index_uri: data/wiki/index
  documents_dir: data/wiki/documents
  eval_dir: data/wiki/eval
  chunk_target: 400
  adapt: "off"
"""


def _write_set(folder: Path, name: str) -> None:
    folder.mkdir(parents=True)
    rows = [
        json.dumps({"id": i, "document": d, "needle": n, "queries": {"course": q, "ticket": q}})
        for i, d, n, q in NEEDLES[name]
    ]
    (folder / "questions.jsonl").write_text("\n".join(rows) + "\n")


def _tool(root: Path, env: dict[str, str], *args: str, check: bool = True) -> str:
    """``dg …`` or ``dagster …`` of the project's environment, in the project folder: its
    stdout and stderr together (stdout alone for ``--json``)."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / args[0]), *args[1:]],
        cwd=root, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    if check:
        assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
    return proc.stdout if "--json" in args else out


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("ragteam")
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "ragteam" / "defs").mkdir(parents=True)
    (root / "ragteam" / "__init__.py").write_text("")
    (root / "ragteam" / "defs" / "__init__.py").write_text("")
    (root / "ragteam" / "definitions.py").write_text(DEFINITIONS)
    for name, docs in DOCS.items():
        folder = root / "data" / name / "documents"
        folder.mkdir(parents=True)
        for file, text in docs.items():
            (folder / file).write_text(text)
        _write_set(root / "data" / name / "eval", name)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "DAGSTER_HOME"))},
        "PYTHONPATH": str(root),
        "DAGSTER_HOME": str(root / "dagster-home"),
        "RAG_ADAPT": "off",  # the tests' default (conftest), as the project's environment
    }
    (root / "dagster-home").mkdir()
    ensure_instance_config(root / "dagster-home")  # no notice that it has no dagster.yaml
    # the handbook's index is first built by the CLI, then taken over by its component
    cli = {**env, "RAG_DOCUMENTS_DIR": str(root / "data/handbook/documents")}
    cli |= {"RAG_EVAL_DIR": str(root / "data/handbook/eval")}
    cli.pop("DAGSTER_HOME")
    cli_here(cli, "index", "--index", str(root / "data/handbook/index"), "--quiet", cwd=root)
    outputs = {"components": _tool(root, env, "dg", "list", "components")}
    outputs["scaffold"] = _tool(
        root, env, "dg", "scaffold", "defs", "rag_assets.RagIndex", "handbook"
    )
    scaffolded = root / "ragteam" / "defs" / "handbook" / "defs.yaml"
    outputs["scaffolded"] = scaffolded.read_text()
    scaffolded.write_text(
        outputs["scaffolded"].replace("  # eval_dir: data/eval", "  eval_dir: data/handbook/eval")
    )
    (root / "ragteam" / "defs" / "wiki").mkdir()
    (root / "ragteam" / "defs" / "wiki" / "defs.yaml").write_text(WIKI_YAML)
    outputs["check"] = _tool(root, env, "dg", "check", "defs")
    outputs["defs"] = _tool(root, env, "dg", "list", "defs", "--json")
    outputs["materialize"] = _tool(
        root, env, "dagster", "asset", "materialize", "--select", "*", "-m", "ragteam.definitions"
    )
    return root, env, outputs


def test_dg_lists_scaffolds_and_checks_the_component(project):
    root, _, out = project
    assert "rag_assets.RagIndex" in out["components"]
    text = out["scaffolded"]
    assert text.startswith("# A RAG index (rag_assets.RagIndex")
    assert "type: rag_assets.RagIndex" in text and "  index_uri: data/handbook/index" in text
    assert "  # chunk_target: 512" in text and "(RAG_CHUNK_TARGET)" in text  # commented, named
    assert "  # adapt: auto" in text and '  # query_log: "on"' in text
    assert "All definitions loaded successfully." in out["check"]


def test_each_index_has_its_own_keys_group_jobs_sensors_and_checks(project):
    _, _, out = project
    listed = json.loads(out["defs"])
    assets = {a["asset_key"]: a for a in listed["assets"]}
    for name in ("handbook", "wiki"):
        own = {k for k in assets if k.startswith(f"{name}/")}
        assert {f"{name}/chunks", f"{name}/chunk_embeddings", f"{name}/published_index"} <= own
        assert {assets[k]["group_name"] for k in own} == {name}  # one box per index in the UI
        assert f"{name}__index_job" in {j["name"] for j in listed["jobs"]}
        sensors = {s["name"] for s in listed["sensors"]}
        assert {f"{name}__rag_automation_sensor", f"{name}__traffic_reviews_sensor"} <= sensors
        checks = {c["key"] for c in listed["asset_checks"]}
        assert f"{name}/chunk_embeddings:index_matches_chunks" in checks
    assert not any(k.startswith(("chunks", "published_index")) for k in assets)  # no bare keys


def test_materialize_star_builds_both_and_each_answers_from_its_own_documents(project):
    root, env, out = project
    assert "RUN_SUCCESS" in out["materialize"]
    for name, other in (("handbook", "wiki"), ("wiki", "handbook")):
        index = root / "data" / name / "index"
        pub = IndexStore(index).published()
        assert pub is not None
        for _, doc, _, question in NEEDLES[name]:  # its own questions: its own documents
            hits = json.loads(
                cli_here(env, "search", question, "--index", str(index), "--json", cwd=root).stdout
            )
            assert hits[0]["document_id"] == doc
        for _, _, _, question in NEEDLES[other]:  # the other's: never the other's documents
            hits = json.loads(
                cli_here(env, "search", question, "--index", str(index), "--json", cwd=root).stdout
            )
            assert {h["document_id"] for h in hits} <= set(DOCS[name])
    # the wiki's YAML is kept in its declaration; the handbook's CLI build declared it first
    wiki = read_declaration(root / "data/wiki/index")
    assert wiki is not None and wiki.entries["chunk_target"].value == "400"
    assert wiki.entries["chunk_target"].by == "the first build"
    handbook = read_declaration(root / "data/handbook/index")  # the CLI's first build's
    assert handbook is not None and handbook.first_build < wiki.first_build
    assert handbook.entries["eval_dir"].value == str(root / "data/handbook/eval")
    assert all(e.by == "the first build" for e in handbook.entries.values())  # the YAML agrees


def test_the_cli_works_on_the_index_a_component_built(project):
    """``status`` and ``index`` with nothing but ``--index``: the declaration gives the rest
    (the wiki's folder and its 400-character chunks, which no flag or variable names here)."""
    root, env, _ = project
    index = str(root / "data/wiki/index")
    bare = {k: v for k, v in env.items() if k != "DAGSTER_HOME"}
    status = cli_here(bare, "status", "--index", index, cwd=root).stdout
    assert "adaptation: off, set at the first build on " in status
    assert "built from: " + str(root / "data/wiki/documents") in status
    before = IndexStore(index).published()
    out = cli_here(bare, "index", "--index", index, "--quiet", cwd=root).stdout
    assert "chunks: " in out and "(E): " in out and "unchanged" in out
    assert "t400" in before.table and IndexStore(index).published().table == before.table
    assert "declared:" not in out  # nothing given, nothing changed


def test_a_run_of_one_index_leaves_the_other_alone(project):
    root, env, _ = project
    import dagster as dg

    sys.path.insert(0, str(root))
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("RAG_")})
    try:
        defs = dg.load_from_defs_folder(path_within_project=root / "ragteam")
        job = defs.resolve_job_def("handbook__index_job")
        keys = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
        assert keys and all(k.startswith("handbook/") for k in keys)
        required = set(job.required_resource_keys)
        assert "handbook__lance_index" in required
        assert not any(k.startswith("wiki") for k in required)
        wiki = IndexStore(root / "data/wiki/index")
        wiki_history = wiki.history_records()
        wiki_key = dg.AssetKey(["wiki", "chunk_embeddings"])
        with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            last = instance.get_latest_materialization_event(wiki_key)
            assert last is not None
            assert job.execute_in_process(instance=instance).success
            assert instance.get_latest_materialization_event(wiki_key).run_id == last.run_id
        assert wiki.history_records() == wiki_history
    finally:
        sys.path.remove(str(root))
        for module in [m for m in sys.modules if m == "ragteam" or m.startswith("ragteam.")]:
            del sys.modules[module]
        os.environ.clear()
        os.environ.update(saved)


def test_dg_check_defs_refuses_a_bad_attribute_in_one_line_naming_it(project):
    root, env, _ = project
    bad = root / "ragteam" / "defs" / "bad"
    bad.mkdir()
    (bad / "defs.yaml").write_text(
        textwrap.dedent("""\
            type: rag_assets.RagIndex
            attributes:
              chunk_stratgy: E
            """)
    )
    try:
        out = _tool(root, env, "dg", "check", "defs", check=False)
    finally:
        (bad / "defs.yaml").unlink()
        bad.rmdir()
    said = [ln for ln in out.splitlines() if "chunk_stratgy" in ln and "attribute" in ln]
    assert said == [
        "rag_assets.defs.component.AttributeRefused: RagIndex attribute 'chunk_stratgy': no such "
        "attribute (did you mean chunk_strategy?); the attributes are the settings of "
        "docs/settings.md, lower-case (RAG_CHUNK_TARGET: chunk_target)"
    ]
