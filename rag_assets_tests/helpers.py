"""What many test files share: the project's paths, ports and real server processes, the
``rag-assets`` command line run as a real process, and copies of the sample documents.

Plain functions and classes, no fixtures: the conftests import from here (never the other way
round), and so do the server modules (``s3_server``, ``llm_server``, ``model_servers``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rag_assets.bench.upgrade_walkthrough import ASSETS as WALKTHROUGH_ASSETS

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DOCS = REPO / "data" / "documents"
SAMPLE_EVAL = REPO / "data" / "eval"
SHARED = REPO.parent / "shared"
needs_shared = pytest.mark.skipif(
    not (SHARED / "corpus" / "course").is_dir(),
    reason="needs ../shared (course corpus and eval sets), present in CI",
)

#: the index graph's assets from extraction to publishing, in order (the walkthrough's list)
INDEX_ASSETS = list(WALKTHROUGH_ASSETS)
#: ``rag-assets`` as a real process, with this interpreter
CLI = [sys.executable, "-m", "rag_assets.cli"]
#: settings a test's environment never inherits from the caller's unless it names them
CALLER_SETTINGS = ("RAG_RERANK_MODEL", "RAG_DISTANCE_CUT", "RAG_LLM_URL", "RAG_FORCE_FOLDER")
#: the bearer token of the shared served index
TOKEN = "test-token-7f3a"
#: seconds a server gets to answer after it starts: model load on 2 shared, busy cores
STARTUP_S = 180


# -- sample documents --------------------------------------------------------------------------
def copy_docs(folder: Path, pattern: str = "*") -> Path:
    """``folder`` (made here) with the sample documents whose names match ``pattern``."""
    folder.mkdir(parents=True)
    for p in sorted(SAMPLE_DOCS.glob(pattern)):
        if p.is_file():
            shutil.copy(p, folder / p.name)
    return folder


def link_or_copy(src: str, dst: str) -> None:
    """A ``shutil.copytree`` copy function: hard links for large files (model weights)."""
    if Path(src).stat().st_size > 1_000_000:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


# -- the command line as a real process ------------------------------------------------------------
def index_env(
    root: Path,
    docs: Path,
    *,
    eval_dir: Path | None = None,
    dagster: bool = True,
    **extra: str,
) -> dict[str, str]:
    """The environment of ``rag-assets`` on an index under ``root`` (``index``, ``work`` and,
    with ``dagster``, its own ``DAGSTER_HOME``) of the documents in ``docs``. No evaluation set
    unless ``eval_dir`` names one; the caller's rerank model, cut and LLM are dropped unless
    ``extra`` sets them."""
    env = {
        **os.environ,
        "RAG_DOCUMENTS_DIR": str(docs),
        "RAG_INDEX_URI": str(root / "index"),
        "RAG_WORK_DIR": str(root / "work"),
        "RAG_EVAL_DIR": str(eval_dir or root / "no-eval"),
    }
    env.pop("DAGSTER_HOME", None)
    if dagster:
        (root / "dagster").mkdir(parents=True, exist_ok=True)
        env["DAGSTER_HOME"] = str(root / "dagster")
    for var in CALLER_SETTINGS:
        env.pop(var, None)
    return env | extra


def declare(index: Path, **values: str) -> None:
    """Issue 51: make the local index at ``index`` declare ``values`` (as if a build on another
    machine had been given them): its ``declaration.json`` edited in place."""
    from rag_assets.lib.index.declaration import DECLARATION_FILE

    path = Path(index) / DECLARATION_FILE
    raw = json.loads(path.read_text(encoding="utf-8"))
    for name, value in values.items():
        raw["settings"][name] = {"value": value, "at": "2026-12-05T00:00:00Z", "by": "a test"}
    path.write_text(json.dumps(raw), encoding="utf-8")


def run_cli(
    env: Mapping[str, str],
    *args: str,
    check: bool = True,
    cwd: Path = REPO,
    timeout: float = 900,
    stdin: str | None = None,
    umask: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``rag-assets ARGS`` as a real process; with ``check``, a non-zero exit fails the test
    with the end of both outputs. ``umask``: the process's, e.g. a service account's."""
    proc = subprocess.run(
        [*CLI, *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
    )
    if check:
        assert proc.returncode == 0, (
            f"rag-assets {' '.join(args)} exited {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def cli_here(
    env: Mapping[str, str],
    *args: str,
    check: bool = True,
    cwd: Path = REPO,
    stdin: str | None = None,
    umask: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``rag-assets ARGS`` through its own entry point (``rag_assets.cli.main``) in this process:
    the same parser, commands, model, LanceDB and Dagster instance as :func:`run_cli`, with
    ``env`` as the whole environment, ``cwd`` as the directory and stdout/stderr captured, but
    without a new interpreter importing torch, Dagster and LanceDB again (about 10 s a call on
    two busy cores). For what a process itself shows (exit on a signal, imports, umask, a kill),
    use :func:`run_cli`, and for what must never reach stderr: a library's log handler made
    earlier in this process still writes to the test's own stderr, not to the captured one."""
    import io

    from rag_assets.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.stdin = io.StringIO(stdin or "")
    saved_umask = os.umask(umask) if umask is not None else None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 1
    finally:
        if saved_umask is not None:
            os.umask(saved_umask)
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    proc = subprocess.CompletedProcess(["rag-assets", *args], code, out.getvalue(), err.getvalue())
    if check:
        assert proc.returncode == 0, (
            f"rag-assets {' '.join(args)} exited {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def line_starting(out: str, start: str) -> str:
    """The first line of ``out`` that starts with ``start``."""
    return next(ln for ln in out.splitlines() if ln.startswith(start))


def graph_settings(
    tmp: Path, docs: Path, uri: str | None = None, eval_dir: Path = SAMPLE_EVAL, **kw: Any
) -> Any:
    """``Settings`` of an index graph under ``tmp`` (``index``, ``work``) of the documents in
    ``docs``, evaluated on ``eval_dir`` with a recall floor the sample set passes."""
    from rag_assets.settings import Settings

    return Settings(
        documents_dir=str(docs),
        index_uri=uri or str(tmp / "index"),
        work_dir=str(tmp / "work"),
        eval_dir=str(eval_dir),
        recall_floor=0.3,
        **{"adapt": "off", **kw},  # the tests' default (conftest): issue 44's auto apart
    )


# -- ports and server processes ------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Terminate a server the tests started; kill it if it has not exited after ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.terminate()
    raise RuntimeError(f"server not healthy after {timeout} s: {log.read_text()[-2000:]}")


def start_server(
    index: Path, env: dict[str, str], log: Path
) -> tuple[str, subprocess.Popen[bytes]]:
    """A real ``rag-assets serve`` (uvicorn) on ``index``; returns its URL once it is healthy."""
    port = free_port()
    cmd = [*CLI, "serve", "--index", str(index), "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log, STARTUP_S)
    return url, proc


def bearer(url: str, token: str, method: str, path: str, **kw: Any) -> Any:
    """One request (an ``httpx.Response``) to the service at ``url`` as ``token``'s bearer."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    return httpx.request(method, url + path, headers=headers, timeout=120, **kw)


@dataclass
class Served:
    """A running ``rag-assets serve`` on an index of the tests."""

    url: str
    token: str
    docs: Path
    index: Path
    work: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self):  # -> httpx.Client (imported lazily: fast tests need no HTTP client)
        import httpx

        return httpx.Client(base_url=self.url, headers=self.auth, timeout=60)

    def env(self) -> dict[str, str]:
        """Environment for another process on the same index (CLI, MCP over stdio)."""
        env = dict(os.environ)
        env.update(
            RAG_INDEX_URI=str(self.index),
            RAG_WORK_DIR=str(self.work),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        for var in ("RAG_BASE_URL", "RAG_LLM_URL", "RAG_RERANK_MODEL", "RAG_DISTANCE_CUT"):
            env.pop(var, None)
        return env


# -- small HTTP servers in a thread ----------------------------------------------------------------
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy")


def direct_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers on 127.0.0.1 reached directly: urllib and httpx honour proxy variables."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@contextmanager
def serving_in_thread(srv: Any) -> Iterator[Any]:
    """``srv`` (a ``socketserver`` server) answering from a daemon thread while in the block."""
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def send_json(handler: Any, code: int, payload: bytes) -> None:
    """A ``BaseHTTPRequestHandler``'s JSON answer; a client that gave up is not an error."""
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        handler.wfile.write(payload)
