"""An object-store prefix as a source: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
``az://container/prefix``, listed and read in place through ``obstore`` (the Python binding of
the Rust ``object_store`` crate, the engine LanceDB opens the index's own tables with).

Credentials and endpoints are the object store's own variables, read by ``object_store``
itself exactly as it reads them for the index's tables: ``AWS_ENDPOINT``, ``AWS_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ALLOW_HTTP``;
``GOOGLE_SERVICE_ACCOUNT`` (or ``GOOGLE_APPLICATION_CREDENTIALS``), ``GOOGLE_BASE_URL``;
``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY``, ``AZURE_STORAGE_USE_EMULATOR``; they never enter a
message. An object's content identity is the listing's ETag (its version id where a store has
no ETag; its size and last-modified time where it has neither): a rewrite with other bytes is
a new ETag even at the same size and second, and an unchanged object is never read again.
The ETag is stamped on the document (``etag``). An empty object is not a document: a "folder"
a console made (``kb/folder/``, an empty object) lists as one.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from rag_assets.lib.ingest.sources import (
    VIEW,
    Item,
    LimitHit,
    Listing,
    SourceError,
    digest_items,
    is_meta_key,
)
from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.models.http import scrub

_SECRET_VARS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN",
)
# what an object store's error means, first match wins (its text is a page of Rust debug output)
_CAUSES = (
    (re.compile(r"NoSuchBucket|bucket does not exist|ContainerNotFound|NoSuchContainer|"
                r"The specified container does not exist", re.I),
     "the bucket does not exist"),
    (re.compile(r"status:? 40[13]\b|InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|"
                r"ExpiredToken|InvalidToken|Forbidden|AuthenticationFailed|Unauthenticated|"
                r"PermissionDenied", re.I),
     "the object store refused the credentials or the access (HTTP 401/403)"),
    (re.compile(r"ConnectError|Connection refused|dns error|failed to lookup|"
                r"error trying to connect|kind: Connect|tcp connect", re.I),
     "the endpoint cannot be reached"),
    # the timeout limit (not "retry_timeout:", which every retried error's text names)
    (re.compile(r"timed out|TimedOut|deadline has elapsed", re.I), ""),
)  # fmt: skip
_ENDPOINT_VARS = ("AWS_ENDPOINT", "AWS_ENDPOINT_URL", "GOOGLE_BASE_URL", "AZURITE_BLOB_STORAGE_URL")
_ENV_PREFIX = {"s3": "AWS_", "gs": "GOOGLE_", "az": "AZURE_"}
#: object_store's HTTP client settings, each also read from ``<AWS_|GOOGLE_|AZURE_>NAME``
_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "proxy_url", "proxy_ca_certificate",
                "proxy_excludes", "user_agent")  # fmt: skip
_MESSAGE = re.compile(r"<Message>([^<]{1,300})</Message>|\"message\":\s*\"([^\"]{1,300})\"")
_QUERY = re.compile(r"(https?://[^\s?\"']+)\?[^\s\"']*")


class ObjectSource:
    def __init__(self, spec: SourceSpec, env: dict[str, str] | None = None):
        self.spec = spec
        self.env = dict(os.environ if env is None else env)
        parts = urlsplit(spec.location)
        self.scheme = parts.scheme.lower()
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self._store: Any = None

    def store(self) -> Any:
        if self._store is None:
            self._store = self._open()
        return self._store

    def _open(self) -> Any:
        """The store; ``object_store`` reads the object store's own variables itself (the
        same reading as for the index's tables); only the timeouts are set here."""
        from obstore.store import AzureStore, GCSStore, S3Store

        t = max(1.0, float(self.spec.limits.timeout))
        # client options given here replace those object_store reads from the variables
        # (``AWS_ALLOW_HTTP``, a proxy, …): the variables' are passed on, the timeouts added
        prefix = _ENV_PREFIX.get(self.scheme, "AZURE_")
        client = {
            name: self.env[prefix + name.upper()]
            for name in _CLIENT_KEYS
            if self.env.get(prefix + name.upper())
        }
        client |= {"timeout": f"{t:g}s", "connect_timeout": f"{t:g}s"}
        # a request that fails is retried within the timeout, not for object_store's 3 minutes
        retry = {"max_retries": 2, "retry_timeout": _dt.timedelta(seconds=t)}
        kind = {"s3": S3Store, "gs": GCSStore}.get(self.scheme, AzureStore)
        try:
            return kind(self.bucket, client_options=client, retry_config=retry)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - a bad configuration fails this source alone
            raise SourceError(self._why(exc)) from None

    def _why(self, exc: BaseException) -> str:
        """One line: the source, then the cause (never a credential, never a URL's query)."""
        text = str(exc)
        reason = next((why for pattern, why in _CAUSES if pattern.search(text)), None)
        if reason == "":
            reason = f"no answer within timeout={self.spec.limits.timeout:g}s"
        elif reason and self.scheme == "az":
            reason = reason.replace("the bucket", "the container")
        if reason is None:
            found = _MESSAGE.search(text)
            if found:
                reason = found.group(1) or found.group(2)
            else:
                lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
                reason = (lines[0] if lines else type(exc).__name__)[:300]
        reason = _QUERY.sub(r"\1?***", reason)
        reason = scrub(reason, *(self.env.get(v) for v in _SECRET_VARS), *self._userinfo())
        where = f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{where}: {' '.join(reason.split())}"

    def _userinfo(self) -> list[str]:
        """The user info of the endpoint variables (``http://user:secret@host``) and its
        parts: never shown."""
        out = []
        for var in _ENDPOINT_VARS:
            info = urlsplit(self.env.get(var, "")).netloc.rpartition("@")[0]
            out += [info, *(p for p in info.split(":") if len(p) > 2)] if info else []
        return out

    def list_items(self) -> Listing:
        import obstore

        items = []
        try:
            stream = obstore.list(self.store(), self.prefix or None, chunk_size=1000)
            metas = [m for chunk in stream for m in chunk]
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - the source did not answer
            metas = self._list_refused(exc)
        rules = []
        for meta in sorted(metas, key=lambda m: m["path"]):
            path = meta["path"]
            key = path[len(self.prefix) :].removeprefix("/") if self.prefix else path
            if int(meta["size"]) == 0 and (not key or key.endswith("/")):
                continue  # no document: a folder marker (kb/folder/), as a console makes
            if is_meta_key(key):  # issue 49: its rules apply as in a folder
                rules.append(Item(key, identity(meta), int(meta["size"])))
            if not key.strip("/"):
                continue
            etag = {"etag": (meta.get("e_tag") or "").strip('"')}
            if not _readable_key(key):  # fails alone as a document (issue 49)
                shown = _escaped_key(key)
                etag["unreadable"] = key
                items.append(Item(shown, identity(meta), int(meta["size"]), "", etag))
                continue
            if any(p.startswith(".") for p in key.split("/")):
                continue
            if int(meta["size"]) == 0:  # an empty object: nothing to index (a folder marker
                continue  # lists so through object_store, without its trailing /)
            items.append(Item(key, identity(meta), int(meta["size"]), self._url(key), etag))
        # a .ragmeta edit changes the documents' metadata: the source's state too
        state = digest_items(items, *(f"{m.key}:{m.identity}" for m in rules))
        return Listing(items, state, meta=rules)

    def _list_refused(self, exc: BaseException) -> list[Any]:
        """The listing when object_store refused it: a key it cannot hold (an empty, ``.``
        or ``..`` segment) makes it refuse the whole page, so an S3 bucket is listed again
        by :mod:`.s3_listing` (each such key then fails alone); anything else, or another
        store, fails the source."""
        why = self._why(exc)
        bad = _REFUSED_KEY.search(str(exc))
        if bad is None:
            raise (LimitHit(why) if "timeout=" in why else SourceError(why)) from None
        if self.scheme == "s3":
            from rag_assets.lib.ingest.sources.s3_listing import list_objects

            try:
                return list_objects(self.bucket, self.prefix, self.env, self.spec.limits.timeout)
            except SourceError as again:
                why = f"{why} ({again})"
        raise SourceError(
            f"{why}: the key {bad.group(1) or bad.group(2)!r} has an empty, '.' or '..' segment, "
            "which the object store client cannot list past: rename that object"
        )

    def read(self, item: Item) -> bytes:
        import obstore

        if "unreadable" in item.facts:
            raise SourceError(
                f"the key {item.facts['unreadable']!r} has an empty, '.' or '..' segment, which "
                "the object store client cannot read: rename the object"
            )
        path = f"{self.prefix}/{item.key}" if self.prefix else item.key
        limit = self.spec.limits.max_file_size
        try:
            got = obstore.get(self.store(), path)
            size = int(got.meta["size"])
            if size > limit:
                raise LimitHit(f"{size:,} bytes, over max_file_size={limit:,}: not read")
            data = bytes(got.bytes())
            etag = (got.meta.get("e_tag") or "").strip('"')
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - that object fails alone (gone since listed)
            raise SourceError(self._why(exc)) from None
        if etag:  # what was read (a rewrite since the listing is read again on the next run)
            item.facts["etag"] = etag
        return data

    def _url(self, key: str) -> str:
        """Where a citation opens the object (issue 49): the source's ``link`` template, else
        no web address (a private object's URL answers 403): the service's own view of the
        document, or where there is none ``s3://bucket/key`` (:data:`VIEW`; a presigned URL
        when ``RAG_SOURCE_PRESIGN_SECONDS`` asks, made when a citation is shown:
        :func:`presigner`). The endpoint (``AWS_ENDPOINT``, which may hold user info) is never
        part of it."""
        path = f"{self.prefix}/{key}" if self.prefix else key
        if self.spec.link:  # a URL: the key's characters percent-encoded
            fields = _Fields(key=quote(key), path=quote(path), bucket=self.bucket)
            return self.spec.link.format_map(fields)
        return f"{VIEW}{self.scheme}://{self.bucket}/{path}"


