# mypy: disable-error-code="union-attr,index,arg-type"
"""Documents outside the folder and files that change while they are read.

Real symbolic links on the real file system; the change-during-read cases modify the real file
from inside the read (a hook on the one call that reads the bytes) so the timing is exact, and
one slow case races a real writer process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore, scan
from rag_assets.lib.ingest import extract
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.ingest.extract import extract_document, extract_folder, scan_folder
from rag_assets_tests.lib.index.fake_index import HashEmbedder

SECRET = "secret-host-name-4711"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """docs/ with a real file, links of every kind, and an outside file holding a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hostname").write_text(f"{SECRET}\n")
    (outside / "dir").mkdir()
    (outside / "dir" / "more.md").write_text(f"# More\n\n{SECRET} again\n")
    docs = tmp_path / "docs"
    (docs / "notes").mkdir(parents=True)
    (docs / "notes" / "real.md").write_text("# Real\n\nA document inside the folder.\n")
    (docs / ".drafts").mkdir()
    (docs / ".drafts" / "draft.md").write_text("# Draft\n\nA hidden draft made visible.\n")
    os.symlink(outside / "hostname", docs / "hostname.txt")  # absolute, leaves
    os.symlink("../outside/hostname", docs / "relative.txt")  # relative, leaves
    os.symlink(outside / "dir", docs / "linked-dir")  # a folder outside
    os.symlink("notes", docs / "notes-again")  # a folder inside
    os.symlink(".", docs / "loop")  # a cycle
    os.symlink("notes/real.md", docs / "alias.md")  # inside, already indexed as itself
    os.symlink(".drafts/draft.md", docs / "draft.md")  # inside, followed
    os.symlink(".drafts/draft.md", docs / "other-draft.md")  # same target: followed once
    os.symlink("missing.md", docs / "broken.md")
    return docs


def test_links_leaving_the_folder_are_skipped_with_the_reason(folder: Path) -> None:
    docs = {d.document_id: d for d in extract_folder(folder).documents}
    for name in ("hostname.txt", "relative.txt", "linked-dir"):
        d = docs[name]
        assert d.status == "skipped" and not d.ok, name
        assert "symbolic link leaves the documents folder" in (d.reason or "")
        assert "outside" in (d.reason or "") and d.text == "" and d.source_hash == ""
        assert d.manifest_row()["status"] == "skipped"
    assert all(SECRET not in d.text for d in docs.values())
    assert all(not d.path.startswith(str(folder.parent / "outside")) for d in docs.values())


def test_links_inside_the_folder_are_followed_once(folder: Path) -> None:
    result = extract_folder(folder)
    docs = {d.document_id: d for d in result.documents}
    assert [d.document_id for d in result.documents] == sorted(docs)
    assert docs["notes/real.md"].ok
    assert docs["draft.md"].ok and docs["draft.md"].title == "Draft"
    assert docs["alias.md"].status == "skipped"
    assert "indexed as notes/real.md (links are followed once)" in (docs["alias.md"].reason or "")
    assert docs["other-draft.md"].status == "skipped"
    assert "indexed as draft.md" in (docs["other-draft.md"].reason or "")
    for name in ("notes-again", "loop"):  # folders are never entered through a link
        assert docs[name].status == "skipped" and "links to folders" in (docs[name].reason or "")
    assert docs["broken.md"].status == "skipped"
    assert "broken symbolic link" in (docs["broken.md"].reason or "")
    assert not any(i.startswith(("notes-again/", "loop/", "linked-dir/")) for i in docs)
    assert {d.document_id for d in result.skipped} == {
        "hostname.txt", "relative.txt", "linked-dir", "notes-again", "loop", "alias.md",
        "other-draft.md", "broken.md",
    }  # fmt: skip
    assert result.failed == []


def test_scan_never_reads_a_skipped_link(folder: Path) -> None:
    seen = scan_folder(folder)
    assert seen["hostname.txt"].startswith("skipped: symbolic link leaves")
    assert set(seen) == {d.document_id for d in extract_folder(folder).documents}


def test_a_link_swapped_after_the_walk_is_not_read(tmp_path: Path, folder: Path) -> None:
    os.symlink(folder.parent / "outside" / "hostname", tmp_path / "swap")
    (folder / "swapped.txt").write_text("harmless")
    (folder / "swapped.txt").unlink()
    os.replace(tmp_path / "swap", folder / "swapped.txt")
    d = extract_document(folder / "swapped.txt", folder)
    assert d.status == "skipped" and "leaves the documents folder" in (d.reason or "")
    assert SECRET not in d.text


