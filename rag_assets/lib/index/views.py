"""Generated views of chunks (doc2query questions), stored beside one chunk table version.

Layout: ``<index>/views/<table>@<version>/`` holds

- ``lance/views.lance``: one row per view: ``chunk_id`` (the chunk it points to), ``view`` (the
  header line + generated question), ``view_hash``, ``vector`` (document-side embedding);
- ``bm25/``: a BM25 index whose documents are the chunks themselves, each chunk's text with its
  generated questions appended (doc2query as Nogueira et al. 2019 index it: one document per
  chunk, so BM25's length normalisation does not favour short question-only documents);
- ``views.json``: the expansion stamp (model, prompt hash, n), the chunk table stamps, counts
  and a digest of the content; a directory whose digest differs from what would be written is
  rebuilt (written to a temporary directory, then renamed into place).

At query time a dense hit on a view is the chunk it points to, at the view's distance; a chunk
found through several views (or its own vector) keeps its best distance (max-pooling of cosine
similarity), ties by chunk id. Hits always quote the chunk's ``content``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa

from rag_assets.lib.index.embed import Embedder
from rag_assets.lib.index.lexical import BM25Index
from rag_assets.lib.index.store import vectors as vector_matrix
from rag_assets.lib.index.store.records import replace_dir
from rag_assets.lib.types import sha256_text

VIEWS_FORMAT = 1
_META = "views.json"


def views_dir(uri: str | Path, table: str, version: int) -> Path:
    """Where the views of one chunk table version live."""
    return Path(uri) / "views" / f"{table}@{version}"


def expanded_bm25_text(text: str, questions: Sequence[str]) -> str:
    """A chunk's BM25 document under expansion: its text, then its questions, one a line."""
    return "\n".join([text, *questions]) if questions else text


@dataclass
class Views:
    """The views of one table version, loaded for querying."""

    chunk_ids: list[str]  # per view: the chunk it points to
    texts: list[str]
    vectors: np.ndarray  # (views, dims), L2-normalised
    bm25: BM25Index  # ids = chunk ids, texts = chunk text + questions
    meta: dict[str, Any]

    def dense(
        self, qvec: np.ndarray, k: int, mask: np.ndarray | None = None
    ) -> list[tuple[str, float]]:
        """Best ``k`` chunks by their best view's cosine distance, ties by chunk id; with
        ``mask`` (bool per view, issue 34) only those views."""
        if not len(self.chunk_ids):
            return []
        dist = 1.0 - self.vectors @ qvec.astype(np.float32)
        best: dict[str, float] = {}
        allowed = [True] * len(self.chunk_ids) if mask is None else mask.tolist()
        for cid, d, ok in zip(self.chunk_ids, dist.tolist(), allowed, strict=True):
            if ok and d < best.get(cid, np.inf):
                best[cid] = float(d)
        return sorted(best.items(), key=lambda x: (x[1], x[0]))[:k]


def pool_dense(*lists: Sequence[tuple[str, float]], k: int) -> list[tuple[str, float]]:
    """Merge ``(chunk_id, distance)`` lists keeping each chunk's smallest distance; best ``k``."""
    best: dict[str, float] = {}
    for pairs in lists:
        for cid, d in pairs:
            if d < best.get(cid, np.inf):
                best[cid] = d
    return sorted(best.items(), key=lambda x: (x[1], x[0]))[:k]