def presigner(seconds: int, env: dict[str, str] | None = None) -> Callable[[str], str | None]:
    """``sign(path)``: for a private object's :data:`VIEW` path (``view:s3://bucket/key``), a
    presigned GET URL valid ``seconds`` (``RAG_SOURCE_PRESIGN_SECONDS``, issue 49), made with
    the object store's own credentials when a citation is shown (never stored, never logged;
    the endpoint's user info removed); None for any other path or when it cannot be made."""
    stores: dict[str, Any] = {}

    def sign(path: str) -> str | None:
        import obstore

        try:
            found = view_object(path, env)
            if found is None:
                return None
            source, key = found
            if source.spec.location not in stores:
                stores[source.spec.location] = source.store()
            url = obstore.sign(stores[source.spec.location], "GET", key,
                               _dt.timedelta(seconds=seconds))  # fmt: skip
        except Exception:  # noqa: BLE001 - not signed: the citation shows s3://bucket/key
            return None
        parts = urlsplit(str(url))
        return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))

    return sign


def view_object(path: str, env: dict[str, str] | None = None) -> tuple[ObjectSource, str] | None:
    """(the bucket's source, the key) of a private object's :data:`VIEW` path
    (``view:s3://bucket/key``), or None for any other path."""
    scheme, sep, rest = path.removeprefix(VIEW).partition("://")
    if not path.startswith(VIEW) or not sep or scheme not in _ENV_PREFIX:
        return None
    bucket, _, key = rest.partition("/")
    return ObjectSource(SourceSpec("view", f"{scheme}://{bucket}", "objects"), env), key


