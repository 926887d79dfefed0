"""Issue 20: the query path imports only what a query needs, checked in fresh processes.

Each command runs in its own interpreter on a small real index (the sample corpus, the real
model) with a hook that writes ``sys.modules`` at exit; the assertions are on what was imported,
never on time (speed is ``rag-assets bench --cold``). Plus the cheap checks of the same issue:
``-k`` bounds, a missing index is never created, ``--version``, help text, the LLM note, the
MCP handshake before any index, and the ONNX default answering as torch does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rag_assets_tests.helpers import REPO, SAMPLE_DOCS, cli_here

QUESTION = "How do I roll back to the previous embedding model?"

#: runs ``rag_assets.cli`` as ``rag-assets`` and writes the imported module names at exit
HOOK = """
import atexit, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv = ["rag-assets", *sys.argv[2:]]
runpy.run_module("rag_assets.cli", run_name="__main__")
"""

MODEL_MODULES = {"torch", "sentence_transformers", "transformers"}


def _env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", RAG_WORK_DIR=str(work))
    env.update(RAG_ADAPT="off", **extra)
    return env


def _cli(args: list[str], env: dict[str, str]) -> Any:
    """``rag-assets ARGS`` through its entry point in this process: for what it says, not for
    what it imports (:func:`_imports` runs a process of its own for that)."""
    return cli_here(env, *args, check=False)


def _imports(tmp: Path, args: list[str], env: dict[str, str]) -> tuple[set[str], Any]:
    """The top-level packages ``rag-assets ARGS`` imported, and the finished process."""
    dump = tmp / f"modules-{len(list(tmp.glob('modules-*')))}.txt"
    proc = subprocess.run(
        [sys.executable, "-c", HOOK, str(dump), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    names = set(dump.read_text().split()) if dump.exists() else set()
    return {n.split(".")[0] for n in names}, proc


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, real_embedder) -> tuple[Path, Path]:
    """The sample corpus indexed with the real model, and a work dir holding the model's
    fp32 ONNX export (made once here, as the first query would)."""
    from rag_assets.lib.index.onnx_encoder import OnnxQueryEncoder
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy

    root = tmp_path_factory.mktemp("cold")
    shutil.copytree(SAMPLE_DOCS, root / "documents")
    index_folder(root / "documents", root / "index", strategy("E"), real_embedder)
    OnnxQueryEncoder(real_embedder.spec, root / "work", 1, "onnx").ensure(real_embedder)
    return root / "index", root / "work"


# -- imports ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_query_commands_import_no_dagster_and_bm25_and_status_load_no_model(small_index, tmp_path):
    index, work = small_index
    env = _env(work)
    at = ["--index", str(index)]
    runs = {
        "status": ["status", *at],
        "bm25": ["search", "stale assets", *at, "--retriever", "bm25", "-k", "3"],
        "search": ["search", "stale assets", *at, "-k", "3"],
        "ask": ["ask", QUESTION, *at],
        "rollback": ["rollback", *at, "--to", "no-such-version"],  # fails: nothing changes
    }
    seen = {}
    for name, args in runs.items():
        mods, proc = _imports(tmp_path, args, env)
        assert mods, f"{name}: no module list ({proc.stderr[-500:]})"
        if name != "rollback":
            assert proc.returncode == 0, f"{name}: {proc.stderr[-500:]}"
        seen[name] = mods
    for name, mods in seen.items():
        assert "dagster" not in mods, name
        assert not mods & MODEL_MODULES, f"{name} loaded {sorted(mods & MODEL_MODULES)}"
    for name in ("status", "rollback"):
        assert "onnxruntime" not in seen[name], name  # no encoder at all
    for name in ("search", "ask"):
        assert "onnxruntime" in seen[name], name  # the cached export embedded the query


@pytest.mark.slow
def test_serve_and_mcp_import_no_dagster(small_index, tmp_path):
    """``serve``'s app (built as ``rag-assets serve`` builds it) and one MCP session over stdio
    (handshake, a tool call, stdin closed so that the server exits by itself)."""
    index, work = small_index
    env = _env(work, RAG_INDEX_URI=str(index))
    code = (
        "import os, sys\n"
        "from rag_assets.settings import Settings\n"
        "from rag_assets.serve.app import create_app\n"
        "from rag_assets.serve.service import Service\n"
        "import rag_assets.cli, rag_assets.serve.workers\n"
        "create_app(Service.open(Settings.from_env(os.environ)))\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-800:]
    served = set(proc.stdout.split())
    assert "fastapi" in served and "dagster" not in served and not served & MODEL_MODULES
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _init_params()},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "stale assets", "k": 2}},
        },
    ]
    replies, mods = _mcp_session(tmp_path, ["mcp", "--index", str(index)], env, messages)
    assert replies[2]["result"]["isError"] is False
    assert "mcp" in mods and "dagster" not in mods and not mods & MODEL_MODULES


def _init_params() -> dict[str, Any]:
    return {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    }


def _mcp_session(
    tmp: Path, args: list[str], env: dict[str, str], messages: list[dict[str, Any]]
) -> tuple[dict[int, dict[str, Any]], set[str]]:
    """Send ``messages`` one at a time (each request waits for its reply), close stdin, and
    return the replies by id and the server's imported packages."""
    dump = tmp / "mcp-modules.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOOK, str(dump), *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stdout is not None
    replies: dict[int, dict[str, Any]] = {}
    try:
        for msg in messages:
            proc.stdin.write(json.dumps(msg) + "\n")
            proc.stdin.flush()
            while "id" in msg and msg["id"] not in replies:
                line = proc.stdout.readline()
                assert line, f"mcp exited: {proc.stderr.read() if proc.stderr else ''}"
                reply = json.loads(line)
                if "id" in reply:
                    replies[reply["id"]] = reply
        proc.stdin.close()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    mods = set(dump.read_text().split()) if dump.exists() else set()
    return replies, {m.split(".")[0] for m in mods}


