"""An object-store prefix as a source: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
``az://container/prefix``, listed and read in place through pyarrow's file systems.

Credentials and endpoints come from the object store's own variables, the ones the index's
LanceDB tables use (``AWS_ENDPOINT``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``; ``GOOGLE_APPLICATION_CREDENTIALS``;
``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY``); they never enter a message. An object's content
identity is what the listing returns: its size and last-modified time (a rewrite is a new
identity); the ETag read with the bytes is stamped on the document (``etag``).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import quote, urlsplit

from rag_assets.lib.ingest.sources import Item, LimitHit, Listing, SourceError, digest_items
from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.models.http import scrub

_REQUEST_ID = re.compile(r"\s*\(Request ID:[^)]*\)")
_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY")


class ObjectSource:
    def __init__(self, spec: SourceSpec, env: dict[str, str] | None = None):
        self.spec = spec
        self.env = dict(os.environ if env is None else env)
        parts = urlsplit(spec.location)
        self.scheme = parts.scheme.lower()
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self._fs: Any = None

    def fs(self) -> Any:
        if self._fs is None:
            self._fs = self._open()
        return self._fs

    def _open(self) -> Any:
        import pyarrow.fs as pafs

        t = self.spec.limits.timeout
        env = self.env
        try:
            if self.scheme == "s3":
                endpoint = env.get("AWS_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or None
                return pafs.S3FileSystem(
                    access_key=env.get("AWS_ACCESS_KEY_ID") or None,
                    secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
                    session_token=env.get("AWS_SESSION_TOKEN") or None,
                    region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
                    endpoint_override=endpoint,
                    connect_timeout=t,
                    request_timeout=t,
                )
            if self.scheme == "gs":
                return pafs.GcsFileSystem(retry_time_limit=pafs_seconds(t))
            return pafs.AzureFileSystem(
                account_name=env.get("AZURE_STORAGE_ACCOUNT_NAME", ""),
                account_key=env.get("AZURE_STORAGE_ACCOUNT_KEY") or None,
            )
        except Exception as exc:  # noqa: BLE001 - a bad configuration fails this source alone
            raise SourceError(self._why(exc)) from None

    def _why(self, exc: BaseException) -> str:
        text = _REQUEST_ID.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        text = scrub(text or type(exc).__name__, *(self.env.get(v) for v in _SECRET_VARS))
        return f"{self.scheme}://{self.bucket}/{self.prefix}: {text}"

    def list_items(self) -> Listing:
        import pyarrow.fs as pafs

        base = f"{self.bucket}/{self.prefix}".rstrip("/")
        try:
            infos = self.fs().get_file_info(pafs.FileSelector(base, recursive=True))
        except Exception as exc:  # noqa: BLE001 - the source did not answer
            raise SourceError(self._why(exc)) from None
        items = []
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File:
                continue
            key = info.path[len(base) :].lstrip("/")
            if not key or any(p.startswith(".") for p in key.split("/")):
                continue
            identity = f"object:{info.size}:{info.mtime_ns}"
            items.append(Item(key, identity, info.size, self._url(key)))
        return Listing(items, digest_items(items))

    def read(self, item: Item) -> bytes:
        path = (
            f"{self.bucket}/{self.prefix}/{item.key}"
            if self.prefix
            else f"{self.bucket}/{item.key}"
        )
        limit = self.spec.limits.max_file_size
        try:
            with self.fs().open_input_stream(path) as fh:
                meta = fh.metadata() or {}
                data = fh.read(limit + 1)
        except Exception as exc:  # noqa: BLE001 - that object fails alone
            raise SourceError(self._why(exc)) from None
        if len(data) > limit:
            raise LimitHit(f"over max_file_size={limit:,} bytes: not read")
        etag = meta.get("ETag") or meta.get("etag") or b""
        item.facts["etag"] = etag.decode("ascii", "replace").strip('"') if etag else ""
        return bytes(data)

    def _url(self, key: str) -> str:
        """Where a citation opens the object: the source's ``link`` template, else the
        store's HTTPS URL (``AWS_ENDPOINT``'s path-style URL when one is set)."""
        path = f"{self.prefix}/{key}" if self.prefix else key
        if self.spec.link:
            return self.spec.link.format_map(_Fields(key=key, path=path, bucket=self.bucket))
        q = quote(path)
        if self.scheme == "s3":
            endpoint = self.env.get("AWS_ENDPOINT") or self.env.get("AWS_ENDPOINT_URL")
            if endpoint:
                return f"{endpoint.rstrip('/')}/{self.bucket}/{q}"
            return f"https://{self.bucket}.s3.amazonaws.com/{q}"
        if self.scheme == "gs":
            return f"https://storage.googleapis.com/{self.bucket}/{q}"
        account = self.env.get("AZURE_STORAGE_ACCOUNT_NAME", "account")
        return f"https://{account}.blob.core.windows.net/{self.bucket}/{q}"


def pafs_seconds(t: float) -> float:
    return max(1.0, float(t))


class _Fields(dict[str, str]):
    """A template's fields; an unknown one (``{line}``) stays for the citation to fill."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