_REFUSED_KEY = re.compile(r'Error parsing Path "([^"]*)"|Path "([^"]*)" contained empty path')
_BAD_SEGMENTS = {"": "%2F", ".": "%2E", "..": "%2E%2E"}


def _readable_key(key: str) -> bool:
    """Whether object_store can hold the key (no empty, ``.`` or ``..`` segment)."""
    return all(p not in _BAD_SEGMENTS for p in key.split("/"))


def _escaped_key(key: str) -> str:
    """A key object_store cannot hold as a document key every part of the index can: its bad
    segments percent-encoded (``a/../b.md`` is ``a/%2E%2E/b.md``, ``a//b.md`` ``a/%2F/b.md``)."""
    return "/".join(_BAD_SEGMENTS.get(p, p) for p in key.split("/"))


def identity(meta: Any) -> str:
    """An object's content identity from its listing: the ETag; else its version id; else
    its size and last-modified time (a store that gives neither)."""
    etag = (meta.get("e_tag") or "").strip('"')
    if etag:
        return f"etag:{etag}"
    if meta.get("version"):
        return f"version:{meta['version']}"
    modified = meta.get("last_modified")
    stamp = modified.isoformat() if hasattr(modified, "isoformat") else str(modified)
    return f"object:{meta['size']}:{stamp}"


class _Fields(dict[str, str]):
    """A template's fields; an unknown one (``{line}``) stays for the citation to fill."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
