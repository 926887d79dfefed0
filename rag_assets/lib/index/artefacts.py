"""Where the graph's intermediate data lives between runs (issue 42): the extracted documents,
the chunks of a pipeline version and the backfill's batch plan; also the sources' state
(``sources/state.json``, issue 41) and doc2query's questions (``questions/…``, issue 15).

- A local index (a directory): under ``RAG_WORK_DIR``, the files as they always were
  (``extracted/documents.parquet`` with ``extracted/manifest.json``, ``chunks/<pipeline>.parquet``,
  ``backfill/<pipeline>.json``).
- An object-store index (``s3://bucket/prefix``, ``gs://``, ``az://``): the same names under
  ``<index>/_rag_work/`` in the bucket, written and read through pyarrow's file system for the
  URI, so a run on one machine reads what a run on another wrote and nothing between runs is on
  a worker's disk. Each file is one object, written whole (one PUT or a completed multipart
  upload): a reader sees the old object or the new one. LanceDB lists only ``*.lance`` folders
  as tables, so ``_rag_work`` sits beside them unseen.

The Dagster graph reaches these through its IO manager (``rag_assets/defs/artefacts.py``).
Credentials and the endpoint are the object store's own variables, the ones LanceDB reads for
the tables (``AWS_ENDPOINT``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``; ``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY``; Google's default credentials).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rag_assets.lib.index.store.remote import SETTINGS, shown_uri
from rag_assets.lib.index.store.schema import is_remote, join_uri

if TYPE_CHECKING:
    import pyarrow as pa

    from rag_assets.lib.index.backfill import Batch
    from rag_assets.lib.types import Chunk, ExtractedDocument

ARTEFACTS_DIR = "_rag_work"
"""The folder under an object-store index's prefix that holds the artefacts."""


def plan_file(pipeline: str) -> str:
    """The batch plan made from the chunks of ``pipeline``, beside them."""
    return "backfill/" + Path(_pipeline().chunks_file(pipeline)).with_suffix(".json").name


class ArtefactError(OSError):
    """An artefact could not be written or read; the message is one line."""


