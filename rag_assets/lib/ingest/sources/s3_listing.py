"""An S3 listing for the keys ``object_store`` refuses (issue 49).

``object_store`` (obstore) refuses a whole listing page when one key in it has an empty, ``.``
or ``..`` segment (``kb/./a.md``, ``kb//a.md``, ``kb/a/../b.md``: S3 takes any string as a
key), so one such key would fail the whole bucket source. When it does, an S3 source lists
again with this module: ListObjectsV2 over httpx, signed with AWS Signature Version 4 from the
same variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``AWS_ENDPOINT``; ``AWS_SKIP_SIGNATURE`` unsigned). Each such key then fails
alone as a document (:mod:`.objects`); the others index as always (read through obstore). Where
the credentials come from elsewhere (an instance profile, a web identity), this listing cannot
sign and the source fails, naming the key.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import quote, unquote

import httpx

from rag_assets.lib.ingest.sources import SourceError

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
MAX_PAGES = 10_000  # of 1000 keys each: a runaway continuation stops here


def list_objects(
    bucket: str, prefix: str, env: dict[str, str], timeout: float
) -> list[dict[str, Any]]:
    """Every object under ``prefix`` (``path``, ``size``, ``e_tag``, ``last_modified``, as
    obstore's listing gives them), in key order; :class:`SourceError` when it cannot sign or
    the store refuses."""
    key_id, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    unsigned = env.get("AWS_SKIP_SIGNATURE", "").lower() in ("1", "true", "yes")
    if not unsigned and not (key_id and secret):
        raise SourceError("no AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY to sign a listing with")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = (env.get("AWS_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or "").rstrip("/")
    if endpoint:  # path-style, as object_store addresses an endpoint
        base, path = f"{endpoint}/{bucket}", f"/{bucket}"
    else:
        base, path = f"https://{bucket}.s3.{region}.amazonaws.com", "/"
    host = httpx.URL(base).netloc.decode()
    out: list[dict[str, Any]] = []
    token = ""
    with httpx.Client(timeout=timeout, trust_env=True) as client:
        for _ in range(MAX_PAGES):
            params = {"list-type": "2", "encoding-type": "url"}
            if prefix:
                params["prefix"] = prefix.rstrip("/") + "/"
            if token:
                params["continuation-token"] = token
            query = "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(params.items()))
            headers = {"x-amz-content-sha256": hashlib.sha256(b"").hexdigest()}
            if not unsigned:
                headers = _signed(path, query, host, headers, region, key_id, secret, env)
            try:
                resp = client.get(f"{base}{'/' if path == '/' else ''}?{query}", headers=headers)
            except httpx.HTTPError as exc:
                raise SourceError(f"listing s3://{bucket}: {type(exc).__name__}") from None
            if resp.status_code != 200:
                raise SourceError(f"listing s3://{bucket}: HTTP {resp.status_code}")
            root = ET.fromstring(resp.content)
            for item in root.iter(f"{_NS}Contents"):
                out.append(
                    {
                        "path": unquote(item.findtext(f"{_NS}Key") or ""),
                        "size": int(item.findtext(f"{_NS}Size") or 0),
                        "e_tag": item.findtext(f"{_NS}ETag") or "",
                        "last_modified": item.findtext(f"{_NS}LastModified") or "",
                        "version": None,
                    }
                )
            token = root.findtext(f"{_NS}NextContinuationToken") or ""
            if (root.findtext(f"{_NS}IsTruncated") or "").lower() != "true" or not token:
                return out
    raise SourceError(f"listing s3://{bucket}: more than {MAX_PAGES} pages")


def _q(text: str) -> str:
    return quote(text, safe="-_.~")


def _signed(
    path: str,
    query: str,
    host: str,
    headers: dict[str, str],
    region: str,
    key_id: str,
    secret: str,
    env: dict[str, str],
) -> dict[str, str]:
    """``headers`` with AWS Signature Version 4 for a GET of ``path?query`` on ``host``."""
    now = _dt.datetime.now(_dt.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    head = {**headers, "host": host, "x-amz-date": stamp}
    if env.get("AWS_SESSION_TOKEN"):
        head["x-amz-security-token"] = env["AWS_SESSION_TOKEN"]
    names = sorted(head)
    canonical = "\n".join(
        ["GET", quote(path, safe="/-_.~"), query, *(f"{n}:{head[n].strip()}" for n in names), "",
         ";".join(names), head["x-amz-content-sha256"]]
    )  # fmt: skip
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = (f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={';'.join(names)}, "
            f"Signature={signature}")  # fmt: skip
    return {k: v for k, v in head.items() if k != "host"} | {"Authorization": auth}
