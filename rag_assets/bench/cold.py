"""``rag-assets bench --cold``: each query command in a fresh process, beside the floors.

A cold command pays for the interpreter, its imports and opening the index before it answers.
On 2 shared cores the absolute seconds move with the load, so every command is reported as a
ratio to two floors measured in the same run, round by round (each round starts every command
once, in the same order, so a load spike hits them alike):

- ``python -c pass``: the interpreter alone;
- ``import lancedb``: the floor no query can go under (every command reads the LanceDB table).

``mcp initialize`` is the time from starting ``rag-assets mcp`` to its answer to the MCP
``initialize`` request (what a client waits for before it may list tools); ``mcp first call`` is
the time to the answer of the first ``tools/call`` right after the handshake (index and encoder
loaded by then).
"""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COLD_RUNS = 5
"""Fresh processes per command (the median of 5 shrugs off one run hit by a load spike)."""

COLD_QUERY = "How do I roll back to the previous embedding model?"
"""The question ``ask`` / ``search`` are timed with (any question works: no cache is shared)."""

COLD_GOALS = {"ask": 2.0, "search --retriever bm25": 1.6, "status": 1.6, "mcp initialize": 1.0}
"""Issue 20's goals, as ratios to a bare ``import lancedb`` in a fresh process."""

MCP_TIMEOUT_S = 300
"""How long one MCP exchange may take before the run is abandoned (a model export, cold)."""

FLOOR = "import lancedb"


def cold_commands(index: str, query: str = COLD_QUERY) -> dict[str, list[str]]:
    """The argv of every timed command (``mcp …`` entries are exchanges, see :func:`_mcp`)."""
    py = sys.executable
    cli = [py, "-m", "rag_assets.cli"]
    return {
        "python -c pass": [py, "-c", "pass"],
        FLOOR: [py, "-c", "import lancedb"],
        "status": [*cli, "status", "--index", index],
        "search --retriever bm25": [*cli, "search", query, "--index", index, "--retriever", "bm25"],
        "search": [*cli, "search", query, "--index", index],
        "ask": [*cli, "ask", query, "--index", index],
        "mcp initialize": [*cli, "mcp", "--index", index],
        "mcp first call": [*cli, "mcp", "--index", index],
    }


def _env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # issue 40: as an installed package runs, from bytecode: PYTHONDONTWRITEBYTECODE (set in
    # some shells and CI images) would make every process compile each module again (measured:
    # status 1.19x the floor without bytecode, 1.02x with it, side by side on one index)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pythonpath:  # measure another checkout of the package (e.g. the code before a change)
        env["PYTHONPATH"] = pythonpath
    return env


def _cwd(env: dict[str, str]) -> str | None:
    """``python -m`` puts the working directory first on ``sys.path``: run another checkout's
    commands from inside it, so that its package is the one imported."""
    return env.get("PYTHONPATH") or None


def _run(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=MCP_TIMEOUT_S, cwd=_cwd(env)
    )
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[1:])} exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
        )
    return took


def _rpc(proc: subprocess.Popen[str], msg: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(msg) + "\n")
    proc.stdin.flush()


def _reply(proc: subprocess.Popen[str], want_id: int) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"rag-assets mcp closed stdout: {err.strip()[-300:]}")
        msg = json.loads(line)
        if msg.get("id") == want_id:
            return dict(msg)


