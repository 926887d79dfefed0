"""``chunk_questions`` (issue 15) in the Dagster graph: off by default with today's stamps; on, it
is incremental by chunk text (edit one document: only its chunks reach the model) and its stamp
is its code version and part of the embedding table's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from rag_assets.defs.build import build_definitions, stamps_for
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.settings import Settings
from rag_assets_tests.lib.fake_llm import fake_llm, user_text


def _writer(body: dict[str, Any]) -> tuple[str, None]:
    passage = user_text(body).split("Passage:\n", 1)[1].split("\n\nWrite", 1)[0]
    word = passage.split()[-1]
    return f"What is {word} for?\nWhy does my {word} fail?\nHow do I change {word}?", None


def _asset(defs: dg.Definitions, key: str) -> Any:
    return defs.resolve_asset_graph().get(dg.AssetKey(key))


def _materialize(
    defs: dg.Definitions, instance: dg.DagsterInstance, sel: list[str]
) -> dict[str, dict[str, Any]]:
    """One run of ``sel``; each asset's materialisation metadata, as plain values."""
    res = dg.materialize(
        list(defs.assets or []),  # type: ignore[arg-type]
        instance=instance,
        resources=defs.resources,
        selection=sel,
    )
    assert res.success
    out = {}
    for node in sel:
        mats = res.asset_materializations_for_node(node)
        out[node] = {k: getattr(v, "value", v) for k, v in mats[0].metadata.items()}
    return out


def test_off_by_default_keeps_todays_stamps_and_graph() -> None:
    settings = Settings(adapt="off")  # issue 44's adapted_encoder would sit before the embedding
    defs = build_definitions(settings)
    stamps = stamps_for(settings)
    assert stamps.pipeline == strategy("E").pipeline_version  # exactly today's table name
    # issue 22: off, chunk_questions is not in the graph (an asset that does nothing is not
    # materialised in every run), and chunk_embeddings depends on chunks and (issue 42: its
    # inputs, through the artefacts' IO manager) the extracted documents alone
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert "chunk_questions" not in keys and {"chunks", "chunk_embeddings"} <= keys
    parents = {k.to_user_string() for k in _asset(defs, "chunk_embeddings").parent_keys}
    assert parents == {"chunks", "extracted_documents"}


def test_bad_expansion_settings_say_what_to_change() -> None:
    with pytest.raises(ValueError, match="RAG_EXPAND_LLM_URL or RAG_LLM_URL"):
        build_definitions(Settings(expand="llm"))
    with pytest.raises(ValueError, match="RAG_EXPAND="):
        build_definitions(Settings(expand="t5"))
    with pytest.raises(ValueError, match="RAG_EXPAND_LLM_MODEL"):
        build_definitions(Settings(expand="llm", expand_llm_url="http://127.0.0.1:9"))


@pytest.mark.slow
def test_chunk_questions_is_incremental_and_stamped(tmp_path: Path, sample_docs: Path) -> None:
    with fake_llm(_writer) as (url, seen):
        settings = Settings(
            documents_dir=str(sample_docs),
            index_uri=str(tmp_path / "index"),
            work_dir=str(tmp_path / "work"),
            expand="llm",
            expand_llm_url=url,
            expand_llm_model="fake-writer",
            expand_n=3,
        )
        defs = build_definitions(settings)
        stamps = stamps_for(settings)
        code = _asset(defs, "chunk_questions").code_version
        assert code.startswith("d2q:fake-writer:") and code.endswith(":n3")
        assert stamps.pipeline == f"{strategy('E').pipeline_version}+{code}"
        assert stamps.table_name != stamps_for(Settings()).table_name
        other = build_definitions(Settings(**{**settings.__dict__, "expand_llm_model": "m2"}))
        assert _asset(other, "chunk_questions").code_version != code

        instance = dg.DagsterInstance.ephemeral()
        sel = ["extracted_documents", "chunks", "chunk_questions"]

        def run() -> dict[str, Any]:
            return _materialize(defs, instance, sel)["chunk_questions"]

        first = run()
        assert first["generated"] == first["chunks"] == len(seen) > 0
        assert first["views"] == 3 * first["chunks"]
        again = run()
        assert again["generated"] == 0 and len(seen) == first["generated"]
        doc = sorted(sample_docs.glob("*.md"))[0]
        text = doc.read_text()
        cut = text.rfind("\n\n")
        doc.write_text(text[:cut] + "\n\nA new closing paragraph about retries." + text[cut:])
        edited = run()
        # only the edited document's changed chunks reached the model
        assert 1 <= edited["generated"] <= 3
        assert edited["cached"] == edited["chunks"] - edited["generated"]


