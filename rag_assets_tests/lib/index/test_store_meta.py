# mypy: disable-error-code="union-attr,index,arg-type,call-overload"
"""The pointer, staging, history and manifests in the ``_rag_meta`` LanceDB table (issue 13),
on a local directory: an index made with the old JSON files is imported once and keeps working;
afterwards the table is the truth and the files are no longer read."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import (
    HISTORY_FILE,
    META_TABLE,
    POINTER_FILE,
    IndexStore,
    Published,
    now_iso,
)
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.lib.index.fake_index import STAMPS, STRAT, HashEmbedder, _corpus


class QueryHashEmbedder(HashEmbedder):
    def encode_query(self, query: str):  # type: ignore[no-untyped-def]
        return self.encode([query])[0]


def _old_index(tmp_path: Path) -> tuple[Path, list[Published]]:
    """A real local index written with the JSON files (what every index before issue 13 is)."""
    docs, uri = _corpus(tmp_path / "docs", n=2), tmp_path / "idx"
    emb = QueryHashEmbedder()
    entries = []
    for i in range(2):
        (docs / "doc0.md").write_text(f"# Document 0\n\n## Part\n\nEdition {i} of the text.\n")
        entries.append(index_folder(docs, uri, STRAT, emb).entry)
    IndexStore(uri).write_staging(entries[-1], chunks_over_window=2)
    return uri, entries


@pytest.mark.slow
def test_old_json_files_are_imported_once_and_keep_working(tmp_path):
    uri, (v1, v2) = _old_index(tmp_path)
    files = IndexStore(uri)
    assert files.meta == "files" and META_TABLE not in files.table_names()  # unchanged default
    want = {
        "published": files.published(),
        "stack": [e.key for e in files.rollback_stack()],
        "history": [(r.action, r.entry, r.at) for r in files.history_records()],
        "staging": files.staging(),
        "manifest": files.manifest(v2),
    }

    moved = IndexStore(uri, meta="lance")  # the first open imports the files, in one commit
    assert moved.meta == "lance" and META_TABLE in moved.table_names()
    got = {
        "published": moved.published(),
        "stack": [e.key for e in moved.rollback_stack()],
        "history": [(r.action, r.entry, r.at) for r in moved.history_records()],
        "staging": moved.staging(),
        "manifest": moved.manifest(v2),
    }
    assert got == want and got["published"] == v2 and got["manifest"]["chunks_over_window"] == 2

    # read once: the files are not consulted any more (a damaged or stale one changes nothing)
    (uri / POINTER_FILE).write_bytes(b"\x00garbage")
    (uri / HISTORY_FILE).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = IndexStore(uri)  # auto: the directory now has _rag_meta
        assert again.meta == "lance" and again.published() == v2
        assert [r.entry.key for r in again.history_records()] == [v1.key, v2.key]
    assert again.rollback().key == v1.key
    assert IndexStore(uri).published() == v1
    index = Index(again, again.published(), QueryHashEmbedder())
    assert index.search("edition", retriever="hybrid", k=3)
    assert again.publish(v2) == v2 and IndexStore(uri).rollback_stack()[-1] == v2
    assert not (uri / HISTORY_FILE).exists()  # nothing is written to the old files


def test_import_keeps_a_pointer_newer_than_the_history(tmp_path):
    """A crash between the pointer rename and the history line: the pointer is the truth, also
    after the import; torn history lines are skipped (and named) as when reading the files."""
    files = IndexStore(tmp_path / "idx")
    entries = [Published("chunks_t", v, 1, STAMPS, 0.5, "given", v, now_iso()) for v in (1, 2, 3)]
    for e in entries:
        files.publish(e)
    hist = Path(files.uri) / HISTORY_FILE
    lines = hist.read_text().splitlines(keepends=True)
    hist.write_text(lines[0] + '{"action": "publish", "tab\n' + lines[1])  # v3's line lost
    with pytest.warns(RuntimeWarning, match="skipped 1 damaged line"):
        moved = IndexStore(tmp_path / "idx", meta="lance")
    assert [e.key for e in moved.rollback_stack()] == [e.key for e in entries]
    assert moved.published() == entries[2]


def test_meta_table_rows_are_whole_commits_and_damage_is_named(tmp_path):
    store = IndexStore(tmp_path / "idx", meta="lance")
    assert store.published() is None and store.history_records() == []
    with pytest.raises(FileNotFoundError, match="nothing embedded yet"):
        store.staging()
    entries = [Published("chunks_t", v, 1, STAMPS, 0.5, "given", v, now_iso()) for v in (1, 2)]
    for e in entries:
        store.publish(e)
    # a row whose body is not a pointer (written by hand, or by a future version)
    store._append("publish", "", json.dumps({"table": "chunks_t"}))
    with pytest.warns(RuntimeWarning, match=rf"{META_TABLE}: skipped 1 damaged history row"):
        assert store.published() == entries[1]
    assert not list(Path(store.uri).glob("*.json*"))  # no pointer files at all
    with pytest.raises(ValueError, match="give 'files' or 'lance'"):
        IndexStore(tmp_path / "idx", meta="json")
