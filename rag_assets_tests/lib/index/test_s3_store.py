# mypy: disable-error-code="union-attr,index,arg-type,operator"
"""The index on object storage (issue 13): a real S3-compatible server (moto in server mode,
started here on a free loopback port) and LanceDB's storage options pointing at it.

Everything the query side needs lives in the LanceDB database: the pointer, staging and history
in ``_rag_meta``, BM25 in ``_rag_bm25``; nothing is written beside the tables. Build, publish,
query, re-index, roll back, and kill -9 mid-embedding then re-run. Plumbing uses the
deterministic hash embedder; one test builds and queries with the packaged MiniLM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import pytest

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import (
    BM25_TABLE,
    META_TABLE,
    IndexStore,
    Published,
    is_remote,
    now_iso,
)
from rag_assets.lib.index.versioning import Stamps
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.helpers import free_port
from rag_assets_tests.lib.index.fake_index import HashEmbedder, _corpus

moto_server = pytest.importorskip(
    "moto.server", reason="moto[server] is not installed: `pip install 'moto[server]'` (dev extra)"
)
boto3 = pytest.importorskip("boto3", reason="boto3 (installed with moto[server]) is missing")

pytestmark = pytest.mark.slow  # a real S3 server and real LanceDB tables on it

STRAT = strategy("E", 300)
KEYS = {"aws_access_key_id": "test-key", "aws_secret_access_key": "test-secret"}
REGION = "us-east-1"


class QueryHashEmbedder(HashEmbedder):
    def encode_query(self, query: str):  # type: ignore[no-untyped-def]
        return self.encode([query])[0]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free loopback port with one bucket; yields (endpoint, client)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, **KEYS)
    client.create_bucket(Bucket="rag")
    yield endpoint, client
    server.stop()


def _options(endpoint: str) -> dict[str, str]:
    """LanceDB storage options for the test server (what a worker's config would carry)."""
    return {"endpoint": endpoint, "allow_http": "true", "region": REGION, **KEYS}


def _env(endpoint: str) -> dict[str, str]:
    """The same, as the object store's own environment variables (LanceDB reads them)."""
    return {
        "AWS_ENDPOINT": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": KEYS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": KEYS["aws_secret_access_key"],
    }


def _keys(client, prefix: str) -> list[str]:
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="rag", Prefix=prefix):
        out += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
    return out


def _uri() -> tuple[str, str]:
    prefix = f"idx-{uuid.uuid4().hex[:8]}"
    return f"s3://rag/{prefix}", prefix + "/"


def test_pointer_staging_history_and_manifests_live_in_lancedb(s3, tmp_path, monkeypatch):
    endpoint, client = s3
    monkeypatch.chdir(tmp_path)  # nothing may be written locally (no "s3:" directory)
    uri, prefix = _uri()
    store = IndexStore(uri, storage_options=_options(endpoint))
    assert is_remote(uri) and store.meta == "lance" and store.published() is None
    stamps = Stamps("test/fake", "rev", 8, True, STRAT.pipeline_version, "x-1")
    entries = [
        Published("chunks_t", v, 1, stamps, 0.5, "given", 10 * v, now_iso()) for v in (1, 2, 3)
    ]
    store.write_staging(entries[0], chunks_over_window=4)
    for e in entries:
        store.publish(e)
    store.update_manifest(entries[2], documents=[{"document_id": "a.md", "status": "ok"}])

    again = IndexStore(uri, storage_options=_options(endpoint))  # another process, same bucket
    assert again.published() == entries[2]
    assert again.staging() == entries[0]
    assert again.manifest(entries[0]) == {
        "table": "chunks_t",
        "version": 1,
        "chunks_over_window": 4,
    }
    assert again.manifest(entries[2])["documents"] == [{"document_id": "a.md", "status": "ok"}]
    assert [e.key for e in again.rollback_stack()] == [e.key for e in entries]
    # rollback needs the table version to exist: none does here, so it is refused, nothing moves
    with pytest.raises(RuntimeError, match="cannot roll back to chunks_t@2"):
        again.rollback()
    assert again.published() == entries[2]
    assert [r.action for r in again.history_records()] == ["publish"] * 3

    objects = _keys(client, prefix)
    assert any(k.startswith(f"{META_TABLE}.lance/") for k in objects)
    assert not [k for k in objects if k.endswith(".json") and "/" not in k]  # no pointer files
    assert list(tmp_path.iterdir()) == []


