"""``rag-assets``: chunk, index, status, ask, search, eval, bench, rollback.

Reads settings from the environment (``RAG_*``, see README) with flags overriding them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=r".*currently in beta")  # dagster API notices
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        settings = Settings.from_env(os.environ)
        return int(args.func(args, settings) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one clear line, not a traceback, for expected failures
        if os.environ.get("RAG_DEBUG"):
            raise
        print(f"rag-assets: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rag-assets", description=__doc__)
    sub = p.add_subparsers(dest="command")

    c = sub.add_parser("chunk", help="extract and chunk files or folders; print the chunks")
    c.add_argument("paths", nargs="+", type=Path)
    c.add_argument("--strategy", default=None, help="A-F (default RAG_CHUNK_STRATEGY or E)")
    c.add_argument("--target", type=int, default=None, help="content chars per chunk")
    c.add_argument("--jsonl", action="store_true", help="one JSON object per chunk")
    c.set_defaults(func=cmd_chunk)

    i = sub.add_parser("index", help="materialise the whole asset graph through Dagster")
    i.add_argument("--documents", default=None, help="documents folder (RAG_DOCUMENTS_DIR)")
    i.add_argument("--index", default=None, help="index directory (RAG_INDEX_URI)")
    i.add_argument("--quiet", action="store_true", help="no progress bar")
    i.set_defaults(func=cmd_index)

    s = sub.add_parser("status", help="published table, stamps, documents, chunk counts")
    s.add_argument("--index", default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    a = sub.add_parser("ask", help="cited sources for a question, or NO ANSWER")
    a.add_argument("question")
    a.add_argument("--index", default=None)
    a.add_argument("--json", action="store_true")
    a.add_argument("--no-rerank", action="store_true")
    a.set_defaults(func=cmd_ask)

    q = sub.add_parser("search", help="ranked hits of one retriever")
    q.add_argument("query")
    q.add_argument("--index", default=None)
    q.add_argument("--retriever", default="hybrid", choices=["dense", "bm25", "hybrid", "rerank"])
    q.add_argument("-k", type=int, default=20)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_search)

    e = sub.add_parser("eval", help="recall/MRR with intervals, paired tests, refusal sweep")
    e.add_argument("--documents", type=Path, default=None)
    e.add_argument("--questions", type=Path, default=None, help="needle-format folder")
    e.add_argument("--beir", type=Path, default=None, help="BEIR folder instead of --questions")
    e.add_argument("--strategy", default=None)
    e.add_argument("--strategies", default=None, help="comma list, e.g. A,B,C,D,E,F")
    e.add_argument("--target", type=int, default=None)
    e.add_argument("--retrievers", default="dense,bm25,hybrid,rerank")
    e.add_argument("--cache", type=Path, default=None, help="where eval indexes are kept")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_eval)

    b = sub.add_parser("bench", help="side-by-side speed ratios measured in one run")
    b.add_argument("--documents", type=Path, default=None)
    b.add_argument("--queries", type=int, default=30, help="how many chunk-derived queries")
    b.add_argument("--questions", type=Path, default=None, help="time this question set instead")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser("rollback", help="point queries back at the previously published table")
    r.add_argument("--index", default=None)
    r.set_defaults(func=cmd_rollback)
    return p


# -- chunk ----------------------------------------------------------------------------------
def cmd_chunk(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.lib.chunk import chunk_document, strategy
    from rag_assets.lib.extract import extract_document, extract_folder

    strat = strategy(args.strategy or settings.chunk_strategy, args.target or settings.chunk_target)
    docs = []
    for path in args.paths:
        if path.is_dir():
            docs += extract_folder(path).documents
        elif path.exists():
            docs.append(extract_document(path, path.parent))
        else:
            print(f"{path}: no such file or folder", file=sys.stderr)
    rows = []
    for d in docs:
        if not d.ok:
            print(f"FAILED {d.document_id}: {d.reason}", file=sys.stderr)
            continue
        for ch in chunk_document(d, strat):
            row = ch.to_dict()
            if row["page"] is None:
                del row["page"]
            rows.append(row)
    if args.jsonl:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
    else:
        print(f"{'document':28} {'section':28} {'from':>7} {'to':>7}  content")
        for row in rows:
            snippet = row["content"][:60].replace("\n", " ")
            print(
                f"{row['document'][:28]:28} {row['section'][:28]:28} {row['from']:>7} "
                f"{row['to']:>7}  {snippet}"
            )
        print(f"{len(rows)} chunks ({strat.pipeline_version})", file=sys.stderr)
    return 1 if not docs else 0


# -- index ----------------------------------------------------------------------------------
def cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.run import materialize_graph

    settings = _override(settings, documents_dir=args.documents, index_uri=args.index)
    outcome = materialize_graph(settings, progress=not args.quiet)
    print(outcome.summary())
    return 0 if outcome.success else 1


# -- status ---------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.run import status_report

    settings = _override(settings, index_uri=args.index)
    report = status_report(settings)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    pub = report["published"]
    if pub:
        st = pub["stamps"]
        print(f"published: {pub['table']} @ v{pub['version']}  rows={pub['rows']}")
        print(
            f"  model={st['model']} rev={st['revision']} dims={st['dims']} "
            f"pipeline={st['pipeline']} extractor={st['extractor']}"
        )
        print(f"  threshold={pub['threshold']} ({pub['threshold_policy']})")
    else:
        print("published: nothing yet (run `rag-assets index`)")
    for t in report["tables"]:
        print(f"table: {t['table']} rows={t['rows']} version={t['version']}")
    docs = report["documents"]
    print(f"documents: {docs['ok']} ok, {len(docs['failed'])} failed")
    for f in docs["failed"]:
        print(f"  FAILED {f['document']}: {f['reason']}")
    print(f"chunks over the encoder window: {report['chunks_over_window']}")
    print(report["rerank"])
    return 0


# -- ask / search ---------------------------------------------------------------------------
def _open_index(settings: Settings, uri: str | None) -> Any:
    from rag_assets.lib.retrieve import Index

    return Index.open(
        uri or settings.index_uri,
        model=settings.embedding_model or None,
        rerank_model=settings.rerank_model or None,
        distance_cut=settings.cut_override,
    )


def cmd_ask(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.lib.generate import generate_answer

    index = _open_index(settings, args.index)
    ctx = index.ask(args.question, rerank=not args.no_rerank, base_url=settings.base_url or None)
    answer = None
    if not ctx.no_answer and settings.llm_url:
        answer = generate_answer(ctx, settings.llm_url, model=settings.llm_model or None)
    if args.json:
        out = {
            "question": ctx.question,
            "no_answer": ctx.no_answer,
            "threshold": ctx.threshold,
            "citations": [c.to_dict() for c in ctx.citations],
            "prompt": ctx.prompt,
            "answer": answer.to_dict() if answer else None,
        }
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
    if ctx.no_answer:
        print(ctx.message)
        return 0
    if answer:
        print(answer.text, end="\n\n")
    for c in ctx.citations:
        print(
            f"[{c.index}] {c.document_name}  {c.locator_label}  {c.fragment}  "
            f"d={c.cosine_distance:.3f}"
        )
    return 0


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    index = _open_index(settings, args.index)
    hits = index.search(args.query, retriever=args.retriever, k=args.k)
    if args.json:
        print(json.dumps([h.to_dict() for h in hits], indent=2, ensure_ascii=False))
        return 0
    for h in hits:
        where = f"p.{h.page}" if h.page else f"#char={h.start},{h.end}"
        print(
            f"{h.rank:>3} {h.score:8.4f} d={h.cosine_distance:.3f} {h.document_id[:30]:30} "
            f"{h.section[:30]:30} {where}"
        )
    return 0


# -- eval / bench / rollback ----------------------------------------------------------------
def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.run import run_eval

    out, text = run_eval(args, settings)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.bench import run_bench

    documents = args.documents or Path(settings.documents_dir)
    out, text = run_bench(documents, args.queries, settings, args.questions)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def cmd_rollback(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.lib.store import IndexStore

    entry = IndexStore(args.index or settings.index_uri).rollback()
    print(f"published: {entry.table} @ v{entry.version} (threshold {entry.threshold})")
    return 0


def _override(settings: Settings, **values: Any) -> Settings:
    from dataclasses import replace

    changes: dict[str, Any] = {k: str(v) for k, v in values.items() if v is not None}
    return replace(settings, **changes)


if __name__ == "__main__":
    sys.exit(main())
