"""``rag-assets bench``: speed ratios measured in one run (:mod:`rag_assets.bench`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rag_assets.commands.common import (
    CliError,
    bounded,
    documents_folder,
    override,
    workers_arg,
)
from rag_assets.settings import Settings

#: commands that encode text: see :data:`rag_assets.cli.DEVICE_COMMANDS`
DEVICE_COMMANDS = frozenset({"bench"})
#: ``--index`` only with --serve / --cold: see :data:`rag_assets.cli.INDEX_OPTIONAL`
INDEX_OPTIONAL = frozenset({"bench"})


def register(sub: Any) -> None:
    """``bench``."""
    b = sub.add_parser("bench", help="side-by-side speed ratios measured in one run")
    b.add_argument(
        "what",
        nargs="?",
        choices=["verify"],
        help="verify: the answer verifier's detection and ms per sentence on --questions SET "
        "over --index (issue 50)",
    )
    b.add_argument("--documents", default=None)  # issue 41: a folder or a source location
    b.add_argument(
        "--queries",
        type=bounded("--queries", 1, 100000),
        default=30,
        help="how many chunk-derived queries",
    )
    b.add_argument("--questions", type=Path, default=None, help="time this question set instead")
    b.add_argument("--json", action="store_true")
    b.add_argument(
        "--serve", action="store_true", help="p50/p95 of /search and /ask over HTTP (--index)"
    )
    b.add_argument(
        "--cold",
        action="store_true",
        help="query commands in fresh processes, as ratios to a bare `import lancedb` (--index)",
    )
    b.add_argument(
        "--index", default=None, help="with --serve / --cold: the published index to query"
    )
    b.add_argument(
        "--workers", type=workers_arg, default=1, help="with --serve: server processes (default 1)"
    )
    b.add_argument(
        "--query-log",
        default=None,
        metavar="on,off",
        help="with --serve: the configured encoder with the query log on and off, side by side",
    )
    b.add_argument(
        "--observe",
        default=None,
        metavar="on,metrics,off",
        help="with --serve: metrics and tracing on (on), metrics alone (metrics) and off, side by "
        "side (issue 52)",
    )
    b.add_argument(
        "--scale",
        type=int,
        action="append",
        metavar="N",
        help="ANN + BM25 at N synthetic chunks (repeatable; e.g. --scale 100000 --scale 1000000)",
    )
    b.add_argument("--sources", action="store_true", help="each source's incremental cost")
    b.add_argument(
        "--day0",
        action="store_true",
        help="issue 53: each benchmark folder's day-0 refusal cut beside its hand-calibrated one",
    )
    b.add_argument(
        "--day0-root",
        type=Path,
        default=Path("~/.cache/rag-assets/bench-day0"),
        help="with --day0: where the folders and their indexes are built (reused)",
    )
    b.add_argument(
        "--answers",
        type=Path,
        default=None,
        metavar="FILE",
        help="with verify: also verify these answers (JSON lines with question and answer)",
    )
    b.add_argument(
        "--first-answer",
        action="store_true",
        help="a fresh `rag-assets index` of --documents and of its first --files N files: "
        "seconds to the first publish and to the adapted publish (issue 51)",
    )
    b.add_argument(
        "--files",
        type=bounded("--files", 1, 1000000),
        action="append",
        metavar="N",
        help="with --first-answer: the small case's file count (repeatable; default 20)",
    )
    b.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    if args.day0:  # issue 53: own vs off-topic answered per folder, day-0 cut vs hand cut
        from rag_assets.bench.day0 import bench as day0_bench

        out, text = day0_bench(args.day0_root)
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    if args.what == "verify":  # issue 50: the answer verifier, no model, per sentence
        from rag_assets.bench.verify import open_index, run_verify_bench

        if args.questions is None:
            raise CliError("bench verify needs --questions SET (a needle set folder)")
        index = open_index(args.index or settings.index_uri, settings)
        out, text = run_verify_bench(index, args.questions, args.answers)
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    if args.first_answer:  # issue 51: time to the first answer and to the adapted one
        from rag_assets.bench.first_answer import run_first_answer_bench

        folder = documents_folder(args.documents or settings.documents_dir)
        out, text = run_first_answer_bench(folder, args.files)
        print(json.dumps(out, indent=2) if args.json else text)
        return 0 if all(r["exit"] == 0 for r in out["rows"]) else 1
    if args.sources:  # issue 41: listed/s and bytes re-read per source, nothing embedded
        from rag_assets.bench.sources import run_sources_bench

        out, text = run_sources_bench(override(settings, documents_dir=args.documents))
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    from rag_assets.bench.speed import run_bench

    if args.cold:  # issue 20: fresh processes, medians beside `python -c pass`, `import lancedb`
        from rag_assets.bench.cold import run_cold_bench

        out, text = run_cold_bench(args.index or settings.index_uri)
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    if args.serve:
        from rag_assets.bench.speed import run_serve_bench

        out, text = run_serve_bench(
            override(settings, index_uri=args.index),
            args.queries,
            args.questions,
            workers=args.workers,
            query_logs=_on_off("--query-log", args.query_log),  # issue 33: the cost of logging
            observe=_on_off("--observe", args.observe, ("on", "metrics", "off")),  # issue 52
        )
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    if getattr(args, "scale", None):  # issue 13: synthetic chunks, no corpus or model load
        from rag_assets.bench.scale import run_scale_bench

        out, text = run_scale_bench(args.scale, settings)
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    documents = documents_folder(args.documents or settings.documents_dir)
    out, text = run_bench(documents, args.queries, settings, args.questions)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def _on_off(
    flag: str, text: str | None, allowed: tuple[str, ...] = ("on", "off")
) -> tuple[str, ...]:
    """``on``, ``off`` or ``on,off`` of a ``bench --serve`` flag (``allowed``: its states):
    the states side by side."""
    if text is None:
        return ()
    states = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    if not states or any(s not in allowed for s in states):
        raise CliError(f"{flag} {text!r}: give one or more of {', '.join(allowed)}")
    return states