def test_a_link_that_now_leaves_loses_its_rows_even_with_keep(tmp_path: Path) -> None:
    """The policy that keeps a failed document's rows must not keep a skipped link's."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\n" + "Plain text about pipelines. " * 20 + "\n")
    (docs / "hostname.txt").write_text(f"{SECRET} was a plain file here\n")
    emb, uri = HashEmbedder(), tmp_path / "idx"
    index_folder(docs, uri, strategy("E", 300), emb, failed_policy="keep")
    (docs / "hostname.txt").unlink()
    (tmp_path / "hostname").write_text(f"{SECRET}\n")
    os.symlink(tmp_path / "hostname", docs / "hostname.txt")
    built = index_folder(docs, uri, strategy("E", 300), emb, failed_policy="keep")
    store = IndexStore(uri)
    rows = scan(store.open_table(built.entry.table, built.entry.version), ["document_id", "text"])
    assert set(rows["document_id"].to_pylist()) == {"a.md"}
    assert all(SECRET not in t for t in rows["text"].to_pylist())
    assert "hostname.txt" not in store.canonical_texts(built.entry.documents_version)
    manifest = store.manifest(built.entry)
    assert manifest is not None
    row = next(r for r in manifest["documents"] if r["document_id"] == "hostname.txt")
    assert row["status"] == "skipped" and "leaves the documents folder" in row["reason"]


def _rewrite_during(path: Path, times: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Append to ``path`` (a real write, through another handle) while each of the first
    ``times`` reads of it is in progress."""
    calls: list[int] = []
    real = extract._read_all

    def read_all(fh):  # type: ignore[no-untyped-def]
        data = real(fh)
        calls.append(len(data))
        if len(calls) <= times:
            time.sleep(0.02)  # past the file system's timestamp granularity
            with open(path, "a", encoding="utf-8") as w:
                w.write(f"\nline written during read {len(calls)}\n")
        return data

    monkeypatch.setattr(extract, "_read_all", read_all)
    return calls


def test_changed_during_the_first_read_is_read_again(tmp_path, monkeypatch) -> None:
    path = tmp_path / "doc.md"
    path.write_text("# Doc\n\nThe first half.\n")
    calls = _rewrite_during(path, 1, monkeypatch)
    d = extract_document(path, tmp_path)
    assert len(calls) == 2 and d.ok
    assert d.text == path.read_text()  # the complete file, as it is after the write
    assert "line written during read 1" in d.text


def test_changed_during_every_read_fails_changed_while_reading(tmp_path, monkeypatch) -> None:
    path = tmp_path / "doc.md"
    path.write_text("# Doc\n\nThe first half.\n")
    calls = _rewrite_during(path, 99, monkeypatch)
    d = extract_document(path, tmp_path)
    assert len(calls) == 2  # one retry
    assert d.status == "failed" and (d.reason or "").startswith("changed while reading")
    assert d.text == ""
    monkeypatch.undo()
    again = extract_folder(tmp_path, {d.document_id: d})  # failed: the next run reads it again
    assert again.documents[0].ok and again.reused == []


WRITER = textwrap.dedent(
    """
    import sys, time
    with open(sys.argv[1], "a") as f:
        while True:
            f.write("appended while someone reads\\n")
            f.flush()
    """
)


@pytest.mark.slow
def test_a_file_appended_by_a_real_writer_is_not_reported_ok(tmp_path) -> None:
    path = tmp_path / "log.txt"
    path.write_text("start of a log that another process keeps writing\n" * 400_000)  # ~20 MB
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    try:
        size = path.stat().st_size
        deadline = time.monotonic() + 60
        while path.stat().st_size == size and time.monotonic() < deadline:
            time.sleep(0.05)  # until the writer is running
        for _ in range(5):  # a writer starved of CPU for a whole read may miss one: try again
            d = extract_document(path, tmp_path)
            if not d.ok:
                break
            # it was not written during that read: then the text is the file as it was
            assert path.read_text().startswith(d.text) and d.text.endswith("\n")
    finally:
        writer.kill()
        writer.wait()
    assert d.status == "failed", "a file written during its read must not be reported ok"
    assert (d.reason or "").startswith("changed while reading")
