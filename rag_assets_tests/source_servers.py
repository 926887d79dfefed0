"""Offline stand-ins for the sources of issue 41: a local website (threading http.server with
robots.txt, a sitemap, a redirect, a 404, a slow page, ETags and a linked PDF) and local Git
repositories made with the ``git`` binary."""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


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
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        srv.shutdown()
        srv.server_close()


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