@pytest.mark.slow
def test_eval_runs_the_expanded_and_rewritten_configuration(
    tmp_path: Path, sample_docs: Path
) -> None:
    """`rag-assets eval` honours RAG_EXPAND / RAG_QUERY_REWRITE; `--json` keeps its keys."""
    import argparse

    from rag_assets.commands.evaluate import run_eval
    from rag_assets_tests.helpers import SAMPLE_EVAL

    def reply(body: dict[str, Any]) -> tuple[str, None]:
        if "Passage:" in user_text(body):
            return _writer(body)
        return "The documentation passage about it.", None

    args = argparse.Namespace(
        retrievers="dense,bm25,hybrid", cache=tmp_path / "cache", beir=None,
        documents=sample_docs, questions=SAMPLE_EVAL, strategies=None, strategy="E", target=None,
    )  # fmt: skip
    with fake_llm(reply) as (url, seen):
        on = Settings(
            work_dir=str(tmp_path / "work"), expand="llm", llm_url=url, llm_model="fake",
            query_rewrite="llm",
        )  # fmt: skip
        res, _ = run_eval(args, on)
        assert res["expansion"]["expand_model"] == "fake" and res["query_rewrite"]
        n_chunks = res["chunks"]
        assert sum("Passage:" in user_text(b) for b in seen) == n_chunks
        off, _ = run_eval(args, Settings(work_dir=str(tmp_path / "work")))
    assert off["expansion"] is None and off["query_rewrite"] is None
    assert set(off) == set(res) and set(off["retrievers"]) == set(res["retrievers"])
    assert off["table"] != res["table"]


@pytest.mark.slow
def test_questions_live_in_the_bucket_and_an_empty_work_dir_asks_the_model_nothing_again(
    tmp_path: Path, sample_docs: Path, s3_env: dict[str, str]
) -> None:
    """Issue 42: with an object-store index the questions are an object under the index's
    ``_rag_work/`` (never a file in RAG_WORK_DIR), ``chunk_embeddings`` writes its views from
    it, and a run on another machine's empty work dir takes every chunk's questions from it:
    no model call, the same views."""
    import shutil
    from dataclasses import replace

    from rag_assets.defs.expansion import expansion_config
    from rag_assets.lib.index.artefacts import ARTEFACTS_DIR, Artefacts
    from rag_assets.lib.index.expand import questions_name, seed_entries

    with fake_llm(_writer) as (url, seen):
        settings = Settings(
            documents_dir=str(sample_docs),
            index_uri=f"s3://rag/{tmp_path.name}",
            work_dir=str(tmp_path / "w1"),
            expand="llm",
            expand_llm_url=url,
            expand_llm_model="fake-writer",
            expand_n=2,
            adapt="off",
        )
        instance = dg.DagsterInstance.ephemeral()
        sel = ["extracted_documents", "chunks", "chunk_questions", "chunk_embeddings"]

        def run(s: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
            meta = _materialize(build_definitions(s), instance, sel)
            return meta["chunk_questions"], meta["chunk_embeddings"]

        first, embedded = run(settings)
        assert first["generated"] == first["chunks"] == len(seen) > 0
        assert embedded["views"] == 2 * first["chunks"]
        config = expansion_config(settings)
        assert config is not None
        name = questions_name(config.stamp, strategy("E").pipeline_version)
        kept = Artefacts(settings.index_uri, tmp_path / "elsewhere").read(name)
        assert kept is not None and len(seed_entries(kept)) == first["chunks"]
        assert str(first["path"]).startswith("s3://") and ARTEFACTS_DIR in str(first["path"])
        assert not (tmp_path / "w1" / name).exists()  # the cache is local, the artefact not

        shutil.rmtree(tmp_path / "w1")  # another machine: an empty work dir
        again, embedded2 = run(replace(settings, work_dir=str(tmp_path / "w2")))
        assert again["generated"] == 0 and len(seen) == first["generated"]
        assert again["seeded"] == again["cached"] == again["chunks"]
        assert embedded2["views"] == embedded["views"]
