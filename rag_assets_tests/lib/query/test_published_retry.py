"""Issue 25 case 8 on a real index with the real model: a published version the service could
not open (its BM25 files missing) is retried on the next request, never left behind once its
files are back, and ``last_error`` clears when the pointer names what is served."""

from __future__ import annotations

import shutil
from pathlib import Path

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore, bm25_dir
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.retrieve import PublishedIndex


def test_a_failed_open_is_retried_and_stale_errors_clear(tmp_path: Path, real_embedder):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Rollback\n\nUse rag-assets rollback to go back a version.\n")
    index = tmp_path / "index"
    first = index_folder(docs, index, strategy("E"), real_embedder).entry
    (docs / "b.md").write_text("# Compact\n\nrag-assets compact removes old versions.\n")
    second = index_folder(docs, index, strategy("E"), real_embedder).entry
    assert second.version != first.version
    store = IndexStore(index)
    store.rollback(first.key)  # serve the first version
    holder = PublishedIndex(index, embedder=real_embedder)
    assert holder.current().published.version == first.version

    files = bm25_dir(index, second.table, second.version)
    aside = tmp_path / "aside"
    shutil.move(files, aside)  # the second version cannot be opened now
    store.publish(second)
    assert holder.current().published.version == first.version  # still answering
    assert holder.last_error and f"v{second.version}" in holder.last_error

    shutil.move(aside, files)  # its files are back: the next request opens it
    assert holder.current().published.version == second.version
    assert holder.last_error is None

    shutil.move(files, aside)
    store.publish(first)  # pointer back at the first; then at a broken second again
    assert holder.current().published.version == first.version
    store.publish(second)
    holder.current()
    assert holder.last_error
    store.rollback(first.key)  # the pointer repaired to what is held: the error clears
    assert holder.current().published.version == first.version
    assert holder.last_error is None
