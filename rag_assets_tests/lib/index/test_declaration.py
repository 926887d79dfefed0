"""Issue 51: an index's declaration, the rules by hand: what the first build records, what a later
build changes (only what it was given), what every other process takes from it, how it reads
back, and the component's attributes that mirror the settings."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from rag_assets.lib.index.declaration import (
    ANSWER_FIELDS,
    BUILD_FIELDS,
    DECLARATION_FILE,
    DECLARED_FIELDS,
    FIRST_BUILD,
    Declaration,
    adaptation_line,
    apply_declaration,
    change_lines,
    changes_between,
    declared_settings,
    given_in_env,
    ignored_lines,
    read_declaration,
    record,
)
from rag_assets.settings import ENV, Settings

DAY1, DAY2 = "2026-12-05T10:00:00Z", "2026-12-06T09:30:00Z"
REPO = Path(__file__).resolve().parents[3]


def _first(**given_values: str) -> Declaration:
    env = {ENV[k][0]: v for k, v in given_values.items()}
    settings = Settings.from_env(env)
    declaration, changes = record(None, settings, given_in_env(env), "the index run", DAY1)
    assert [name for name, _, _ in changes] == sorted(declaration.entries) or changes
    return declaration


def test_the_first_build_records_every_build_setting_and_the_answer_settings_given():
    d = _first(adapt="off", fusion="dense")
    assert set(BUILD_FIELDS) <= set(d.entries)  # given or default: what was built is kept
    assert {k for k in d.entries if k in ANSWER_FIELDS} == {"fusion"}  # only what was given
    assert d.entries["adapt"].value == "off" and d.entries["chunk_target"].value == "512"
    assert d.entries["adapt_budget_s"].value == "1800"  # as RAG_ADAPT_BUDGET_S reads, not 1800.0
    assert all(e.by == FIRST_BUILD and e.at == DAY1 and e.was is None for e in d.entries.values())
    assert d.entries["adapt"].said() == "set at the first build on 2026-12-05"
    assert adaptation_line(d) == "adaptation: off, set at the first build on 2026-12-05"


def test_a_later_build_changes_only_what_it_is_given():
    d = _first(adapt="off")
    # a process without RAG_ADAPT (auto by default) builds: nothing given, nothing changes
    same, changes = record(d, Settings.from_env({}), set(), "the index run", DAY2)
    assert same is d and changes == []
    # RAG_CHUNK_TARGET=256 given to this run: taken, with when, by what and the value replaced
    env = {"RAG_CHUNK_TARGET": "256"}
    new, changes = record(d, Settings.from_env(env), given_in_env(env), "the index run", DAY2)
    assert changes == [("chunk_target", "512", "256")]
    assert new.entries["chunk_target"].said() == "set by the index run on 2026-12-06, was 512"
    assert new.entries["adapt"] == d.entries["adapt"] and new.first_build == DAY1
    assert changes_between(d, new) == changes
    assert change_lines(new, changes) == [
        "declared: RAG_CHUNK_TARGET='256', given to this run (was '512'); the index keeps it"
    ]
    assert change_lines(d, changes_between(None, d))[0].startswith(
        f"declared: {len(d.entries)} settings that shape this index"
    )
    # an answer setting given later is added; the same value given again changes nothing
    env = {"RAG_RERANK_DEPTH": "10", "RAG_CHUNK_TARGET": "256"}
    newer, changes = record(new, Settings.from_env(env), given_in_env(env), "component x", DAY2)
    assert changes == [("rerank_depth", None, "10")]
    assert newer.entries["rerank_depth"].by == "component x"


def test_every_other_process_takes_the_declared_values_over_its_environment():
    d = _first(adapt="off", chunk_strategy="C")
    shell = Settings.from_env({"RAG_ADAPT": "on", "RAG_FUSION": "bm25", "RAG_EMBED_THREADS": "3"})
    s = apply_declaration(shell, d)
    assert (s.adapt, s.chunk_strategy) == ("off", "C")  # declared
    assert s.fusion == "bm25"  # not declared (an answer setting never given): the environment's
    assert s.embed_threads == 3  # a machine's setting is never declared
    given = apply_declaration(shell, d, given={"adapt"})  # what a build is given wins
    assert given.adapt == "on" and given.chunk_strategy == "C"
    lines = ignored_lines(d, {"RAG_ADAPT": "on", "RAG_CHUNK_STRATEGY": "c", "RAG_FUSION": "bm25"})
    assert lines == [
        "not taken: RAG_ADAPT='on' from this environment: the index declares 'off' (set at the "
        "first build on 2026-12-05); give it to `rag-assets index` to change it"
    ]  # RAG_CHUNK_STRATEGY=c is C: the same value in another case is not reported


def test_it_is_read_back_from_beside_the_pointer_and_checked(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    assert read_declaration(index) is None and read_declaration(tmp_path / "none") is None
    d = _first(adapt="off", embedding_model="")
    (index / DECLARATION_FILE).write_text(d.to_json())
    assert read_declaration(index) == d
    s = declared_settings(Settings.from_env({"RAG_INDEX_URI": str(index), "RAG_ADAPT": "auto"}))
    assert s.adapt == "off" and s.index_uri == str(index)
    assert s.work_dir == str(index / ".rag-work")  # the index's own, not the replaced one's
    raw = json.loads(d.to_json())
    raw["settings"]["chunk_target"]["value"] = "-3"
    raw["settings"]["from_a_newer_version"] = {"value": "x", "at": DAY1, "by": FIRST_BUILD}
    (index / DECLARATION_FILE).write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        read_declaration(index)
    msg = str(e.value)
    assert "declaration.json: RAG_CHUNK_TARGET='-3'" in msg and "\n" not in msg
    (index / DECLARATION_FILE).write_text('{"settings": ')
    with pytest.raises(ValueError, match="cannot be read.*`rag-assets index`"):
        read_declaration(index)
    report = d.as_report()
    assert report["settings"]["RAG_ADAPT"] == {
        "value": "off",
        "set": "set at the first build on 2026-12-05",
        "at": DAY1,
        "by": FIRST_BUILD,
    }


def test_the_component_attributes_are_the_declared_settings_with_their_defaults():
    """``rag_assets.RagIndex``: one attribute per declared setting, named as its variable is
    (lower-case, no RAG_), of its type and with its default; and docs/settings.md names it."""
    from rag_assets.defs.component import ATTRIBUTE_HELP, EXTRA_ATTRIBUTES, RagIndex

    types = {f.name: f.type for f in fields(Settings)}
    attributes = RagIndex.model_fields
    assert set(attributes) == {*DECLARED_FIELDS, *EXTRA_ATTRIBUTES}
    assert set(ATTRIBUTE_HELP) == set(attributes)
    for name in (*DECLARED_FIELDS, "backfill_batch_rows"):
        var, default = ENV[name]
        assert var == f"RAG_{name.upper()}"
        kind = {"int": int, "float": float, "str": str}[types[name]]
        assert attributes[name].annotation is kind, name
        assert attributes[name].default == kind(default), name
    settings_md = (REPO / "docs" / "settings.md").read_text()
    for name in (*DECLARED_FIELDS, "backfill_batch_rows"):
        assert f"`{ENV[name][0]}` · `{name}`" in settings_md, name


@pytest.mark.parametrize(
    ("attributes", "said"),
    [
        ({"chunk_stratgy": "E"}, "RagIndex attribute 'chunk_stratgy': no such attribute (did you "
         "mean chunk_strategy?)"),
        ({"chunk_strategy": "Z"}, "RagIndex attribute chunk_strategy='Z': not one of A, B, C, D, "
         "E, F (RAG_CHUNK_STRATEGY)"),
        ({"chunk_target": "many"}, "RagIndex attribute chunk_target='many': give a whole number "
         "(RAG_CHUNK_TARGET)"),
        ({"recall_floor": 2}, "RagIndex attribute recall_floor=2: out of range: give a number "
         "from 0 to 1 (RAG_RECALL_FLOOR)"),
    ],
)  # fmt: skip
def test_a_bad_attribute_is_refused_in_one_line_naming_it(attributes, said):
    from rag_assets.defs.component import AttributeRefused, RagIndex

    with pytest.raises(AttributeRefused) as e:
        RagIndex.get_model_cls().model_validate(attributes)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)
    ok = RagIndex.get_model_cls().model_validate({"chunk_target": 256, "documents_dir": "{{ x }}"})
    assert ok.chunk_target == 256  # a template's value is checked once resolved


def test_the_scaffolded_yaml_sets_the_folders_and_comments_every_other_attribute():
    import yaml

    from rag_assets.defs.component import RagIndex, scaffolded_yaml

    text = scaffolded_yaml("rag_assets.RagIndex", "handbook")
    parsed = yaml.safe_load(text)
    assert parsed == {
        "type": "rag_assets.RagIndex",
        "attributes": {
            "index_uri": "data/handbook/index",
            "documents_dir": "data/handbook/documents",
        },
    }
    uncommented = [
        ln.strip()[2:] for ln in text.splitlines() if ln.startswith("  # ") and ": " in ln
    ]
    for name in RagIndex.model_fields:
        if name not in ("index_uri", "documents_dir"):
            line = next(x for x in uncommented if x.startswith(f"{name}: "))
            value = yaml.safe_load(line)[name]
            assert value == RagIndex.model_fields[name].default or (
                value is None and RagIndex.model_fields[name].default == ""
            ), line
