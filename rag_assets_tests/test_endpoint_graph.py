"""The Dagster graph with a model server embedding (issue 35), on a real instance, a real LanceDB
directory and a real local HTTP server speaking the OpenAI protocol (deterministic vectors;
``seed`` is the model, so swapping it is the silent swap a provider can make under the same
name). A changed fingerprint is handled like a changed model: exactly ``chunk_embeddings`` is
stale, queries against the old table are refused in one line, the next run builds a new table
behind the gate, and rollback works. The same with the real model behind llama.cpp's server is
``rag_assets_tests/lib/index/test_endpoint_llama.py``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest

from rag_assets.cli import main
from rag_assets.defs.build import build_definitions
from rag_assets.defs.run import materialize_graph
from rag_assets.lib.index.declaration import DECLARATION_FILE
from rag_assets.lib.index.fingerprint import REGISTRY_NAME, read_registry
from rag_assets.lib.index.store import IndexStore
from rag_assets.settings import Settings
from rag_assets_tests.helpers import INDEX_ASSETS, SAMPLE_EVAL
from rag_assets_tests.model_servers import (
    EmbeddingServer,
    direct_to_local_servers,  # noqa: F401 (autouse)
)

pytestmark = pytest.mark.slow  # Dagster runs

ASSETS = INDEX_ASSETS


def _stale(defs: dg.Definitions, instance: dg.DagsterInstance) -> set[str]:
    resolver = CachingStaleStatusResolver(
        instance, defs.resolve_asset_graph(), LoadingContextForTest(instance)
    )
    return {k for k in ASSETS if resolver.get_status(dg.AssetKey(k)).name != "FRESH"}


def _settings(tmp: Path, docs: Path, url: str) -> Settings:
    return Settings(
        adapt="off",  # the tests' default (conftest); issue 44's auto is tested on its own
        documents_dir=str(docs),
        index_uri=str(tmp / "index"),
        work_dir=str(tmp / "work"),
        eval_dir=str(SAMPLE_EVAL),
        recall_floor=0.3,
        embed_url=url,
        embed_window=512,
    )


def _cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], s: Settings, *argv: str
) -> tuple[int, str, str]:
    for var, value in (
        ("RAG_INDEX_URI", s.index_uri),
        ("RAG_WORK_DIR", s.work_dir),
        ("RAG_EMBED_URL", s.embed_url),
        ("RAG_DOCUMENTS_DIR", s.documents_dir),
        ("RAG_EVAL_DIR", s.eval_dir),
        ("RAG_RECALL_FLOOR", str(s.recall_floor)),
    ):
        monkeypatch.setenv(var, value)
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_served_model_swap_is_stale_refused_upgraded_and_rolled_back(
    tmp_path, sample_docs, monkeypatch, capsys
):
    with EmbeddingServer(model="nomic-embed-text-v1.5", dims=64) as srv:
        instance = dg.DagsterInstance.ephemeral()
        s = _settings(tmp_path, sample_docs, srv.url + "/v1")
        defs1 = build_definitions(s)
        first = materialize_graph(s, progress=False, instance=instance)
        assert first.success, first.error
        store = IndexStore(s.index_uri)
        pub1 = store.published()
        assert pub1 is not None and pub1.stamps.revision.startswith("fp-")
        assert pub1.stamps.query_prompt == "search_query: "  # nomic's prefixes, stamped
        assert [f.id for f in read_registry(store)] == [pub1.stamps.revision]
        checks = dict((n, p) for n, p, _ in first.checks)
        assert checks["chunks_within_encoder_window"] and checks["index_matches_chunks"]
        assert _stale(defs1, instance) == set()
        rc, out, _ = _cli(monkeypatch, capsys, s, "search", "roll back", "-k", "3")
        assert rc == 0 and out.strip()

        # the provider swaps the model under the same name: a new fingerprint
        srv.seed = 2
        defs2 = build_definitions(s)  # the code location reloads (every `rag-assets index` does)
        emb_code = defs2.resolve_asset_graph().get(dg.AssetKey("chunk_embeddings")).code_version
        assert pub1.stamps.revision not in (emb_code or "")
        assert _stale(defs2, instance) == {"chunk_embeddings"}  # exactly the embedding asset
        rc, out, err = _cli(monkeypatch, capsys, s, "search", "roll back")
        assert rc == 1 and out == ""
        line = err.strip()
        assert "\n" not in line and f"fingerprint {pub1.stamps.revision}" in line
        assert "queries are refused rather than mixed" in line and "rag-assets index" in line

        # a code location loaded before the swap refuses to write with the new model
        res = dg.materialize(
            list(defs1.assets or []),
            instance=instance,
            resources=defs1.resources,
            selection=["chunk_embeddings"],
            raise_on_error=False,
        )
        assert not res.success
        failure = res.get_step_failure_events()[0].step_failure_data.error
        assert failure is not None and "Reload the code location" in failure.message
        assert store.published().table == pub1.table

        # the upgrade path: a new table, evaluated behind the gate, published
        second = materialize_graph(s, progress=False, instance=instance)
        assert second.success, second.error
        pub2 = IndexStore(s.index_uri).published()
        assert pub2 is not None and pub2.table != pub1.table
        assert pub2.stamps.revision != pub1.stamps.revision
        assert _stale(defs2, instance) == set()
        assert _cli(monkeypatch, capsys, s, "search", "roll back")[0] == 0

        # rollback: the old table again, refused while the new model is served ...
        rc, _, _ = _cli(monkeypatch, capsys, s, "rollback")
        assert rc == 0 and IndexStore(s.index_uri).published().table == pub1.table
        rc, _, err = _cli(monkeypatch, capsys, s, "search", "roll back")
        assert rc == 1 and "is not the one this table was embedded with" in err
        # ... and answering once the old model is served again
        srv.seed = 1
        assert _cli(monkeypatch, capsys, s, "search", "roll back")[0] == 0
        assert len(read_registry(IndexStore(s.index_uri))) == 2
        # issue 51: without RAG_EMBED_URL here, the server the index declares answers ...
        monkeypatch.setenv("RAG_QUERY_ENCODER", "torch")  # refused before any model loads
        rc, _, err = _cli(monkeypatch, capsys, replace(s, embed_url=""), "search", "roll back")
        assert rc == 0 and "not taken: RAG_EMBED_URL=''" in err
        # ... and on an index that declares none (built before declarations) the local model is
        # refused, told what to set
        (Path(s.index_uri) / DECLARATION_FILE).unlink()
        rc, _, err = _cli(monkeypatch, capsys, replace(s, embed_url=""), "search", "roll back")
        assert rc == 1 and "embedded by a model server: set RAG_EMBED_URL" in err


def test_a_server_that_is_down_fails_the_run_in_one_line_before_anything_is_written(
    tmp_path, sample_docs, monkeypatch, capsys
):
    with EmbeddingServer(model="fake-embed", dims=32, api_key="sk-right-0123456789") as srv:
        s = replace(_settings(tmp_path, sample_docs, srv.url + "/v1"), embed_api_key="sk-bad-000")
        monkeypatch.setenv("RAG_EMBED_API_KEY", "sk-bad-0000000")
        rc, _, err = _cli(monkeypatch, capsys, s, "index")
        assert rc == 1 and "refused the request (HTTP 401)" in err and "RAG_EMBED_API_KEY" in err
        assert "sk-bad" not in err and err.count("\n") == 1
        url = s.embed_url
    index = Path(s.index_uri)
    assert not index.exists() or not any(index.iterdir())  # nothing was written
    rc, _, err = _cli(monkeypatch, capsys, replace(s, embed_url=url), "index")
    assert rc == 1 and f"cannot reach RAG_EMBED_URL={url}" in err and err.count("\n") == 1
    assert not index.exists() or not any(index.iterdir())
    assert not (index / REGISTRY_NAME).exists()
