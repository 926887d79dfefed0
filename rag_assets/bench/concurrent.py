"""Stress check of issue 25: two ``rag-assets index`` processes started together on one fresh
index (and one fresh Dagster home), ``--rounds`` times; after each round every chunk table and
the documents table must hold each id once, and both runs must exit 0 (the second waits for the
writer lease, ``RAG_LEASE_WAIT``) or the loser must refuse in one line naming the holder.

    python -m rag_assets.bench.concurrent --rounds 20 --documents data/documents

Prints one line a round and a final tally (``duplicates: 0`` is the pass)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _duplicates(index: Path) -> tuple[int, int]:
    """(rows, duplicate ids) over the latest version of every chunk table and documents."""
    from rag_assets.lib.index.maintenance import duplicate_ids
    from rag_assets.lib.index.store import DOCUMENTS_TABLE, IndexStore

    store = IndexStore(index)
    rows = dups = 0
    for name in store.table_names():
        if name.startswith("chunks_") or name == DOCUMENTS_TABLE:
            tbl = store.open_table(name)
            rows += tbl.count_rows()
            dups += duplicate_ids(tbl, "document_id" if name == DOCUMENTS_TABLE else "chunk_id")
    return rows, dups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--documents", type=Path, default=Path("data/documents"))
    ap.add_argument("--wait", default="900", help="RAG_LEASE_WAIT of both runs (seconds)")
    args = ap.parse_args(argv)
    total_dups = failures = 0
    for n in range(1, args.rounds + 1):
        root = Path(tempfile.mkdtemp(prefix="rag-concurrent-"))
        env = {
            **os.environ,
            "RAG_DOCUMENTS_DIR": str(args.documents.resolve()),
            "RAG_INDEX_URI": str(root / "index"),
            "RAG_WORK_DIR": str(root / "work"),
            "RAG_EVAL_DIR": str(root / "no-eval"),
            "DAGSTER_HOME": str(root / "dagster"),  # one fresh instance for both runs
            "RAG_LEASE_WAIT": args.wait,
        }
        (root / "dagster").mkdir()
        t0 = time.monotonic()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "rag_assets.cli", "index", "--quiet"],
                env={**env, "RAG_WORK_DIR": str(root / f"work{i}")},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        outs = [p.communicate() for p in procs]
        codes = [p.returncode for p in procs]
        rows, dups = _duplicates(root / "index")
        again = subprocess.run(
            [sys.executable, "-m", "rag_assets.cli", "index", "--quiet"],
            env=env,
            capture_output=True,
            text=True,
        )
        total_dups += dups
        bad = [c for c in codes if c != 0] + ([again.returncode] if again.returncode else [])
        failures += bool(bad)
        print(
            f"round {n}: exit codes {codes}, re-run {again.returncode}, {rows} rows, "
            f"{dups} duplicate ids, {time.monotonic() - t0:.0f} s",
            flush=True,
        )
        for (out, err), code in zip(outs, codes, strict=True):
            if code:  # the one-line error, or the summary's PIPELINE FAILED line
                lines = (err.strip() or out.strip()).splitlines() or ["?"]
                print("  " + lines[-1], flush=True)
        if again.returncode:
            print("  re-run: " + (again.stderr.strip().splitlines() or ["?"])[-1], flush=True)
        if dups or bad:
            print(f"  kept for inspection: {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"rounds: {args.rounds}, duplicates: {total_dups}, rounds with a failed run: {failures}")
    return 0 if total_dups == 0 and failures == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
