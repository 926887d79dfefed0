"""Offline stand-ins for the sources of issue 41: a local website (threading http.server with
robots.txt, a sitemap, a redirect, a 404, a slow page, ETags and a linked PDF) and local Git
repositories made with the ``git`` binary."""

from __future__ import annotations

import hashlib
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rag_assets_tests.helpers import serving_in_thread


def small_pdf(text: str) -> bytes:
    import pymupdf

    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), text)
    return bytes(doc.tobytes())


class Site:
    """The pages a :func:`website` serves: ``pages[path] = (content type, body)``; edit them
    between crawls. ``requests`` lists (path, status) of every request answered."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, bytes]] = {}
        self.redirects: dict[str, str] = {}
        self.slow: dict[str, float] = {}
        self.status: dict[str, int] = {}  # a path that answers only this status
        # a path whose body goes out one byte every `seconds` (issue 49: the slow drip);
        # `dripped` counts the bytes the client took before it hung up
        self.drip: dict[str, tuple[bytes, float]] = {}
        self.dripped: dict[str, int] = {}
        self.requests: list[tuple[str, int]] = []
        self.url = ""

    def html(self, path: str, title: str, body: str, links: tuple[str, ...] = ()) -> None:
        a = "".join(f'<p><a href="{link}">{link}</a></p>' for link in links)
        head = f"<html><head><title>{title}</title></head>"
        page = f"{head}<body><h1>{title}</h1><p>{body}</p>{a}</body></html>"
        self.pages[path] = ("text/html; charset=utf-8", page.encode())


@contextmanager
def website(site: Site) -> Iterator[Site]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path
            time.sleep(site.slow.get(path, 0))
            if path in site.redirects:
                return self._answer(301, {"Location": site.redirects[path]})
            if path in site.status:
                return self._answer(site.status[path])
            if path in site.drip:
                return self._drip(*site.drip[path])
            if path not in site.pages:
                return self._answer(404)
            ctype, body = site.pages[path]
            etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            if self.headers.get("If-None-Match") == etag:
                return self._answer(304, {"ETag": etag})
            self._answer(200, {"Content-Type": ctype, "ETag": etag}, body)

        def _drip(self, body: bytes, seconds: float) -> None:
            site.requests.append((self.path, 200))
            site.dripped[self.path] = 0
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    site.dripped[self.path] += 1
                    time.sleep(seconds)
            except OSError:  # the client hung up
                pass

        def _answer(
            self, code: int, headers: dict[str, str] | None = None, body: bytes = b""
        ) -> None:
            site.requests.append((self.path, code))
            try:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up (a timeout)
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    site.url = f"http://127.0.0.1:{srv.server_address[1]}"
    with serving_in_thread(srv):
        yield site


def git(repo: Path, *args: str) -> str:
    who = {"NAME": "t", "EMAIL": "t@example.com"}
    env = {f"GIT_{role}_{k}": v for role in ("AUTHOR", "COMMITTER") for k, v in who.items()}
    env |= {"HOME": str(repo.parent), "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"}
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def commit_files(repo: Path, files: dict[str, str | None], message: str) -> str:
    """Write (``None``: delete) ``files`` in the work tree of ``repo`` and commit them."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
    for name, text in files.items():
        path = repo / name
        if text is None:
            git(repo, "rm", "-q", name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        git(repo, "add", name)
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def s3_client(aws: dict[str, str]):  # -> boto3's S3 client (imported lazily)
    """A boto3 client of the test S3 server (``s3_env``'s settings) to put and delete objects."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=aws["AWS_ENDPOINT"],
        region_name=aws["AWS_REGION"],
        aws_access_key_id=aws["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"],
    )


# -- issue 49: a Git server that asks for credentials, and a scan for secrets at rest -----------
@contextmanager
def git_http(root: Path, user: str, password: str) -> Iterator[str]:
    """Git's smart HTTP (``git http-backend``, the CGI program Git ships) for the repositories
    under ``root``, behind HTTP Basic authentication: a request without ``user:password`` gets
    ``401`` (so the client asks its credential helper). Yields the server's URL."""
    import base64
    import os

    want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._cgi()

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._cgi()

        def _cgi(self) -> None:
            if self.headers.get("Authorization") != want:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(root),
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_PROJECT_ROOT": str(root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "REQUEST_METHOD": self.command,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_USER": user,
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            }
            out = subprocess.run(
                ["git", "http-backend"], input=body, env=env, capture_output=True
            ).stdout
            head, _, payload = out.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = next((ln[7:].strip() for ln in lines if ln.startswith("Status:")), "200")
            self.send_response(int(status.split()[0]))
            for ln in lines:
                name, sep, value = ln.partition(":")
                if sep and name.lower() not in ("status", "content-length"):
                    self.send_header(name.strip(), value.strip())
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    with serving_in_thread(srv):
        yield f"http://127.0.0.1:{srv.server_address[1]}"


