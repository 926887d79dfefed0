"""Issue 30 against real ``rag-assets serve`` processes over real sockets: a Content-Length over
the cap gets the JSON 413, a body that stops arriving is dropped with 408, a broken chunked body
is called a body error, a 404 never echoes a long id, LanceDB's errors never reach a client with
their source paths, and the page's login is a signed session that expires and can be revoked
without changing the token."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from rag_assets.serve.app import MAX_BODY_BYTES
from rag_assets.serve.session import COOKIE, Sessions
from rag_assets_tests.helpers import Served, start_server, stop_process

pytestmark = pytest.mark.slow

HANG_GUARD_S = 120  # a socket read waits at most this: a server that never answers fails
BODY_TIMEOUT_S = 2


def _exchange(url: str, request: bytes, *, then: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes; (status, headers, body)."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80)) as s:
        s.sendall(request)
        if then:
            s.sendall(then)
        s.settimeout(HANG_GUARD_S)
        data = b""
        while True:
            try:
                piece = s.recv(65536)
            except TimeoutError:
                pytest.fail(f"no answer within {HANG_GUARD_S} s (got {data[:200]!r})")
            if not piece:
                break
            data += piece
            if b"\r\n\r\n" in data and b"connection: close" not in data.lower():
                head, _, body = data.partition(b"\r\n\r\n")
                length = [
                    ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")
                ]
                if length and len(body) >= int(length[0].split(b":")[1]):
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _post_head(served: Served, extra: str) -> bytes:
    return (
        f"POST /ask HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {served.token}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    ).encode()


@pytest.fixture(scope="module")
def quick(served: Served, tmp_path_factory) -> Iterator[Served]:
    """A second server on a copy of the index with a 2 s body timeout."""
    root = tmp_path_factory.mktemp("quick")
    index = root / "index"
    shutil.copytree(served.index, index)
    s = Served("", served.token, served.docs, index, root / "work", None, root / "serve.log")  # type: ignore[arg-type]
    env = s.env() | {"RAG_API_TOKEN": s.token, "RAG_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)}
    s.url, s.proc = start_server(index, env, s.log)
    try:
        yield s
    finally:
        stop_process(s.proc)


def test_a_content_length_over_the_cap_gets_the_json_413(served: Served):
    status, headers, body = _exchange(
        served.url, _post_head(served, f"Content-Length: {5 * MAX_BODY_BYTES}\r\n")
    )
    assert status == 413 and headers["content-type"] == "application/json"
    assert json.loads(body) == {
        "error": f"request body of {5 * MAX_BODY_BYTES} bytes; at most {MAX_BODY_BYTES}"
    }


@pytest.mark.parametrize(
    "framing,sent",
    [
        ("Content-Length: 400\r\n", b'{"question": "how do I roll'),
        ("Transfer-Encoding: chunked\r\n", b"100000\r\n" + b"x" * 50_000),  # cut mid-chunk
    ],
    ids=["content-length", "chunked"],
)
def test_a_body_that_stops_arriving_is_dropped_with_408(quick: Served, framing: str, sent: bytes):
    status, headers, body = _exchange(quick.url, _post_head(quick, framing) + sent)
    assert status == 408 and headers.get("connection") == "close"
    assert "RAG_BODY_TIMEOUT_S" in json.loads(body)["error"]
    with httpx.Client(base_url=quick.url, headers=quick.auth) as c:
        assert c.get("/healthz").status_code == 200


def test_a_broken_chunked_body_is_called_a_body_error(served: Served):
    head = _post_head(served, "Transfer-Encoding: chunked\r\n")
    status, _, body = _exchange(served.url, head + b"5\r\nabc\r\nXYZ\r\n")
    assert status == 400
    error = json.loads(body)["error"]
    assert "request body could not be parsed" in error and "headers" not in error


def test_a_404_never_echoes_a_long_id(served: Served):
    long_id = "x" * 60_000
    with served.client() as c:
        r = c.get(f"/documents/{long_id}")
        assert r.status_code == 404
        error = r.json()["error"]
        assert len(error) < 200 and "x" * 100 not in error and "no document" in error
        s = c.get("/search", params={"q": "rollback", "retriever": "y" * 60_000})
        assert s.status_code == 400 and len(s.json()["error"]) < 200


def test_lance_errors_reach_clients_without_source_paths(served: Served, tmp_path: Path):
    """A damaged table (its version manifests emptied while serving) makes LanceDB raise an
    I/O error naming its Rust source file (``/root/.cargo/registry/…/dataset.rs:775:26``):
    the client gets the error without any path and a reference; the log has the whole text."""
    index = tmp_path / "index"
    shutil.copytree(served.index, index)
    log = tmp_path / "serve.log"
    env = served.env() | {"RAG_API_TOKEN": served.token, "RAG_WORK_DIR": str(tmp_path / "w")}
    url, proc = start_server(index, env, log)
    try:
        for manifest in index.glob("chunks_*.lance/_versions/*.manifest"):
            manifest.write_bytes(b"")
        r = httpx.get(f"{url}/status", headers=served.auth, timeout=60)
        assert r.status_code == 500
        error = r.json()["error"]
        assert "lance" in error.lower() and "(ref " in error
        for leak in ("/root", ".cargo", ".rs:", str(index), "/rustc/"):
            assert leak not in error
        ref = error.rsplit("(ref ", 1)[1].rstrip(")")
    finally:
        stop_process(proc)
    logged = log.read_text(errors="replace")
    assert f"ref {ref}" in logged and ".rs:" in logged  # the full text stays server-side


# -- the signed session ------------------------------------------------------------------------
def _login(served: Served) -> tuple[str, str]:
    """(the session cookie's value, the Set-Cookie header) of a page login."""
    with httpx.Client(base_url=served.url, timeout=60) as c:
        r = c.post("/login", data={"token": served.token})
        assert r.status_code == 303
        assert c.get("/status").status_code == 200  # the client sends it back: it works
        return c.cookies[COOKIE], r.headers["set-cookie"]


def _cookie(value: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE}={value}"}


def test_the_login_cookie_is_a_signed_session_not_the_token(served: Served):
    cookie, set_cookie = _login(served)
    assert served.token not in cookie and cookie.count(".") == 5
    name = cookie.split(".")[1]
    assert base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)) == b"@admin"  # RAG_API_TOKEN
    attrs = set_cookie.lower()
    assert "httponly" in attrs and "samesite=strict" in attrs and "max-age=43200" in attrs
    with httpx.Client(base_url=served.url, timeout=60) as c:
        assert c.get("/status", headers=_cookie(cookie)).status_code == 200
        # the raw token as a cookie (what the page used to hold) is no longer a credential
        assert c.get("/status", headers={"Cookie": f"rag_token={served.token}"}).status_code == 401
        forged = cookie[:-4] + ("AAAA" if not cookie.endswith("AAAA") else "BBBB")
        assert c.get("/status", headers=_cookie(forged)).status_code == 401
        longer = cookie.split(".")
        longer[3] = str(int(longer[3]) + 10**6)  # a longer life, not signed
        assert c.get("/status", headers=_cookie(".".join(longer))).status_code == 401