def write_views(
    uri: str | Path,
    table: str,
    version: int,
    chunk_texts: Sequence[tuple[str, str]],
    views: Sequence[tuple[str, str]],
    questions: dict[str, list[str]],
    embedder: Embedder,
    stamps: dict[str, Any],
    expansion: dict[str, Any],
) -> dict[str, Any]:
    """Write (or keep, when identical) the views directory of ``table@version``.

    ``chunk_texts``: (chunk_id, text) of every row of the table version; ``views``: (chunk_id,
    view text) from :func:`rag_assets.lib.index.expand.view_rows`. View vectors are reused from
    earlier versions of the same table where the view text is the same. Returns the metadata.
    """
    out = views_dir(uri, table, version)
    content = digest_of(chunk_texts, views, stamps, expansion)
    old_meta = read_meta(out)
    if old_meta is not None and old_meta.get("digest") == content:
        return {**old_meta, "embedded": 0, "reused": len(views)}
    hashes = [sha256_text(v) for _, v in views]
    known = _previous_vectors(uri, table, set(hashes), embedder.dims)
    todo = sorted({h: v for h, (_, v) in zip(hashes, views, strict=True) if h not in known}.items())
    if todo:
        fresh = embedder.encode([t for _, t in todo])
        for (h, _), vec in zip(todo, fresh, strict=True):
            known[h] = vec
    mat = (
        np.stack([known[h] for h in hashes]).astype(np.float32)
        if hashes
        else np.zeros((0, embedder.dims), np.float32)
    )
    meta = {
        "format": VIEWS_FORMAT,
        "table": table,
        "version": version,
        "stamps": stamps,
        "expansion": expansion,
        "views": len(views),
        "chunks_with_views": len({c for c, _ in views}),
        "digest": content,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        db = lancedb.connect(str(tmp / "lance"))
        data = pa.table(
            {
                "chunk_id": pa.array([c for c, _ in views], pa.string()),
                "view": pa.array([v for _, v in views], pa.string()),
                "view_hash": pa.array(hashes, pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(
                    pa.array(mat.reshape(-1), type=pa.float32()), embedder.dims
                ),
            }
        )
        db.create_table("views", data=data)
        BM25Index.build(
            [c for c, _ in chunk_texts],
            [expanded_bm25_text(t, questions.get(c, [])) for c, t in chunk_texts],
            stamps={**stamps, "table": table, "version": version, **expansion},
        ).save(tmp / "bm25")
        with open(tmp / _META, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**meta, "embedded": len(todo), "reused": len(views) - len(todo)}


def digest_of(
    chunk_texts: Sequence[tuple[str, str]],
    views: Sequence[tuple[str, str]],
    stamps: dict[str, Any],
    expansion: dict[str, Any],
) -> str:
    blob = json.dumps(
        [VIEWS_FORMAT, stamps, expansion, sorted(chunk_texts), list(views)],
        sort_keys=True,
        default=str,
    )
    return sha256_text(blob)[:24]


def read_meta(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / _META
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def load_views(store: Any, table: str, version: int, dims: int) -> Views | None:
    """The views of ``table@version`` (``store``: an index store, or a local index path), or
    None when that version was not expanded. On object storage the rows are copied into a
    local folder that lives as long as the process."""
    if isinstance(store, (str, Path)):
        directory = views_dir(store, table, version)
    elif not store.remote:
        directory = views_dir(store.uri, table, version)
    else:
        name = _views_name(table, version)
        if store.read_file(f"{name}/{_META}") is None:
            return None
        directory = Path(_scratch_root()) / name
        store.read_tree(name, directory)
    meta = read_meta(directory)
    if meta is None:
        return None
    tbl = lancedb.connect(str(directory / "lance")).open_table("views")
    rows = tbl.to_arrow()
    bm25 = BM25Index.load(
        directory / "bm25",
        expect_stamps={**meta["stamps"], "table": table, "version": version, **meta["expansion"]},
    )
    return Views(
        chunk_ids=rows["chunk_id"].to_pylist(),
        texts=rows["view"].to_pylist(),
        vectors=vector_matrix(rows["vector"], dims),
        bm25=bm25,
        meta=meta,
    )


_SCRATCH: list[str] = []


def _scratch_root() -> str:
    """One temporary folder per process for object-store views, removed at exit."""
    if not _SCRATCH:
        import atexit

        _SCRATCH.append(tempfile.mkdtemp(prefix="rag-views-"))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]


def _previous_vectors(
    uri: str | Path, table: str, wanted: set[str], dims: int
) -> dict[str, np.ndarray]:
    """View vectors of earlier versions of ``table`` whose view hash is wanted."""
    root = Path(uri) / "views"
    known: dict[str, np.ndarray] = {}
    if not root.is_dir() or not wanted:
        return known
    for d in sorted(root.glob(f"{table}@*"), reverse=True):
        try:
            rows = lancedb.connect(str(d / "lance")).open_table("views").to_arrow()
        except Exception:  # noqa: BLE001 - an unreadable old version just gives no vectors
            continue
        mat = vector_matrix(rows["vector"], dims)
        for h, v in zip(rows["view_hash"].to_pylist(), mat, strict=True):
            if h in wanted and h not in known:
                known[h] = v
        if len(known) == len(wanted):
            break
    return known


def write_views_for(
    store: Any,
    table: str,
    version: int,
    stamps: dict[str, Any],
    chunks: Sequence[Any],
    questions: dict[str, list[str]],
    embedder: Embedder,
    expansion: dict[str, Any],
) -> dict[str, Any]:
    """:func:`write_views` for a table version just written by ``embed_chunks``: its rows'
    texts are read back from LanceDB; ``chunks`` give the header each view carries."""
    from rag_assets.lib.index.expand import view_rows
    from rag_assets.lib.index.store import scan

    rows = scan(store.open_table(table, version), ["chunk_id", "text"])
    chunk_texts = list(zip(rows["chunk_id"].to_pylist(), rows["text"].to_pylist(), strict=True))
    stored = {c for c, _ in chunk_texts}
    views = [(c, v) for c, v in view_rows(chunks, questions) if c in stored]
    args = (table, version, chunk_texts, views, questions, embedder, stamps, expansion)
    if not store.remote:
        return write_views(store.uri, *args)
    # object storage (issue 23): built in a scratch folder beside this version's and the
    # newest earlier version's views (vectors reused), then sent as _rag_files rows, one commit
    with tempfile.TemporaryDirectory(prefix="rag-views-") as scratch:
        name = _views_name(table, version)
        earlier = _view_versions(store, table, before=version)
        for prefix in [name, *earlier[:1]]:
            store.read_tree(prefix, Path(scratch) / prefix)
        before = read_meta(Path(scratch) / name)
        meta = write_views(scratch, *args)
        if before is None or before.get("digest") != meta.get("digest"):  # else: kept as is
            store.write_tree(name, Path(scratch) / name)
        return meta


def _views_name(table: str, version: int) -> str:
    """The store folder of one version's views (``views/<table>@<version>``)."""
    return f"views/{table}@{version}"


def _view_versions(store: Any, table: str, before: int) -> list[str]:
    """Store folders of ``table``'s views below version ``before``, newest first."""
    found: set[int] = set()
    for n in store.file_names("views"):
        head = n.split("/")[1] if n.count("/") >= 2 else ""
        t, _, v = head.rpartition("@")
        if t == table and v.isdigit() and int(v) < before:
            found.add(int(v))
    return [_views_name(table, v) for v in sorted(found, reverse=True)]