# -- MCP: the handshake does not wait for the index; schemas; version -------------------------
def test_mcp_answers_initialize_before_any_index_is_opened(tmp_path):
    """An index directory with nothing published: the handshake and the tool list still come
    back (nothing was opened for them); the first tool call names what is missing."""
    from rag_assets import __version__

    empty = tmp_path / "empty-index"
    empty.mkdir()
    env = _env(tmp_path / "work")
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _init_params()},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "x"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"query": "x", "k": 0}},
        },
    ]
    replies, mods = _mcp_session(tmp_path, ["mcp", "--index", str(empty)], env, messages)
    info = replies[1]["result"]["serverInfo"]
    assert info["name"] == "rag-assets" and info["version"] == __version__
    tools = {t["name"]: t for t in replies[2]["result"]["tools"]}
    props = tools["search"]["inputSchema"]["properties"]
    assert props["retriever"]["enum"] == ["dense", "bm25", "hybrid", "rerank"]
    assert (props["k"]["minimum"], props["k"]["maximum"]) == (1, 100)
    for tool in tools.values():
        for name, prop in tool["inputSchema"]["properties"].items():
            assert prop.get("description"), f"{tool['name']}.{name} has no description"
    failed = replies[3]["result"]
    assert failed["isError"] and "nothing is published" in failed["content"][0]["text"]
    bounds = replies[4]["result"]
    assert bounds["isError"]  # the SDK prefixes "Error executing tool search: " to the line
    assert bounds["content"][0]["text"].endswith(": k=0 is out of range: use 1..100")
    assert not mods & MODEL_MODULES and not list(empty.iterdir())  # nothing written there