def _mcp(argv: list[str], env: dict[str, str], first_call: bool) -> float:
    """Seconds from the start of ``rag-assets mcp`` to its ``initialize`` answer (or, with
    ``first_call``, to the answer of a ``search`` tool call sent right after the handshake)."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=_cwd(env),
    )
    try:
        init = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "rag-assets-bench", "version": "1"},
        }
        _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        _reply(proc, 1)
        if not first_call:
            return time.perf_counter() - t
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        args = {"name": "search", "arguments": {"query": COLD_QUERY, "k": 3}}
        _rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": args})
        answer = _reply(proc, 2)
        took = time.perf_counter() - t
        if answer.get("error") or answer.get("result", {}).get("isError"):
            raise RuntimeError(f"mcp search failed: {json.dumps(answer)[:300]}")
        return took
    finally:
        proc.kill()
        proc.wait()


def measure_cold(
    index: str,
    runs: int = COLD_RUNS,
    variants: dict[str, str | None] | None = None,
    commands: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    warmup: bool = True,
) -> dict[str, Any]:
    """Median seconds of each command over ``runs`` rounds, and each one's ratio to the floor.

    ``variants``: label → ``PYTHONPATH`` of a checkout to run the commands from (None = this
    one), e.g. ``{"before": "/tmp/old-checkout", "after": None}``: they take turns inside each
    round, so the comparison is side by side. ``commands`` picks a subset (the floors always run).
    """
    variants = variants or {"": None}
    for root in {str(Path(__file__).resolve().parents[2]), *filter(None, variants.values())}:
        compileall.compile_dir(str(Path(root) / "rag_assets"), quiet=1)  # bytecode, as installed
    argvs = cold_commands(index)
    floors = ("python -c pass", FLOOR)
    names = [n for n in argvs if commands is None or n in commands or n in floors]
    jobs = [(label, n) for n in names for label in (variants if n not in floors else [""])]
    timed: dict[tuple[str, str], list[float]] = {j: [] for j in jobs}
    for r in range(0 if warmup else 1, runs + 1):  # round 0: untimed, fills the page cache
        for label, n in jobs:
            env = _env(variants.get(label))
            if n.startswith("mcp "):
                s = _mcp(argvs[n], env, first_call=n == "mcp first call")
            else:
                s = _run(argvs[n], env)
            if r:
                timed[(label, n)].append(s)
        if progress is not None:
            progress(f"cold round {r}/{runs} done")
    med = {j: statistics.median(v) for j, v in timed.items()}
    floor = med[("", FLOOR)]
    rows = {
        (f"{label}: {n}" if label else n): {
            "median_s": round(med[(label, n)], 3),
            "min_s": round(min(timed[(label, n)]), 3),
            "max_s": round(max(timed[(label, n)]), 3),
            "over_import_lancedb": round(med[(label, n)] / floor, 2),
            "goal": COLD_GOALS.get(n),
        }
        for label, n in jobs
    }
    return {
        "index": index,
        "runs": runs,
        "variants": variants,
        "load_average": list(os.getloadavg()),
        "cores": os.cpu_count(),
        "commands": rows,
    }


def cold_text(o: dict[str, Any], title: str = "") -> str:
    load = ", ".join(f"{x:.2f}" for x in o["load_average"])
    lines = [
        title
        or f"cold commands, fresh process each, median of {o['runs']} (load average {load}, "
        f"{o['cores']} cores)",
        f"{'command':34} {'median s':>9} {'min s':>7} {'max s':>7} {'× lancedb':>10} {'goal':>6}",
    ]
    for name, r in o["commands"].items():
        goal = "" if r["goal"] is None else f"≤{r['goal']:g}"
        if r["goal"] is not None and name.endswith("mcp initialize"):
            goal = f"<{r['goal']:g}"
        lines.append(
            f"{name:34} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {r['max_s']:>7.3f} "
            f"{r['over_import_lancedb']:>10.2f} {goal:>6}"
        )
    return "\n".join(lines)


def run_cold_bench(index: str, runs: int = COLD_RUNS) -> tuple[dict[str, Any], str]:
    """``rag-assets bench --cold --index DIR``: the table of :func:`measure_cold`."""
    if "://" not in index and not Path(index).is_dir():
        raise FileNotFoundError(
            f"no index at {index}: pass --index DIR (a published index) or set RAG_INDEX_URI"
        )
    out = measure_cold(index, runs, progress=lambda s: print(s, file=sys.stderr, flush=True))
    return out, cold_text(out)
