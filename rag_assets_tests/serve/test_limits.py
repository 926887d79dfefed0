"""Issue 25 against the real ``rag-assets serve`` process (uvicorn): a chunked body is cut at
the cap with 413, only configured hosts are answered (421), lone surrogates and control
characters in a question are a one-line 400, the page works with a token (login cookie),
``/openapi.json`` names the errors the API really returns, and a non-loopback bind without a
token warns at start."""

from __future__ import annotations

import http.client
import json
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from rag_assets.serve.app import MAX_BODY_BYTES
from rag_assets_tests.helpers import Served, free_port, wait_healthy

pytestmark = pytest.mark.slow


def _conn(served: Served) -> http.client.HTTPConnection:
    u = urlsplit(served.url)
    return http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120)


def test_a_chunked_body_is_cut_at_the_cap_with_413(served: Served):
    conn = _conn(served)
    piece = b"x" * 65536

    def body():  # 4x the cap, never announced by Content-Length
        yield b'{"question": "'
        for _ in range(4 * MAX_BODY_BYTES // len(piece)):
            yield piece

    headers = {**served.auth, "Content-Type": "application/json"}
    try:
        conn.request("POST", "/ask", body=body(), headers=headers, encode_chunked=True)
        resp = conn.getresponse()
        status, data = resp.status, resp.read()
    except (BrokenPipeError, ConnectionResetError):  # the server may close while we send
        pytest.fail("the server closed the connection without a 413")
    finally:
        conn.close()
    assert status == 413, data
    assert "at most" in json.loads(data)["error"]
    with served.client() as c:  # still serving
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "method,path",
    [("GET", "/status"), ("GET", "/search?q=rollback"), ("POST", "/ask"), ("GET", "/healthz")],
)
def test_an_unconfigured_host_gets_421(served: Served, method: str, path: str):
    with served.client() as c:
        r = c.request(method, path, headers={"Host": "evil.example"}, json={"question": "x"})
        assert r.status_code == 421, r.text
        assert "RAG_ALLOWED_HOSTS" in r.json()["error"]
        doc = c.get("/documents/01-pipeline-overview.md", headers={"Host": "rebind.example:80"})
        assert doc.status_code == 421
        ok = c.get("/healthz", headers={"Host": f"localhost:{urlsplit(served.url).port}"})
        assert ok.status_code == 200


def test_citation_urls_take_an_allowed_host_only(served: Served):
    with served.client() as c:
        r = c.post("/ask", json={"question": "How do I roll back the published index?"})
        assert r.status_code == 200
        assert "evil" not in r.text
        assert c.post("/ask", json={"question": "q"}, headers={"Host": "evil"}).status_code == 421


@pytest.mark.parametrize(
    "raw,what",
    [('{"question": "\\ud800"}', "lone surrogate U+D800"), ('{"question": "a\\u0001b"}', "U+0001")],
)
def test_bad_characters_in_a_question_are_a_one_line_400(served: Served, raw: str, what: str):
    with served.client() as c:
        r = c.post("/ask", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert what in r.json()["error"] and "\n" not in r.json()["error"]
        s = c.get("/search", params={"q": "a\x01b"})
        assert s.status_code == 400 and "U+0001" in s.json()["error"]
    assert "Traceback" not in served.log.read_text(errors="replace")


def test_openapi_names_the_real_errors_and_docs_is_left_out(served: Served):
    with served.client() as c:
        spec = c.get("/openapi.json").json()
        assert '"422"' not in json.dumps(spec) and "HTTPValidationError" not in json.dumps(spec)
        ask = spec["paths"]["/ask"]["post"]["responses"]
        assert {"200", "400", "401", "413", "421"} <= set(ask)
        assert ask["400"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorBody")
        assert c.get("/docs").status_code == 404  # Swagger UI would load from a CDN


def test_the_page_asks_for_the_token_and_a_login_cookie_lets_it_work(served: Served):
    with httpx.Client(base_url=served.url, timeout=60) as c:  # no Authorization header
        page = c.get("/")
        assert page.status_code == 401 and 'name="token"' in page.text
        assert c.post("/login", data={"token": "wrong"}).status_code == 401
        assert c.get("/search", params={"q": "rollback"}).status_code == 401
        login = c.post("/login", data={"token": served.token})
        assert login.status_code == 303
        assert "httponly" in login.headers["set-cookie"].lower()
        assert c.get("/").status_code == 200  # the search page itself, with the cookie
        assert c.get("/search", params={"q": "rollback"}).status_code == 200


def test_a_non_loopback_bind_without_a_token_warns_and_validates_hosts(served: Served, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    env = served.env() | {"RAG_ALLOWED_HOSTS": "rag.internal"}
    env.pop("RAG_API_TOKEN", None)
    cmd = ["rag-assets", "serve", "--index", str(served.index), "--host", "0.0.0.0"]
    import sys

    cmd = [sys.executable, "-m", "rag_assets.cli", *cmd[1:], "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log, 300)
        warning = [ln for ln in log.read_text().splitlines() if "warning" in ln]
        assert len(warning) == 1 and "RAG_API_TOKEN" in warning[0], log.read_text()
        assert httpx.get(f"{url}/healthz", headers={"Host": "rag.internal"}).status_code == 200
        assert httpx.get(f"{url}/healthz", headers={"Host": "10.1.2.3"}).status_code == 421
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_unexpected_error_is_shown_without_relative_paths():
    """Issue 43: the administrator's /log 500 kept `tmp/…/_rag_queries.lance/…`; document ids
    in ordinary errors (`hr/salaries.md`) stay."""
    from rag_assets.serve.limits import client_text

    raw = (
        "LanceError(IO): Not found: tmp/rag/index/_rag_queries.lance/data/0a.lance, "
        "/root/.cargo/registry/src/index.crates.io/lance-io-0.40/src/local.rs:123:45"
    )
    assert client_text(raw, relative=True) == "LanceError(IO): Not found: <path>, <source>"
    assert client_text("no document 'hr/salaries.md'") == "no document 'hr/salaries.md'"
