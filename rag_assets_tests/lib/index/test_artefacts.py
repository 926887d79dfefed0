"""The index's artefacts (issue 42): files in RAG_WORK_DIR for a local index, objects under
``<index>/_rag_work/`` for an object-store one; the same calls for both, read back on another
machine (another work dir), and a store that cannot be reached is one line naming the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_assets.lib.index.artefacts import ARTEFACTS_DIR, ArtefactError, Artefacts
from rag_assets.lib.ingest.sources.state import STATE_FILE, load_state, save_state, source_lines


def test_a_local_index_keeps_its_files_in_the_work_dir(tmp_path: Path) -> None:
    store = Artefacts(tmp_path / "index", tmp_path / "work")
    assert store.read("sources/state.json") is None
    where = store.write("sources/state.json", b"{}")
    assert where == str(tmp_path / "work" / "sources" / "state.json")
    store.write("sources/state.json", b'{"a": {}}')  # replaced whole, no temporary file left
    assert store.read("sources/state.json") == b'{"a": {}}'
    assert sorted(p.name for p in (tmp_path / "work" / "sources").iterdir()) == ["state.json"]
    assert not (tmp_path / "index").exists()


@pytest.mark.slow
def test_an_object_store_index_keeps_them_beside_its_tables(tmp_path: Path, s3_env) -> None:
    uri = f"s3://rag/{tmp_path.name}"
    one = Artefacts(uri, tmp_path / "machine-a")
    save_state(one, {"repo": {"kind": "git", "location": "git+file:///r", "commit": "c" * 40,
                              "last_good": "2026-12-05T00:00:00Z"}}, ["repo"])  # fmt: skip
    other = Artefacts(uri, tmp_path / "machine-b")  # another machine, nothing on its disk
    assert load_state(other)["repo"]["commit"] == "c" * 40
    assert source_lines(other) == [
        "source repo (git git+file:///r): ok, last observed 2026-12-05T00:00:00Z, "
        "commit cccccccccccc"
    ]
    assert other.location(STATE_FILE) == f"{uri}/{ARTEFACTS_DIR}/{STATE_FILE}"
    assert not (tmp_path / "machine-a").exists() and not (tmp_path / "machine-b").exists()
    assert other.read("questions/none.json") is None


def test_an_unreachable_store_is_one_line_and_the_state_reads_as_empty(tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "very-secret", "AWS_REGION": "us-east-1"}  # fmt: skip
    store = Artefacts("s3://rag/nowhere", tmp_path, env=env)
    with pytest.raises(ArtefactError) as err:
        store.write(STATE_FILE, b"{}")
    text = str(err.value)
    assert "\n" not in text and "RAG_INDEX_URI" in text and "very-secret" not in text
    assert load_state(store) == {}  # status shows no sources rather than failing