def test_an_expired_session_is_refused(served: Served):
    """A session signed with the server's own secret, but issued two lifetimes ago."""
    _login(served)  # the server has its secret by now
    sessions = Sessions(served.work / "serve", 43200)
    digest = hashlib.sha256(served.token.encode()).hexdigest()
    old = sessions.issue("@admin", digest, now=time.time() - 2 * 43200)
    fresh = sessions.issue("@admin", digest)
    with httpx.Client(base_url=served.url, timeout=60) as c:
        assert c.get("/status", headers=_cookie(fresh)).status_code == 200  # the same secret
        assert c.get("/status", headers=_cookie(old)).status_code == 401


def test_sessions_are_revoked_without_changing_the_token(served: Served):
    kept, ended = _login(served)[0], _login(served)[0]
    with httpx.Client(base_url=served.url, timeout=60) as c:
        assert c.post("/logout", headers=_cookie(ended)).status_code == 200  # this one only
        assert c.get("/status", headers=_cookie(ended)).status_code == 401
        assert c.get("/status", headers=_cookie(kept)).status_code == 200
        assert c.post("/logout?all=1", headers=_cookie(kept)).status_code == 200  # every one
        assert c.get("/status", headers=_cookie(kept)).status_code == 401
        assert c.get("/status", headers=served.auth).status_code == 200  # the token still works
        assert c.post("/logout").status_code == 401  # logging out needs a credential


def test_the_server_log_holds_no_traceback_for_any_of_these(served: Served):
    assert "Traceback" not in served.log.read_text(errors="replace")
