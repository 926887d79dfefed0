# mypy: disable-error-code="union-attr,index,arg-type"
"""The publish pointer: damaged files are named and recovered (or refused with the repair
command), writes stay atomic and follow the umask, rollback walks a stack of distinct versions.

Pointer-only cases use entries written by the store itself (no table is opened); rollback and
manifests use one real LanceDB directory with three table versions built by ``index_folder`` and
the deterministic hash embedder of the indexer tests (slow tier), copied per test."""

from __future__ import annotations

import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import pytest

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import (
    HISTORY_FILE,
    POINTER_FILE,
    STAGING_FILE,
    IndexStore,
    PointerDamaged,
    Published,
    now_iso,
)
from rag_assets_tests.lib.index.fake_index import STAMPS, STRAT, HashEmbedder, _corpus


def _versions(tmp_path: Path, n: int) -> tuple[IndexStore, list[Published]]:
    """``n`` distinct entries published in order (pointer and history only, no table)."""
    store = IndexStore(tmp_path / "idx")
    entries = [
        Published("chunks_t", v, 1, STAMPS, 0.5, "given", 10 * v, now_iso())
        for v in range(1, n + 1)
    ]
    for e in entries:
        store.publish(e)
    return store, entries


@pytest.fixture(scope="module")
def three_versions(tmp_path_factory) -> Path:
    """A real index directory with three distinct published table versions."""
    tmp = tmp_path_factory.mktemp("three")
    root = _corpus(tmp / "docs", n=3)
    emb = HashEmbedder()
    for i in range(3):
        (root / "doc0.md").write_text(f"# Document 0\n\n## Part\n\nEdition {i} of the text.\n")
        index_folder(root, tmp / "idx", STRAT, emb)
    return tmp / "idx"


def _real(three_versions: Path, tmp_path: Path) -> tuple[IndexStore, list[Published]]:
    shutil.copytree(three_versions, tmp_path / "idx")
    store = IndexStore(tmp_path / "idx")
    entries = store.history()
    assert len({e.key for e in entries}) == 3
    return store, entries


def _pointer(store: IndexStore) -> Path:
    return Path(store.uri) / POINTER_FILE


