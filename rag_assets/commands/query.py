"""``rag-assets ask``, ``search`` and ``chunk``: questions to the published index, as the
service answers them, and the chunks a file makes."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from rag_assets.commands.common import (
    INDEX_HELP,
    CliError,
    UsageError,
    bounded,
    override,
    question_arg,
)
from rag_assets.settings import Settings

#: commands that only read an index: see :data:`rag_assets.cli.QUERY_COMMANDS`
QUERY_COMMANDS = frozenset({"ask", "search"})
#: commands that encode text: see :data:`rag_assets.cli.DEVICE_COMMANDS`
DEVICE_COMMANDS = frozenset({"ask", "search"})


def register(sub: Any) -> None:
    """``chunk``, ``ask``, ``search``."""
    from rag_assets.serve.bounds import MAX_K

    c = sub.add_parser("chunk", help="extract and chunk files or folders; print the chunks")
    c.add_argument("paths", nargs="+", type=Path)
    c.add_argument("--strategy", default=None, help="A-F (default RAG_CHUNK_STRATEGY or E)")
    c.add_argument(
        "--target",
        type=bounded("--target", 1, 100000),
        default=None,
        help="content chars per chunk",
    )
    c.add_argument("--jsonl", action="store_true", help="one JSON object per chunk")
    c.set_defaults(func=cmd_chunk)

    a = sub.add_parser(
        "ask",
        help="cited sources for a question, or NO ANSWER",
        usage="%(prog)s [options] question",  # the options: -h (one usage line on an error)
        description="Cited sources for a question, or NO ANSWER when nothing is close enough. "
        "With RAG_LLM_URL set, an answer written from those sources comes first.",
    )
    a.add_argument("question", type=question_arg, help="the question, in quotes")
    a.add_argument("--index", default=None, help=INDEX_HELP)
    a.add_argument("--json", action="store_true", help="sources, quotes and distances as JSON")
    a.add_argument("--no-rerank", action="store_true", help="skip the reranker (RAG_RERANK_MODEL)")
    a.add_argument(
        "--show-nearest",
        action="store_true",
        help="also list the closest sources below the bar (not an answer, never sent to a model)",
    )
    _scope_flags(a)
    a.set_defaults(func=cmd_ask)

    q = sub.add_parser(
        "search", help="ranked hits of one retriever", usage="%(prog)s [options] query"
    )
    q.add_argument("query", type=question_arg, help="the query, in quotes")
    q.add_argument("--index", default=None, help=INDEX_HELP)
    q.add_argument(
        "--retriever",
        default="hybrid",
        choices=["dense", "bm25", "hybrid", "rerank"],
        help="hybrid (default: dense and BM25 fused), dense, bm25 (words only), or rerank",
    )
    q.add_argument("-k", type=_k, default=20, help=f"how many hits, 1..{MAX_K} (default 20)")
    q.add_argument("--json", action="store_true", help="the hits as JSON")
    _scope_flags(q)
    q.set_defaults(func=cmd_search)


def _k(text: str) -> int:
    """argparse type of ``search -k``: 1..MAX_K, refused with the line HTTP and MCP give."""
    from rag_assets.serve.bounds import BadRequest, check_k

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k={text!r} is not a whole number") from None
    try:
        return check_k(value)
    except BadRequest as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _scope_flags(p: argparse.ArgumentParser) -> None:
    """``--filter``, ``--document``, ``--folder``, ``--as`` of ``search`` / ``ask`` (issue 34)."""
    p.add_argument(
        "--filter",
        action="append",
        type=_filter_item,
        metavar="KEY=VALUE",
        help="only documents whose metadata match (repeatable; a key given twice: any of its "
        "values; size/modified also take >=, <=, >, <)",
    )
    p.add_argument("--document", default=None, metavar="ID", help="only this document")
    p.add_argument("--folder", default=None, metavar="PATH", help="only this folder and below")
    p.add_argument(
        "--as",
        dest="as_name",
        default=None,
        metavar="NAME",
        help="see only what the token NAME sees (its groups)",
    )


def _filter_item(text: str) -> str:
    """argparse type of ``--filter``: a malformed item is a usage error (exit 2)."""
    from rag_assets.lib.query.filters import Filter, FilterError

    try:
        Filter.parse([text])
    except FilterError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _scope(args: argparse.Namespace, settings: Settings, index: Any) -> Any:
    """The scope of ``search`` / ``ask``: the filter flags and ``--as NAME``'s groups."""
    from rag_assets.lib.query.filters import Filter, FilterError, Scope
    from rag_assets.serve.access import Access

    try:
        flt = Filter.parse(args.filter or [], document=args.document, folder=args.folder)
    except FilterError as e:
        raise UsageError(str(e)) from None
    groups = None
    if args.as_name:
        groups = Access(index.store, settings.api_token).named(args.as_name).groups
    scope = Scope(flt, groups)
    try:
        index.plan(scope)  # an unknown key is refused here, before anything is searched
    except FilterError as e:
        raise UsageError(str(e)) from None
    return scope


