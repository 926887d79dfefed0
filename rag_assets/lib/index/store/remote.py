"""Why an object-store index cannot be opened, in one line (issue 23's bad input).

LanceDB's errors for a missing bucket, refused credentials or an unreachable endpoint are a
page of Rust debug output. :func:`object_store_error` reads the cause out of it and names the
URI (any user info redacted), the endpoint it tried and the settings that fix it: the index URI
and the object store's own environment variables, which LanceDB reads (credentials are never
part of the message)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from rag_assets.lib.models.llm import redact

SETTINGS = {
    "s3": "AWS_ENDPOINT, AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "gs": "GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS",
    "az": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
}
"""The object store's own variables, per URI scheme, that an error line points at."""


def shown_uri(uri: str) -> str:
    """The index URI as run tags, metadata and logs may show it: user info and query values of
    an object-store URI redacted (a local path as it is)."""
    return redact(uri) if "://" in uri and not uri.startswith("file://") else uri


class ObjectStoreError(OSError):
    """An object-store index could not be reached or read; the message is one line."""


_CAUSES = (
    (re.compile(r"NoSuchBucket|bucket does not exist", re.I), "the bucket does not exist"),
    (
        re.compile(
            r"status: 40[13]\b|InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|"
            r"ExpiredToken|InvalidToken|Forbidden",
            re.I,
        ),
        "the object store refused the credentials or the access (HTTP 401/403)",
    ),
    (
        re.compile(
            r"ConnectError|Connection refused|dns error|failed to lookup|timed out|"
            r"error trying to connect|kind: Connect",
            re.I,
        ),
        "the object store's endpoint cannot be reached",
    ),
)
_REQUEST_URI = re.compile(r"uri: Some\((\w+://[^/\s)]+)")


def object_store_error(uri: str, exc: BaseException) -> ObjectStoreError | None:
    """The one-line :class:`ObjectStoreError` for ``exc`` raised opening ``uri``, or None when
    ``exc`` is not one of the causes known here (a missing bucket, refused credentials, an
    unreachable endpoint)."""
    text = str(exc)
    reason = next((why for pattern, why in _CAUSES if pattern.search(text)), None)
    if reason is None:
        return None
    endpoint = _REQUEST_URI.search(text)
    where = f" (endpoint {redact(endpoint.group(1))})" if endpoint else ""
    scheme = urlsplit(uri).scheme
    env = SETTINGS.get(scheme, "the object store's environment variables")
    return ObjectStoreError(
        f"cannot open the index at {redact(uri)}: {reason}{where}; check RAG_INDEX_URI "
        f"(or --index) and {env} (or the storage options)"
    )