def test_build_publish_query_reindex_rollback_on_s3(s3, tmp_path, monkeypatch):
    endpoint, client = s3
    monkeypatch.chdir(tmp_path)
    uri, prefix = _uri()
    docs = _corpus(tmp_path / "docs", n=3)
    emb = QueryHashEmbedder()
    store = IndexStore(uri, storage_options=_options(endpoint))
    first = index_folder(docs, store, STRAT, emb).entry
    (docs / "doc1.md").write_text("# Document 1\n\n## Part\n\nZebrafish glossary, edition two.\n")
    second = index_folder(docs, store, STRAT, emb).entry
    assert second.version > first.version

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing damaged, nothing to warn about
        reader = IndexStore(uri, storage_options=_options(endpoint))
        pub = reader.published()
    assert pub == second
    index = Index(reader, pub, emb)
    hits = index.search("zebrafish glossary", retriever="bm25", k=3)
    assert hits and hits[0].document_id == "doc1.md"  # BM25 read back from _rag_bm25
    assert index.search("zebrafish glossary", retriever="hybrid", k=3)
    assert reader.open_table(pub.table, pub.version).count_rows() == pub.rows

    rolled = reader.rollback()
    assert rolled.key == first.key and IndexStore(uri, _options(endpoint)).published() == first
    old = Index(reader, first, emb)
    assert not [h for h in old.search("zebrafish", retriever="bm25", k=5)]  # the old text
    assert [r.action for r in reader.history_records()] == ["publish", "publish", "rollback"]

    objects = _keys(client, prefix)
    assert {k.split("/")[0] for k in objects} >= {
        f"{META_TABLE}.lance",
        f"{BM25_TABLE}.lance",
        "documents.lance",
        f"{pub.table}.lance",
    }
    assert not [k for k in objects if k.startswith(("bm25/", "manifests/", "published"))]

    from rag_assets.lib.index.maintenance import compact_index

    report = {r.table: r for r in compact_index(reader)}  # tags + cleanup on the bucket
    assert set(report[pub.table].kept) >= {first.version, second.version}
    assert not report[pub.table].missing
    after = IndexStore(uri, storage_options=_options(endpoint))
    assert after.published() == first and after.has_bm25(second.table, second.version)
    assert Index(after, second, emb).search("zebrafish", retriever="bm25", k=1)
    assert list(tmp_path.iterdir()) == [tmp_path / "docs"]  # no local side files


def test_kill_9_mid_embedding_then_rerun(s3, tmp_path):
    """A worker (a subprocess reaching the bucket through the AWS_* environment, as a worker
    would) is killed with SIGKILL after its first commit; the published version keeps serving,
    and a re-run completes the table and publishes it."""
    endpoint, _ = s3
    uri, _ = _uri()
    docs = _corpus(tmp_path / "docs", n=4)
    emb = QueryHashEmbedder()
    store = IndexStore(uri, storage_options=_options(endpoint))
    (docs / "doc3.md").unlink()
    before = index_folder(docs, store, STRAT, emb).entry
    _corpus(docs, n=4)  # doc3.md is back; the others are rewritten with other texts below
    for i in range(3):
        (docs / f"doc{i}.md").write_text(f"# Document {i}\n\n## Part\n\nRewritten text {i}.\n")

    marker = tmp_path / "committed"
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from rag_assets.lib.ingest.chunk import strategy
        from rag_assets.lib.index.pipeline import index_folder
        from rag_assets_tests.lib.index.fake_index import HashEmbedder

        def progress(done, total):
            Path({str(marker)!r}).write_text(f"{{done}}/{{total}}")
            time.sleep(120)  # killed here, between two commits

        index_folder({str(docs)!r}, {uri!r}, strategy("E", 300), HashEmbedder(),
                     batch_rows=1, progress=progress)
        """
    )
    env = {**os.environ, **_env(endpoint), "PYTHONPATH": str(Path.cwd())}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the worker made no commit in 120 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    reader = IndexStore(uri, storage_options=_options(endpoint))
    assert reader.published() == before  # the crash published nothing
    live = Index(reader, before, emb)
    assert live.search("topic 12", retriever="hybrid", k=3)  # the old version still serves
    tbl = reader.open_table(before.table)
    assert tbl.version > before.version  # the killed worker did commit a batch

    after = index_folder(docs, reader, STRAT, emb).entry  # the re-run
    assert reader.published() == after and after.version > tbl.version
    rows = reader.open_table(after.table, after.version).count_rows()
    assert rows == after.rows
    index = Index(reader, after, emb)
    assert {h.document_id for h in index.search("rewritten text", retriever="bm25", k=10)} >= {
        "doc0.md",
        "doc1.md",
        "doc2.md",
    }
    texts = {r["document_id"] for r in index._rows.values()}
    assert texts == {"doc0.md", "doc1.md", "doc2.md", "doc3.md"}


def test_real_model_build_and_query_on_s3(s3, tmp_path, real_embedder):
    endpoint, _ = s3
    uri, _ = _uri()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "cats.md").write_text("# Cats\n\nCats purr when they are content and sleep a lot.\n")
    (docs / "rust.md").write_text("# Rust\n\nThe borrow checker enforces ownership rules.\n")
    store = IndexStore(uri, storage_options=_options(endpoint))
    entry = index_folder(docs, store, strategy("E", 512), real_embedder).entry
    index = Index(IndexStore(uri, storage_options=_options(endpoint)), entry, real_embedder)
    dense = index.search("why does my kitten make a rumbling noise", retriever="dense", k=2)
    assert dense[0].document_id == "cats.md"
    assert dense[0].cosine_distance < dense[1].cosine_distance
