"""Which real parts each test touched, counted at the end of every run (issue 38).

A suite that is made faster can lose its real tests without anybody noticing: this plugin
watches, during each test, what it actually reached (in this process, and the processes it
started) and prints one line at the end of the run, e.g. ``real parts: model 612 tests, LanceDB
701, ...``. A part whose count falls to zero is visible in the next run's output.

What counts as touching a part:

- **model**: a sentence-transformers model or the ONNX query export encoded text here, or the
  test uses a real-model fixture, or it started ``rag-assets`` index / search / ask / serve /
  mcp / eval / adapt as a process;
- **LanceDB**: ``lancedb.connect`` was called here, or such a ``rag-assets`` process started;
- **Dagster run**: a run was created on a Dagster instance here, or a ``dagster`` process or a
  ``rag-assets index`` / ``backfill`` / ``ui`` process started;
- **HTTP**: a request went over a real socket (``http.client``, httpx's network transport),
  not to an in-process ASGI app;
- **browser**: a Chromium (or Playwright's driver) process started;
- **llama.cpp**: a llama.cpp server process started, or the test uses one;
- **S3**: the test uses the moto S3 server (or starts one), or runs on an ``s3://`` index.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

PARTS = ("model", "LanceDB", "Dagster run", "HTTP", "browser", "llama.cpp", "S3")
FIXTURES = {
    "real_embedder": {"model"},
    "second_model_dir": {"model"},
    "tiny_cross_encoder": {"model"},
    "served": {"model", "LanceDB", "HTTP"},
    "llama_server": {"llama.cpp", "HTTP"},
    "llama_server_small": {"llama.cpp", "HTTP"},
    "s3_server": {"S3"},
    "s3_env": {"S3"},
}
#: ``rag-assets`` subcommands started as processes, and what each reaches
CLI_PARTS = {
    "index": {"model", "LanceDB", "Dagster run"},
    "backfill": {"model", "LanceDB", "Dagster run"},
    "adapt": {"model", "LanceDB", "Dagster run"},
    "ui": {"Dagster run"},
    "serve": {"model", "LanceDB", "HTTP"},
    "mcp": {"model", "LanceDB"},
    "search": {"model", "LanceDB"},
    "ask": {"model", "LanceDB"},
    "eval": {"model", "LanceDB"},
    "status": {"LanceDB"},
}
_touched: set[str] = set()


def _mark(*parts: str) -> None:
    _touched.update(parts)


def _from_argv(argv: Any) -> None:
    args = [str(a) for a in argv] if isinstance(argv, list | tuple) else str(argv).split()
    text = " ".join(args)
    if "llama_cpp.server" in text:
        _mark("llama.cpp", "HTTP")
    if "moto.server" in text:
        _mark("S3")
    if "chrom" in text.lower() or "playwright" in text:
        _mark("browser")
    if "dagster" in text and ("dev" in args or "run" in args or "_daemon" in text):
        _mark("Dagster run")
    if "rag_assets.cli" in text or any(a.endswith("rag-assets") for a in args):
        _mark(*next((CLI_PARTS[a] for a in args if a in CLI_PARTS), set()))
    if "s3://" in text:
        _mark("S3")


def _wrap(owner: Any, name: str, parts: tuple[str, ...], check: Any = None) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_real_parts", False):
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if check is None or check(*args, **kwargs):
            _mark(*parts)
        return original(*args, **kwargs)

    wrapper._real_parts = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def _install() -> None:
    import http.client
    import subprocess

    def popen_check(self: Any, args: Any, *a: Any, **k: Any) -> bool:
        _from_argv(args)
        return False

    _wrap(subprocess.Popen, "__init__", (), popen_check)
    _wrap(http.client.HTTPConnection, "request", ("HTTP",))
    with contextlib.suppress(ImportError):
        import httpx

        _wrap(httpx.HTTPTransport, "handle_request", ("HTTP",))
        _wrap(httpx.AsyncHTTPTransport, "handle_async_request", ("HTTP",))
    with contextlib.suppress(ImportError):
        import lancedb

        _wrap(lancedb, "connect", ("LanceDB",), lambda uri, *a, **k: _s3(uri) or True)
    with contextlib.suppress(ImportError):
        from sentence_transformers import SentenceTransformer

        _wrap(SentenceTransformer, "encode", ("model",))
    with contextlib.suppress(ImportError):
        from rag_assets.lib.index.onnx_encoder import OnnxQueryEncoder

        _wrap(OnnxQueryEncoder, "encode", ("model",))
    with contextlib.suppress(ImportError):
        import dagster as dg

        for name in ("create_run", "create_run_for_job"):  # one calls the run domain, not the other
            _wrap(dg.DagsterInstance, name, ("Dagster run",))


def _s3(uri: Any) -> bool:
    if str(uri).startswith("s3://"):
        _mark("S3")
    return False


@pytest.fixture(autouse=True)
def _real_parts(request: pytest.FixtureRequest) -> Iterator[None]:
    _install()
    _touched.clear()
    for name in request.fixturenames:
        _touched.update(FIXTURES.get(name, ()))
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("index_uri") == "s3":
        _mark("S3")
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """What the test's setup and call touched goes with its call report (to the controller
    process too, under pytest-xdist)."""
    if call.when == "call":
        item.user_properties.append(("real_parts", ",".join(sorted(_touched))))
    yield


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if getattr(rep, "when", None) != "call" or getattr(rep, "outcome", "") == "skipped":
                continue
            for key, value in getattr(rep, "user_properties", ()):
                if key == "real_parts" and value:
                    counts.update(value.split(","))
    if counts:
        line = ", ".join(f"{p} {counts[p]}" for p in PARTS)
        terminalreporter.write_line(f"real parts (tests that touched each): {line}")