def cmd_chunk(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.lib.ingest.chunk import chunk_document, strategy
    from rag_assets.lib.ingest.extract import extract_document, extract_folder

    strat = strategy(args.strategy or settings.chunk_strategy, args.target or settings.chunk_target)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        raise CliError(f"no such file or folder: {', '.join(missing)} (check the paths given)")
    docs = []
    for path in args.paths:
        if path.is_dir():
            docs += extract_folder(path).documents
        else:
            docs.append(extract_document(path, path.parent))
    if not docs:
        given = ", ".join(map(str, args.paths))
        raise CliError(f"no documents under {given} (the folder is empty: check the paths given)")
    rows = []
    for d in docs:
        if not d.ok or d.status == "partial":  # issue 31: index's words (FAILED, SKIPPED, …)
            print(f"{d.status.upper()} {d.document_id}: {d.reason}", file=sys.stderr)
        if not d.ok:
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
        width = max([len("document"), *(len(r["document"]) for r in rows)])
        print(f"{'document':{width}} {'section':28} {'from':>7} {'to':>7}  content")
        for row in rows:
            snippet = _shorten(row["content"], 60)
            print(
                f"{row['document']:{width}} {_shorten(row['section'], 28):28} {row['from']:>7} "
                f"{row['to']:>7}  {snippet}"
            )
        print(f"{len(rows)} chunks ({strat.pipeline_version})", file=sys.stderr)
    return 0


def _shorten(text: str, width: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``width`` characters with "…"."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def _open_index(settings: Settings, uri: str | None) -> Any:
    """The published version, queried as the service does: the query encoder of
    ``RAG_QUERY_ENCODER`` (default the exact ONNX export: no torch, no sentence-transformers),
    the reranker, the answer check, the fusion and the query rewriter of the settings."""
    from rag_assets.lib.index.onnx_encoder import query_embedder
    from rag_assets.lib.query.judge import apply_judge, llm_options
    from rag_assets.lib.query.rerank import load_reranker
    from rag_assets.lib.query.retrieve import Index, require_published

    settings = override(settings, index_uri=uri)
    require_published(settings.index_uri)  # before the encoder: its first export needs torch
    embedder, _ = query_embedder(settings, warn=lambda m: warnings.warn(m, stacklevel=2))
    index = Index.open(
        settings.index_uri,
        model=settings.embedding_model or None,
        rerank_model=settings.rerank_model or None,
        distance_cut=settings.cut_override,
        embedder=embedder,
        reranker=load_reranker(settings.rerank_model or None, **llm_options(settings)),
    )
    apply_judge(index, settings)  # RAG_ANSWER_CHECK=llm: the judge and its calibrated cuts
    if settings.source_presign_seconds and not settings.base_url:  # issue 49: private objects
        from rag_assets.lib.ingest.sources.objects import presigner

        index.presign = presigner(settings.source_presign_seconds)
    return index


#: said once per ``ask`` without ``RAG_LLM_URL`` (on stderr: ``--json`` stays one JSON document)
NO_LLM_NOTE = (
    "rag-assets: note: sources only; a written answer needs a local model: set RAG_LLM_URL to an "
    "OpenAI-compatible server (e.g. http://127.0.0.1:8080/v1)"
)


def cmd_ask(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.commands.traffic import flush_cli_log

    try:
        return _ask(args, settings)
    finally:
        flush_cli_log()  # issue 33: the query log entry, written after the answer is out


def _ask(args: argparse.Namespace, settings: Settings) -> int:
    import time

    from rag_assets.commands.traffic import record_cli_ask
    from rag_assets.lib.query.generate import generate_answer

    started = time.perf_counter()
    index = _open_index(settings, args.index)
    hits: list[Any] = []
    scope = _scope(args, settings, index)  # issue 34: --filter, --document, --folder, --as
    ctx = index.ask(
        args.question,
        rerank=not args.no_rerank,
        base_url=settings.base_url or None,
        show_nearest=args.show_nearest,  # issue 31: below the bar, never in the prompt
        scope=scope,
        hits_out=hits,
    )
    note = _rerank_note(index)  # issue 35: a /rerank server that failed (the hybrid order kept)
    answer = verification = None
    if not ctx.no_answer and not settings.llm_url:
        print(NO_LLM_NOTE, file=sys.stderr)
    if not ctx.no_answer and settings.llm_url:
        answer = generate_answer(
            ctx,
            settings.llm_url,
            model=settings.llm_model or None,
            api_key=settings.llm_api_key or None,  # RAG_LLM_API_KEY: bearer token, never printed
        )
        ctx = index.ground(ctx, answer.text)  # spans re-chosen by the answer's claims
        from rag_assets.lib.query.verify import second_opinion_of, verify_generated

        ctx, answer, verification = verify_generated(  # issue 50: RAG_ANSWER_VERIFY
            index,
            ctx,
            answer,
            settings.answer_verify,
            second_opinion_of(settings),
            args.show_nearest,
        )
    query_id = record_cli_ask(index, args.question, ctx, hits, started, settings)
    if args.json:
        from rag_assets.lib.query.output import ask_json, dumps

        notes = [note] if note else None
        out = ask_json(
            ctx, answer, index.published, notes, verification, index_version=index.index_version
        )
        print(dumps(out | {"query_id": query_id}))
        return 0
    from rag_assets.lib.query.output import cut_note
    from rag_assets.lib.query.plain import ask_lines

    # issue 31: links that open (RAG_BASE_URL's view, else path:LINE), how close a refusal came;
    # issue 53: an answer from a cut no question set checked says so
    text = answer.text if answer else None
    note = cut_note(index.published)
    for line in ask_lines(ctx, text, settings.base_url or None, verification, note):
        print(line)
    return 0


def _rerank_note(index: Any) -> str | None:
    """Say on stderr (``--json`` stays one document) why a /rerank server's order is missing."""
    from rag_assets.lib.query.rerank_http import take_note

    note = take_note(index.reranker)
    if note:
        print(f"rag-assets: note: {note}", file=sys.stderr)
    return note


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    index = _open_index(settings, args.index)
    scope = _scope(args, settings, index)  # issue 34: --filter, --document, --folder, --as
    hits = index.search(args.query, retriever=args.retriever, k=args.k, scope=scope)
    _rerank_note(index)  # issue 35: a /rerank server that failed (the hybrid order kept)
    if args.json:
        from rag_assets.lib.query.output import dumps, search_json

        print(dumps(search_json(hits, index, args.query, settings.base_url or None)))
        return 0
    from rag_assets.lib.query.output import cite_search_hits
    from rag_assets.lib.query.plain import search_lines

    cited = cite_search_hits(index, args.query, hits, settings.base_url or None)
    for line in search_lines(hits, cited, settings.base_url or None):  # issue 31: + the quote
        print(line)
    return 0


#: issue 50: what ``rag-assets verify`` shares with ``ask``: the index opened as the service
#: opens it, the scope of the filter flags and ``--as``, and those flags
open_index, scope_of, scope_flags = _open_index, _scope, _scope_flags