DAMAGE = {
    "truncated": lambda raw: raw[: len(raw) // 2],
    "empty": lambda raw: b"",
    "binary": lambda raw: b"\x00\xff\xfe" * 20,
    "not an object": lambda raw: b"[1, 2, 3]",
    "wrong field type": lambda raw: json.dumps({**json.loads(raw), "version": "seven"}).encode(),
    "missing field": lambda raw: json.dumps(
        {k: v for k, v in json.loads(raw).items() if k != "table"}
    ).encode(),
}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_pointer_is_named_and_recovered_from_history(tmp_path, how):
    store, (first, second) = _versions(tmp_path, 2)
    p = _pointer(store)
    p.write_bytes(DAMAGE[how](p.read_bytes()))
    with pytest.warns(RuntimeWarning, match=str(p)) as caught:
        got = store.published()
    assert got is not None and got.key == second.key  # the last valid history entry
    message = str(caught[0].message)
    assert "damaged" in message and f"rollback --index {store.uri} --to {second.key}" in message


@pytest.mark.parametrize("how", ["truncated", "empty", "binary"])
def test_damaged_pointer_without_history_is_refused_with_the_repair_command(tmp_path, how):
    store, _ = _versions(tmp_path, 1)
    (Path(store.uri) / HISTORY_FILE).unlink()
    p = _pointer(store)
    p.write_bytes(DAMAGE[how](p.read_bytes()))
    with pytest.raises(PointerDamaged) as err:
        store.published()
    text = str(err.value)
    assert str(p) in text and f"`rag-assets index --index {store.uri}`" in text
    assert "\n" not in text
    assert store.published(strict=False) is None  # what published_index publishes over


def test_publish_over_a_damaged_pointer(tmp_path):
    store, (first,) = _versions(tmp_path, 1)
    (Path(store.uri) / HISTORY_FILE).unlink()
    _pointer(store).write_text('{"table": "chunks_x", "vers')
    store.publish(first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pointer is whole again: no warning
        assert store.published() == first


def test_damaged_staging_is_named(tmp_path):
    store, _ = _versions(tmp_path, 1)
    entry = store.published()
    assert entry is not None
    store.write_staging(entry)
    (Path(store.uri) / STAGING_FILE).write_text("{")
    with pytest.raises(PointerDamaged, match=rf"{STAGING_FILE} is damaged.*rag-assets index"):
        store.staging()


def test_torn_history_line_is_skipped_and_the_next_line_stays_whole(tmp_path):
    store, (first, second) = _versions(tmp_path, 2)
    hist = Path(store.uri) / HISTORY_FILE
    with hist.open("a") as f:
        f.write('{"action": "publish", "table": "chu')  # a crash mid-append: no newline
    with pytest.warns(RuntimeWarning, match=rf"{HISTORY_FILE}: skipped 1 damaged line"):
        assert [e.key for e in store.history()] == [first.key, second.key]
    store.publish(first)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # named once per process, above
        records = store.history_records()
    assert [r.entry.key for r in records] == [first.key, second.key, first.key]
    assert [r.line for r in records] == [1, 2, 4]  # the torn line 3 did not swallow line 4


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_pointer_files_get_the_umask_mode_like_the_rest_of_the_index(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        store, (entry,) = _versions(tmp_path, 1)
        store.write_staging(entry, chunks_over_window=0)
        store.publish(entry)
    finally:
        os.umask(old)
    root = Path(store.uri)
    for name in (POINTER_FILE, STAGING_FILE, HISTORY_FILE):
        assert stat.S_IMODE((root / name).stat().st_mode) == mode, name
    assert stat.S_IMODE(store.manifest_path(entry).stat().st_mode) == mode
    assert not list(root.glob(".*.tmp"))  # no temp files left behind


@pytest.mark.slow
def test_rollback_walks_back_through_distinct_versions(three_versions, tmp_path):
    store, (v1, v2, v3) = _real(three_versions, tmp_path)
    assert [e.key for e in store.rollback_stack()] == [v1.key, v2.key, v3.key]
    assert store.rollback().key == v2.key
    assert store.published().key == v2.key
    assert store.rollback().key == v1.key  # not back to v3: two bad publishes are undone
    with pytest.raises(RuntimeError, match=f"nothing to roll back to.*only {v1.key}"):
        store.rollback()
    actions = [r.action for r in store.history_records()]
    assert actions == ["publish", "publish", "publish", "rollback", "rollback"]


@pytest.mark.slow
def test_republishing_a_version_moves_it_to_the_top_once(three_versions, tmp_path):
    store, (v1, v2, v3) = _real(three_versions, tmp_path)
    store.publish(v1)  # published again (e.g. a re-index back to identical content)
    assert [e.key for e in store.rollback_stack()] == [v2.key, v3.key, v1.key]
    assert store.rollback().key == v3.key


@pytest.mark.slow
def test_rollback_to_a_version(three_versions, tmp_path):
    """``to``: the index's own version (issue 51: 1 for the first publish, as ``status`` shows
    it; ``v2`` too) or ``TABLE@V`` (LanceDB's version of a table, as ``status --json`` shows)."""
    store, (v1, v2, v3) = _real(three_versions, tmp_path)
    assert store.rollback(to="1").key == v1.key
    assert [e.key for e in store.rollback_stack()] == [v1.key]
    assert store.rollback(to=v3.key).key == v3.key  # forward again, by TABLE@VERSION
    assert store.published().key == v3.key
    assert store.rollback(to="v2").key == v2.key
    with pytest.raises(ValueError, match="the index has no version 999"):
        store.rollback(to="999")
    with pytest.raises(ValueError, match="give the index's version"):
        store.rollback(to="latest")


@pytest.mark.slow
def test_rollback_to_a_version_that_is_gone_is_refused(three_versions, tmp_path):
    store, (_, _, v3) = _real(three_versions, tmp_path)
    ghost = Published(**{**v3.__dict__, "version": 999})
    store.publish(ghost)  # history names a table version LanceDB does not have
    store.publish(v3)
    with pytest.raises(RuntimeError, match=r"cannot roll back to .*@999: that table version"):
        store.rollback()
    assert store.published().key == v3.key  # nothing switched


@pytest.mark.slow
def test_rollback_over_a_damaged_pointer(three_versions, tmp_path):
    store, (_, v2, _) = _real(three_versions, tmp_path)
    _pointer(store).write_bytes(b"\x00")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert store.rollback().key == v2.key
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.published().key == v2.key


@pytest.mark.slow
def test_a_pointer_newer_than_the_history_is_the_top_of_the_stack(three_versions, tmp_path):
    """A crash between renaming the pointer and logging it: the pointer is the truth."""
    store, (v1, v2, v3) = _real(three_versions, tmp_path)
    hist = Path(store.uri) / HISTORY_FILE
    hist.write_text("".join(hist.read_text().splitlines(keepends=True)[:2]))  # v3's line lost
    assert [e.key for e in store.rollback_stack()] == [v1.key, v2.key, v3.key]
    assert store.rollback().key == v2.key


@pytest.mark.slow
def test_manifest_travels_with_the_table_version(three_versions, tmp_path):
    store, (_, v2, v3) = _real(three_versions, tmp_path)
    m2, m3 = store.manifest(v2), store.manifest(v3)
    assert m2 and m3 and m2["version"] == v2.version and m3["version"] == v3.version
    assert sorted(r["document_id"] for r in m3["documents"]) == ["doc0.md", "doc1.md", "doc2.md"]
    assert all(r["status"] == "ok" for r in m3["documents"])
    assert m2["documents"] != m3["documents"]  # doc0.md was edited between them
    assert "chunks_over_window" not in m3  # recorded by the graph's chunk_embeddings only
    store.write_staging(v3, chunks_over_window=3)
    assert store.manifest(v3)["chunks_over_window"] == 3
    assert store.manifest(v3)["documents"] == m3["documents"]


class _QueryHashEmbedder(HashEmbedder):
    def encode_query(self, query: str):  # type: ignore[no-untyped-def]
        return self.encode([query])[0]


@pytest.mark.slow
def test_queries_during_republishing_have_no_errors(tmp_path):
    """A reader opens the published index and queries it in a loop while four re-indexes
    publish new versions: every query succeeds against a whole version (rows = pointer rows)."""
    import threading

    from rag_assets.lib.query.retrieve import Index

    root, emb, uri = _corpus(tmp_path / "docs", n=4), _QueryHashEmbedder(), tmp_path / "idx"
    index_folder(root, uri, STRAT, emb)
    stop, errors, served = threading.Event(), [], []

    def reader() -> None:
        while not stop.is_set():
            try:
                store = IndexStore(uri)
                pub = store.published()
                hits = Index(store, pub, emb).search("topic 12", retriever="hybrid", k=5)
                rows = store.open_table(pub.table, pub.version).count_rows()
                assert hits and rows == pub.rows, (len(hits), rows, pub.rows)
                served.append(pub.version)
            except Exception as exc:  # noqa: BLE001 - counted, reported below
                errors.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(4):
            with (root / f"doc{i}.md").open("a") as f:
                f.write(f"\n\nEdit {i}: a new paragraph about topic {i}.\n")
            index_folder(root, uri, STRAT, emb)
    finally:
        stop.set()
        thread.join(timeout=60)
    print(f"{len(served)} queries, 0 errors expected, versions served {sorted(set(served))}")
    assert errors == []
    assert len(served) >= 4 and len(set(served)) >= 2