# -- bounds, a missing index, version, help ----------------------------------------------------
@pytest.mark.parametrize("k", ["0", "-1", "101"])
def test_search_k_bounds_are_the_line_http_and_mcp_give(k, tmp_path):
    from rag_assets.serve.bounds import BadRequest, check_k

    proc = _cli(["search", "stale", "-k", k, "--index", str(tmp_path)], _env(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    line = f"k={k} is out of range: use 1..100"
    assert proc.stderr.strip().splitlines()[-1].endswith(f"argument -k: {line}")
    with pytest.raises(BadRequest) as e:
        check_k(int(k))
    assert str(e.value) == line


@pytest.mark.parametrize(
    "args",
    [
        ["ask", "how do I roll back"],
        ["search", "x", "--retriever", "bm25"],
        ["status"],
        ["rollback"],
        ["compact"],
        ["mcp"],
        ["serve", "--port", "1"],
    ],
)
def test_a_query_never_creates_a_missing_index(args, tmp_path):
    typo = tmp_path / "typo" / "index"
    proc = _cli([*args, "--index", str(typo)], _env(tmp_path / "work"))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and f"no index at {typo}" in proc.stderr
    assert "--index" in proc.stderr and not typo.parent.exists()


def test_version_and_help_text():
    from rag_assets import __version__

    version = _cli(["--version"], _env(Path("/nonexistent")))
    assert version.returncode == 0 and version.stdout.strip() == f"rag-assets {__version__}"
    top = _cli(["--help"], _env(Path("/nonexistent"))).stdout
    assert "``" not in top and ":class:" not in top and "--version" in top
    for command in ("ask", "search", "status", "serve", "mcp", "rollback"):
        text = _cli([command, "--help"], _env(Path("/nonexistent"))).stdout
        assert "``" not in text and "index directory (default RAG_INDEX_URI" in text, command
    ask = _cli(["ask", "--help"], _env(Path("/nonexistent"))).stdout
    assert "RAG_LLM_URL" in ask and "skip the reranker" in ask


def test_retriever_names_match_the_query_stage():
    from rag_assets.lib.query.retrieve import RETRIEVERS
    from rag_assets.serve.service import RETRIEVER_NAMES

    assert tuple(RETRIEVER_NAMES) == tuple(RETRIEVERS)


# -- the ONNX default answers as torch does ---------------------------------------------------
@pytest.mark.slow
def test_onnx_default_cli_answers_like_torch(small_index):
    """Parity: the CLI's default query encoder (the fp32 ONNX export) gives the same sources,
    distances (within float32 rounding) and refusals as ``RAG_QUERY_ENCODER=torch``."""
    index, work = small_index
    at = ["--index", str(index)]
    questions = [QUESTION, "What is the boiling point of tungsten?"]  # answered; refused
    for q in questions:
        got = {}
        for encoder in ("onnx", "torch"):
            env = _env(work, RAG_QUERY_ENCODER=encoder)
            search = _cli(["search", q, *at, "-k", "10", "--json"], env)
            ask = _cli(["ask", q, *at, "--json"], env)
            assert search.returncode == ask.returncode == 0, search.stderr + ask.stderr
            got[encoder] = (json.loads(search.stdout), json.loads(ask.stdout))
        (s1, a1), (s2, a2) = got["onnx"], got["torch"]
        assert [h["chunk_id"] for h in s1] == [h["chunk_id"] for h in s2], q
        for h1, h2 in zip(s1, s2, strict=True):
            assert abs(h1["cosine_distance"] - h2["cosine_distance"]) < 1e-5
        assert a1["no_answer"] == a2["no_answer"], q
        assert [c["chunk_id"] for c in a1["citations"]] == [c["chunk_id"] for c in a2["citations"]]
    assert got["onnx"][1]["no_answer"] is True  # the last question is refused by both


@pytest.mark.slow
def test_ask_without_an_llm_says_once_why_there_is_no_answer(small_index):
    index, work = small_index
    proc = _cli(["ask", QUESTION, "--index", str(index), "--json"], _env(work))
    assert proc.returncode == 0 and json.loads(proc.stdout)["answer"] is None
    assert proc.stderr.count("RAG_LLM_URL") == 1 and "sources only" in proc.stderr