class Artefacts:
    """The artefacts of one index: ``work_dir`` for a local index, the bucket for a remote one.
    ``env`` holds the object store's variables (default: the process environment, which is
    also where LanceDB reads them)."""

    def __init__(
        self, index_uri: str | Path, work_dir: str | Path, env: Mapping[str, str] | None = None
    ):
        self.index_uri = str(index_uri)
        self.work_dir = Path(work_dir)
        self.remote = is_remote(self.index_uri)
        self.root = join_uri(self.index_uri, ARTEFACTS_DIR) if self.remote else str(work_dir)
        self._env = env
        self._fs: Any = None

    # -- the three artefacts -------------------------------------------------------------------
    def save_documents(self, docs: Sequence[ExtractedDocument]) -> str:
        """Write the extracted documents (and their manifest); returns where, for metadata."""
        p = _pipeline()
        if not self.remote:
            return str(p.save_documents(self.work_dir, docs))
        self._put(p.MANIFEST_FILE, p.manifest_text(docs).encode())
        return self._put(p.DOCUMENTS_FILE, _parquet_bytes(p.documents_table(docs)))

    def documents(self) -> list[ExtractedDocument]:
        """The extracted documents; none when nothing was extracted yet."""
        p = _pipeline()
        if not self.remote:
            return p.load_documents(self.work_dir)
        data = self._get(p.DOCUMENTS_FILE)
        return [] if data is None else p.documents_from_table(_parquet_table(data))

    def save_chunks(self, pipeline: str, chunks: Sequence[Chunk]) -> str:
        p = _pipeline()
        if not self.remote:
            return str(p.save_chunks(self.work_dir, pipeline, chunks))
        return self._put(p.chunks_file(pipeline), _parquet_bytes(p.chunks_table(chunks)))

    def chunks(self, pipeline: str) -> list[Chunk]:
        """The chunks of ``pipeline``; FileNotFoundError naming the asset when there are none."""
        p = _pipeline()
        if not self.remote:
            return p.load_chunks(self.work_dir, pipeline)
        data = self._get(p.chunks_file(pipeline))
        if data is None:
            raise FileNotFoundError(
                f"no chunks for pipeline {pipeline} at {self.location(p.chunks_file(pipeline))}: "
                "materialise chunks"
            )
        return p.chunks_from_table(_parquet_table(data))

    def save_plan(self, pipeline: str, batches: Sequence[Batch]) -> str:
        text = json.dumps({"batches": [b.as_dict() for b in batches]}, indent=1)
        return self.write(plan_file(pipeline), text.encode())

    def plan(self, pipeline: str) -> list[Batch] | None:
        """The batch plan of ``pipeline``, None when none was made."""
        data = self.read(plan_file(pipeline))
        if data is None:
            return None
        batches = json.loads(data.decode("utf-8"))["batches"]
        from rag_assets.lib.index.backfill import Batch

        return [Batch(b["key"], tuple(b["document_ids"]), int(b["rows"])) for b in batches]

    # -- any other file (the sources' state, doc2query's questions) ------------------------------
    def write(self, name: str, data: bytes) -> str:
        """Write ``data`` as the artefact ``name`` (a relative path), whole: a reader sees the old
        file or the new one. Returns where, for metadata."""
        if self.remote:
            return self._put(name, data)
        path = self.work_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return str(path)

    def read(self, name: str) -> bytes | None:
        """The artefact ``name``, None when there is none."""
        if self.remote:
            return self._get(name)
        try:
            return (self.work_dir / name).read_bytes()
        except FileNotFoundError:
            return None

    def location(self, name: str) -> str:
        """Where the artefact ``name`` is, as metadata and messages may show it."""
        if self.remote:
            return shown_uri(join_uri(self.root, name))
        return str(self.work_dir / name)

    # -- the object store ----------------------------------------------------------------------
    def _path(self, name: str) -> str:
        parts = urlsplit(self.root)
        return f"{parts.netloc}/{parts.path.strip('/')}/{name}"

    def _put(self, name: str, data: bytes) -> str:
        try:
            with self.fs().open_output_stream(self._path(name)) as out:
                out.write(data)
        except Exception as exc:  # noqa: BLE001 - one line naming the settings
            raise self._error("write", name, exc) from None
        return self.location(name)

    def _get(self, name: str) -> bytes | None:
        import pyarrow.fs as pafs

        try:
            fs = self.fs()
            if fs.get_file_info(self._path(name)).type == pafs.FileType.NotFound:
                return None
            with fs.open_input_stream(self._path(name)) as fh:
                return bytes(fh.read())
        except Exception as exc:  # noqa: BLE001 - one line naming the settings
            raise self._error("read", name, exc) from None

    def _error(self, verb: str, name: str, exc: BaseException) -> ArtefactError:
        scheme = urlsplit(self.root).scheme.lower()
        env = self._environ()
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        for var in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY"):
            if env.get(var):
                text = text.replace(env[var], "***")
        return ArtefactError(
            f"cannot {verb} {self.location(name)}: {text}; check RAG_INDEX_URI and "
            f"{SETTINGS.get(scheme, 'the object store settings')}"
        )

    def _environ(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def fs(self) -> Any:
        """pyarrow's file system for the index URI's scheme (opened once)."""
        if self._fs is None:
            self._fs = _open_fs(urlsplit(self.root).scheme.lower(), self._environ())
        return self._fs


def _open_fs(scheme: str, env: Mapping[str, str]) -> Any:
    import pyarrow.fs as pafs

    if scheme == "s3":
        endpoint = env.get("AWS_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or ""
        scheme, _, host = endpoint.rpartition("://")
        if not scheme:  # a bare host:port: plain HTTP only when allowed, as for LanceDB
            http = env.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes")
            scheme = "http" if http else "https"
        return pafs.S3FileSystem(
            access_key=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            endpoint_override=host.rstrip("/") or None,
            scheme=scheme,
        )
    if scheme in ("gs", "gcs"):
        return pafs.GcsFileSystem()
    if scheme in ("az", "abfs", "abfss"):
        return pafs.AzureFileSystem(
            account_name=env.get("AZURE_STORAGE_ACCOUNT_NAME", ""),
            account_key=env.get("AZURE_STORAGE_ACCOUNT_KEY") or None,
        )
    raise ArtefactError(
        f"RAG_INDEX_URI: no file system for {scheme}:// here (s3://, gs:// and az:// are)"
    )


def _pipeline() -> Any:
    """The pipeline module (its file names and table codecs), imported when first needed: it
    brings the encoders' runtime, which ``status`` reading the sources' state does not need."""
    from rag_assets.lib.index import pipeline

    return pipeline


def _parquet_bytes(table: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _parquet_table(data: bytes) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_table(pa.BufferReader(data))