def git_credential_env(user: str, password: str) -> dict[str, str]:
    """The environment that gives Git ``user``/``password`` through a credential helper
    (``GIT_CONFIG_COUNT``: no file written, nothing in the remote's URL)."""
    helper = (
        '!f() { test "$1" = get && printf "username=%s\\npassword=%s\\n" "$T_GIT_USER" '
        '"$T_GIT_PW"; }; f'
    )
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "credential.helper",
        "GIT_CONFIG_VALUE_0": helper,
        "T_GIT_USER": user,
        "T_GIT_PW": password,
    }


def scan_for_secrets(roots: list[Path], secrets: list[str]) -> list[str]:
    """Where any of ``secrets`` is stored under ``roots``: ``"<file>: <secret>"`` per finding.

    Every file is read as it is and decompressed: gzip and zlib files (a Git cache's loose
    objects), every value of every table of an SQLite file (Dagster's run and event storage),
    zlib- or gzip-compressed blobs inside them (Dagster's snapshots), Parquet files, and every
    version of every LanceDB table (whose string columns may be encoded) read back as rows;
    each secret also percent-encoded."""
    import contextlib
    import gzip
    import sqlite3
    import urllib.parse
    import zlib

    needles = {s.encode() for s in secrets if s}
    needles |= {urllib.parse.quote(s, safe="").encode() for s in secrets if s}
    found: list[str] = []

    def expand(data: bytes) -> list[bytes]:
        out = [data]
        for unpack in (zlib.decompress, gzip.decompress):
            with contextlib.suppress(Exception):  # not that compression
                out.append(unpack(data))
        return out

    def check(where: Path | str, blobs: list[bytes]) -> None:
        for blob in blobs:
            for needle in needles:
                if needle in blob:
                    found.append(f"{where}: {needle.decode()}")

    lance_dirs: set[Path] = set()
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if path.is_dir() and path.suffix == ".lance":
                lance_dirs.add(path)
            if not path.is_file():
                continue
            data = path.read_bytes()
            check(path, expand(data))
            if data.startswith(b"SQLite format 3\0"):
                con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
                try:
                    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master "
                                                        "WHERE type='table'")]  # fmt: skip
                    for table in tables:
                        for row in con.execute(f'SELECT * FROM "{table}"'):
                            for value in row:
                                raw = value if isinstance(value, bytes) else str(value).encode()
                                check(f"{path}:{table}", expand(raw))
                finally:
                    con.close()
            elif path.suffix == ".parquet":
                import pyarrow.parquet as pq

                check(path, [str(pq.read_table(path).to_pylist()).encode()])
    for folder in sorted(lance_dirs):
        import lancedb

        table = lancedb.connect(str(folder.parent)).open_table(folder.stem)
        for version in table.list_versions():
            table.checkout(version["version"])
            check(f"{folder}@{version['version']}", [str(table.to_arrow().to_pylist()).encode()])
    return found
