"""A local folder as a source: the files ``--documents DIR`` has always read (the same walk:
links followed once, hidden files and FIFOs left out), each identified by its sha256."""

from __future__ import annotations

from pathlib import Path

from rag_assets.lib.ingest.extract import _file_sha256, _read_stable, _walk
from rag_assets.lib.ingest.metadata import read_rules
from rag_assets.lib.ingest.sources import Item, Listing, SourceError, digest_items
from rag_assets.lib.ingest.sources.config import SourceSpec


class FolderSource:
    def __init__(self, spec: SourceSpec):
        self.spec = spec
        self.root = Path(spec.location.removeprefix("file://")).expanduser()

    def list_items(self) -> Listing:
        if not self.root.is_dir():  # unmounted, moved: the source did not answer
            raise SourceError(f"folder not found: {self.root}")
        files, _ = _walk(self.root)  # its .ragignore applies, as for --documents DIR
        items = []
        for key, path in files:
            try:
                sha = _file_sha256(path)
            except OSError as exc:  # that file fails alone when read
                sha = f"unreadable: {exc.strerror or type(exc).__name__}"
            items.append(Item(key, f"sha256:{sha}", _size(path), str(path.resolve())))
        # a .ragmeta edit changes the documents' metadata: the source's state too (issue 34)
        meta = [f"{name}:{sha}" for name, sha in sorted(read_rules(self.root).digests.items())]
        return Listing(items, digest_items(items, *meta))

    def read(self, item: Item) -> bytes:
        try:
            return _read_stable(Path(item.url))
        except OSError as exc:
            raise SourceError(f"cannot read {item.key}: {exc.strerror or exc}") from None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
