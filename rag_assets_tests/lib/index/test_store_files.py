"""The graph's files beside the tables (issue 23, ``store/files.py``): the same behaviour as
files under a local index directory and as ``_rag_files`` rows on a real S3 server (moto,
authentication on): write, overwrite, read back, delete, a folder replaced whole in one commit,
names that would leave the index refused, and ``prune_files`` keeping what reads see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag_assets.lib.index.store import FILES_TABLE, IndexStore


@pytest.fixture(params=["local", "s3"])
def store(request: Any, tmp_path: Path) -> IndexStore:
    if request.param == "local":
        return IndexStore(tmp_path / "index")
    request.getfixturevalue("s3_env")
    return IndexStore(f"s3://rag/{tmp_path.name}")


def test_write_overwrite_read_and_delete(store: IndexStore) -> None:
    assert store.read_file("evaluation/t@1.json") is None
    store.write_file("evaluation/t@1.json", '{"a": 1}')
    store.write_file("evaluation/t@1.json", '{"a": 2}')
    store.write_file("evaluation/t@1.distances.png", b"\x89PNG\x00\xff")
    assert store.read_text("evaluation/t@1.json") == '{"a": 2}'
    assert store.read_file("evaluation/t@1.distances.png") == b"\x89PNG\x00\xff"
    assert store.file_names("evaluation") == [
        "evaluation/t@1.distances.png",
        "evaluation/t@1.json",
    ]
    store.delete_file("evaluation/t@1.json")
    assert store.read_file("evaluation/t@1.json") is None
    assert store.file_names("evaluation") == ["evaluation/t@1.distances.png"]
    if store.remote:
        assert FILES_TABLE in store.table_names()
        assert store.file_location("evaluation/x").endswith("/_rag_files[evaluation/x]")
    else:
        assert (Path(store.uri) / "evaluation" / "t@1.distances.png").is_file()
        assert FILES_TABLE not in store.table_names()  # a local index keeps plain files


def test_a_folder_is_replaced_whole(store: IndexStore, tmp_path: Path) -> None:
    one = tmp_path / "one"
    (one / "lance").mkdir(parents=True)
    (one / "views.json").write_text("1")
    (one / "lance" / "data").write_bytes(b"old")
    store.write_tree("views/t@3", one)
    two = tmp_path / "two"
    two.mkdir()
    (two / "views.json").write_text("2")
    store.write_tree("views/t@3", two)
    assert store.file_names("views/t@3") == ["views/t@3/views.json"]  # lance/data is gone
    out = tmp_path / "out"
    assert store.read_tree("views/t@3", out)
    assert sorted(p.name for p in out.rglob("*")) == ["views.json"]
    assert (out / "views.json").read_text() == "2"
    assert not store.read_tree("views/t@4", tmp_path / "none")
    assert not store.read_tree("views/t@", tmp_path / "none")  # a prefix is a whole folder


def test_names_leaving_the_index_are_refused(store: IndexStore) -> None:
    for bad in ("../escape.json", "evaluation/../../x", "", "/"):
        with pytest.raises(ValueError, match="not a file name inside the index"):
            store.write_file(bad, "x")


def test_prune_keeps_what_reads_see(store: IndexStore) -> None:
    store.write_files({"a/x": "1", "a/y": "1", "a/z": "1"})
    store.write_files({"a/x": "2", "a/y": None})
    seen = {n: store.read_file(n) for n in store.file_names("a")}
    removed = store.prune_files()
    assert (
        {n: store.read_file(n) for n in store.file_names("a")}
        == seen
        == {
            "a/x": b"2",
            "a/z": b"1",
        }
    )
    if store.remote:
        assert removed == 3  # x's first copy, y's copy and y's deletion
        assert store.open_table(FILES_TABLE).count_rows() == 2
    else:
        assert removed == 0


def test_the_uri_shown_in_tags_and_metadata_carries_no_credentials() -> None:
    from rag_assets.lib.index.store import shown_uri

    assert (
        shown_uri("s3://AKIAEXAMPLE:s3cr3t@bucket/rag?token=abc") == "s3://***@bucket/rag?token=***"
    )
    assert shown_uri("s3://bucket/rag") == "s3://bucket/rag"
    assert shown_uri("/srv/index") == "/srv/index"
