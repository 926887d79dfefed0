"""rag-assets: index a folder of documents, then ask it questions with cited sources.

Reads settings from the environment (RAG_*, see docs/settings.md); flags override them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings

#: exit status after the reader of stdout went away (``… | head``): what a process killed by
#: SIGPIPE reports in a shell (128 + 13), quietly, as Unix tools do
EXIT_BROKEN_PIPE = 141

#: a message that already says what to change (a setting, a flag or a command) gets no hint
_NAMES_A_FIX = re.compile(r"RAG_[A-Z_]+|(^|\s)--[a-z]|`rag-assets ")


class CliError(Exception):
    """An expected failure: its message is the one line printed (cause and what to change)."""


class UsageError(ValueError):
    """A flag the index refuses (an unknown filter key): printed as a usage error, exit 2."""


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=r".*currently in beta")  # dagster API notices
    debug = os.environ.get("RAG_DEBUG", "") not in ("", "0")
    if not debug:
        warnings.showwarning = _warning_line
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        settings = Settings.from_env(os.environ)
        if args.command in DEVICE_COMMANDS:
            _check_device(settings)  # issue 30: before any work, even where torch is not used
        if hasattr(args, "index"):
            query = args.command in QUERY_COMMANDS or bool(getattr(args, "serve", False))
            _check_index_dir(args.index or settings.index_uri, must_exist=query)
        code = int(args.func(args, settings) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        return 130
    except UsageError as e:  # issue 34: a filter with an unknown key, checked against the index
        print(f"rag-assets {args.command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    except Exception as e:  # one clear line, not a traceback, for expected failures
        if debug:
            raise
        print(f"rag-assets: error: {_error_line(e, args)}", file=sys.stderr)
        return 1


def _error_line(e: BaseException, args: argparse.Namespace) -> str:
    """The cause on one line, plus the setting or flag to change where the message lacks one."""
    if isinstance(e, OSError) and e.strerror and e.filename:  # "[Errno 17] File exists: 'x'"
        msg = f"{e.strerror}: {e.filename}"
    else:
        msg = " ".join(str(e).split())
    expected = isinstance(e, CliError | OSError | ValueError | RuntimeError)
    if not expected or not msg:
        msg = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    if isinstance(e, CliError) or _NAMES_A_FIX.search(msg):
        return msg
    path = str(getattr(e, "filename", "") or msg)
    index = getattr(args, "index", None) or os.environ.get("RAG_INDEX_URI", "data/index")
    if isinstance(e, OSError) and str(index) in path:
        return f"{msg} (the index directory: check --index or RAG_INDEX_URI)"
    return f"{msg} (RAG_DEBUG=1 shows the traceback)"


def _warning_line(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """Warnings as one line each (``RAG_DEBUG=1`` keeps Python's file:line form)."""
    text = " ".join(str(message).split())
    print(f"rag-assets: warning: {text}", file=sys.stderr)


def _stdout_to_devnull() -> None:
    """After a broken pipe, point stdout at /dev/null so the final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (embedded or captured stdout)
        pass


def _question(text: str) -> str:
    """argparse type of ``ask``/``search`` questions: blank text is a usage error (exit 2)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            'the question is empty or only whitespace: give it in quotes, e.g. "how do I roll back"'
        )
    from rag_assets.lib.ingest.validate import text_problem

    problem = text_problem(text, "the question")  # issue 25: lone surrogates, control chars
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


INDEX_HELP = "index directory (default RAG_INDEX_URI, else data/index)"

#: commands that only read an index: they refuse a missing directory instead of creating it
QUERY_COMMANDS = frozenset(
    {
        "status",
        "ask",
        "search",
        "rollback",
        "serve",
        "mcp",
        "compact",
        "token",
        "log",
        "review",
        "replay",
    }
)


def _k(text: str) -> int:
    """argparse type of ``search -k``: 1..MAX_K, refused with the line HTTP and MCP give."""
    from rag_assets.serve.service import BadRequest, check_k

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k={text!r} is not a whole number") from None
    try:
        return check_k(value)
    except BadRequest as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _workers(text: str) -> int:
    """argparse type of ``serve --workers``: a positive whole number."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: give a whole number, 1 or more")
    return value


#: commands that encode text (documents or queries): an explicit ``RAG_DEVICE`` this machine
#: does not have is refused in one line before they start (issue 30)
DEVICE_COMMANDS = frozenset({"index", "ask", "search", "serve", "mcp", "eval", "backfill", "bench"})


def _check_device(settings: Settings) -> None:
    """``RAG_DEVICE=cuda`` (or ``cuda:N``, ``mps``) on a machine without it: one line naming
    the setting, from :func:`rag_assets.lib.index.embed.resolve_device`. ``auto`` and ``cpu``
    are not checked (no torch import on the query path)."""
    if settings.device.strip().lower() in ("", "auto", "cpu"):
        return
    from rag_assets.lib.index.embed import resolve_device

    resolve_device(settings.device)


def _bounded(flag: str, lo: int, hi: int) -> Any:
    """argparse type of a whole-number flag within ``lo..hi`` (issue 30: every flag checked)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: give a whole number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{flag} {value}: give a number from {lo} to {hi}")
        return value

    return parse


def _check_index_dir(uri: str, must_exist: bool = False) -> None:
    """An index path that exists must be a folder (a URI such as ``s3://…`` is not checked)."""
    if "://" in str(uri):
        return
    path = Path(uri).expanduser()
    if path.exists() and not path.is_dir():
        raise CliError(
            f"index directory is a file, not a folder: {path} (pass --index DIR or set "
            "RAG_INDEX_URI)"
        )
    if must_exist and not path.exists():  # a query never creates anything
        raise CliError(
            f"no index at {path}: the directory does not exist (pass --index DIR or set "
            "RAG_INDEX_URI to an indexed directory; `rag-assets index` builds one)"
        )


def _documents_folder(path: str | Path, flag: str = "--documents") -> Path:
    """A documents folder that exists and holds files, else a one-line :class:`CliError`."""
    from rag_assets.lib.ingest.extract import _list_files

    folder = Path(path).expanduser()
    fix = f"pass {flag} DIR or set RAG_DOCUMENTS_DIR"
    if not folder.exists():
        raise CliError(f"documents folder not found: {folder} ({fix})")
    if not folder.is_dir():
        raise CliError(f"documents folder is a file, not a folder: {folder} ({fix})")
    if not _list_files(folder):
        raise CliError(f"documents folder is empty: {folder} (add documents, or {fix})")
    return folder


def _parser() -> argparse.ArgumentParser:
    from rag_assets import __version__
    from rag_assets.serve.service import MAX_K

    p = argparse.ArgumentParser(
        prog="rag-assets", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"rag-assets {__version__}")
    sub = p.add_subparsers(dest="command")

    c = sub.add_parser("chunk", help="extract and chunk files or folders; print the chunks")
    c.add_argument("paths", nargs="+", type=Path)
    c.add_argument("--strategy", default=None, help="A-F (default RAG_CHUNK_STRATEGY or E)")
    c.add_argument(
        "--target",
        type=_bounded("--target", 1, 100000),
        default=None,
        help="content chars per chunk",
    )
    c.add_argument("--jsonl", action="store_true", help="one JSON object per chunk")
    c.set_defaults(func=cmd_chunk)

    i = sub.add_parser("index", help="materialise the whole asset graph through Dagster")
    i.add_argument("--documents", default=None, help="documents folder (RAG_DOCUMENTS_DIR)")
    i.add_argument("--index", default=None, help="index directory (RAG_INDEX_URI)")
    i.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (else bars on a terminal, one line per finished stage otherwise)",
    )
    i.add_argument(
        "--force-folder",
        action="store_true",
        help="replace the documents folder the index is built from (RAG_FORCE_FOLDER=1)",
    )
    i.set_defaults(func=cmd_index)

    ad = sub.add_parser(
        "adapt",
        help="train the encoder on the corpus (asset adapted_encoder): one run",
        description="Fine-tune the configured encoder on this corpus's own sentences (issue 32); "
        "the model is stored with the index and proposed only when it beats its base on "
        "held-out sentences. Unless RAG_ADAPT=off the next `rag-assets index` embeds with it.",
    )
    ad.add_argument("--documents", default=None, help="documents folder (RAG_DOCUMENTS_DIR)")
    ad.add_argument("--index", default=None, help="index directory (RAG_INDEX_URI)")
    ad.add_argument(
        "--force", action="store_true", help="retrain now, whatever RAG_ADAPT_RETRAIN says"
    )
    ad.add_argument(
        "--steps", type=int, default=None, help="training steps (RAG_ADAPT_STEPS; 0 = auto)"
    )
    ad.add_argument("--json", action="store_true", help="the asset's metadata as JSON")
    ad.set_defaults(func=cmd_adapt)

    s = sub.add_parser("status", help="published table, stamps, documents, chunk counts")
    s.add_argument("--index", default=None, help=INDEX_HELP)
    s.add_argument("--json", action="store_true", help="the report as JSON")
    s.set_defaults(func=cmd_status)

    a = sub.add_parser(
        "ask",
        help="cited sources for a question, or NO ANSWER",
        usage="%(prog)s [options] question",  # the options: -h (one usage line on an error)
        description="Cited sources for a question, or NO ANSWER when nothing is close enough. "
        "With RAG_LLM_URL set, an answer written from those sources comes first.",
    )
    a.add_argument("question", type=_question, help="the question, in quotes")
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
    q.add_argument("query", type=_question, help="the query, in quotes")
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

    e = sub.add_parser("eval", help="recall/MRR with intervals, paired tests, refusal sweep")
    e.add_argument("--documents", type=Path, default=None)
    e.add_argument("--questions", type=Path, default=None, help="needle-format folder")
    e.add_argument("--beir", type=Path, default=None, help="BEIR folder instead of --questions")
    e.add_argument("--strategy", default=None)
    e.add_argument("--strategies", default=None, help="comma list, e.g. A,B,C,D,E,F")
    e.add_argument("--target", type=_bounded("--target", 1, 100000), default=None)
    e.add_argument("--retrievers", default="dense,bm25,hybrid,rerank")
    e.add_argument(
        "--cache",
        default=None,
        help="where eval indexes are kept: a folder, or an object-store URI (s3://bucket/prefix)",
    )
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_eval)

    b = sub.add_parser("bench", help="side-by-side speed ratios measured in one run")
    b.add_argument("--documents", default=None)  # issue 41: a folder or a source location
    b.add_argument(
        "--queries",
        type=_bounded("--queries", 1, 100000),
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
        "--workers", type=_workers, default=1, help="with --serve: server processes (default 1)"
    )
    b.add_argument(
        "--query-log",
        default=None,
        metavar="on,off",
        help="with --serve: the configured encoder with the query log on and off, side by side",
    )
    b.add_argument(
        "--scale",
        type=int,
        action="append",
        metavar="N",
        help="ANN + BM25 at N synthetic chunks (repeatable; e.g. --scale 100000 --scale 1000000)",
    )
    b.add_argument("--sources", action="store_true", help="each source's incremental cost")
    b.set_defaults(func=cmd_bench)

    bf = sub.add_parser(
        "backfill", help="re-embed in batches: one Dagster run per batch through the run queue"
    )
    bf.add_argument("--documents", default=None, help="documents folder (RAG_DOCUMENTS_DIR)")
    bf.add_argument("--index", default=None, help=INDEX_HELP)
    bf.add_argument(
        "--batch-rows",
        type=_bounded("--batch-rows", 1, 100000000),
        default=None,
        help="chunks per batch run",
    )
    bf.add_argument("--no-wait", action="store_true", help="launch the runs and return")
    bf.set_defaults(func=cmd_backfill)

    r = sub.add_parser("rollback", help="point queries back at the previously published table")
    r.add_argument("--index", default=None, help=INDEX_HELP)
    r.add_argument("--to", default=None, metavar="VERSION", help="VERSION or TABLE@VERSION")
    r.set_defaults(func=cmd_rollback)

    cp = sub.add_parser(
        "compact", help="compact LanceDB tables; drop versions no published entry points to"
    )
    cp.add_argument("--index", default=None)
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(func=cmd_compact)

    rp = sub.add_parser(
        "repair", help="remove duplicate chunk/document ids (older versions stay intact)"
    )
    rp.add_argument("--index", default=None)
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_repair)

    qg = sub.add_parser("questions", help="write a needle-format question set with the model")
    qg.add_argument("--documents", type=Path, default=None, help="corpus folder")
    qg.add_argument("--out", type=Path, default=None, help="folder for the question set")
    qg.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy the index's current evaluation set (generated by eval_questions) to DIR to "
        "review: edit or strike rows, then point RAG_EVAL_DIR at DIR (a reviewed set wins)",
    )
    qg.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="DIR",
        help="check the question set in DIR against --documents (default RAG_DOCUMENTS_DIR): "
        "every bad row and every needle not found byte for byte, with the nearest text",
    )
    qg.add_argument("--index", default=None, help="index of --export (default RAG_INDEX_URI)")
    qg.add_argument(
        "--n", type=_bounded("--n", 1, 100000), default=32, help="needle questions (default 32)"
    )
    qg.add_argument("--seed", type=_bounded("--seed", 0, 4294967295), default=0)
    qg.set_defaults(func=cmd_questions)

    sv = sub.add_parser("serve", help="HTTP API, search page and MCP over the published index")
    sv.add_argument("--index", default=None, help=INDEX_HELP)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default local)")
    sv.add_argument(
        "--port", type=_bounded("--port", 1, 65535), default=8000, help="port (default 8000)"
    )
    sv.add_argument(
        "--workers",
        type=_workers,
        default=1,
        help="server processes sharing the port and the index (default 1; about one per core)",
    )
    sv.set_defaults(func=cmd_serve)

    u = sub.add_parser(
        "ui",
        help="the Dagster UI of an index, with the runs `rag-assets index` recorded",
        description="dagster dev on the index's own Dagster instance (<index>/.rag-work/dagster, "
        "or DAGSTER_HOME): its asset graph, checks and runs. Ctrl-C or SIGTERM stops it with "
        "its webserver, daemon and code servers.",
    )
    u.add_argument("--index", default=None, help=INDEX_HELP)
    u.add_argument("--port", type=int, default=None, help="webserver port (default 3000)")
    u.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    u.set_defaults(func=cmd_ui)

    m = sub.add_parser("mcp", help="the MCP tools (search, ask, get_document_span) over stdio")
    m.add_argument("--index", default=None, help=INDEX_HELP)
    m.add_argument(
        "--token",
        default=None,
        help="answer as this token's groups (default RAG_TOKEN, else the local operator: all)",
    )
    m.set_defaults(func=cmd_mcp)

    tk = sub.add_parser("token", help="API tokens of the index: add, list, revoke")
    on_index = argparse.ArgumentParser(add_help=False)
    on_index.add_argument("--index", default=None, help=INDEX_HELP)
    tks = tk.add_subparsers(dest="action", required=True)
    tka = tks.add_parser(
        "add", parents=[on_index], help="make a token (printed once; only its hash is kept)"
    )
    tka.add_argument("name", help="who holds it (letters, digits, _ . -)")
    tka.add_argument(
        "--groups", default="", help="comma-separated groups whose documents it may see"
    )
    tkl = tks.add_parser("list", parents=[on_index], help="every token: groups, made, revoked")
    tkl.add_argument("--json", action="store_true", help="the tokens as JSON")
    tkr = tks.add_parser(
        "revoke", parents=[on_index], help="refuse a token from the next request on"
    )
    tkr.add_argument("name")
    tk.set_defaults(func=cmd_token)
    _traffic_parsers(sub)  # issue 33: log, review, replay
    return p


def _traffic_parsers(sub: Any) -> None:
    """Issue 33: ``log list|purge|gaps``, ``review`` and ``replay``."""
    lg = sub.add_parser("log", help="the query log kept with the index: list, purge, gaps")
    logs = lg.add_subparsers(dest="log_command")
    ll = logs.add_parser("list", help="the newest logged queries")
    ll.add_argument("--index", default=None, help=INDEX_HELP)
    ll.add_argument("--unreviewed", action="store_true", help="only those without a verdict")
    ll.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    ll.add_argument("--json", action="store_true", help="entries with hits, citations, history")
    lp = logs.add_parser("purge", help="remove entries (and their verdicts) by date or id")
    lp.add_argument("--index", default=None, help=INDEX_HELP)
    lp.add_argument("--before", default=None, metavar="DATE", help="asked before DATE (UTC)")
    lp.add_argument("--id", action="append", default=[], metavar="ID", help="a query id")
    lgp = logs.add_parser("gaps", help="refused questions grouped by similarity, most asked first")
    lgp.add_argument("--index", default=None, help=INDEX_HELP)
    lgp.add_argument("--json", action="store_true")
    lg.set_defaults(func=cmd_log)

    rv = sub.add_parser("review", help="review logged queries in the terminal, one key a verdict")
    rv.add_argument("--index", default=None, help=INDEX_HELP)
    rv.add_argument("--limit", type=int, default=0, help="at most this many (default all)")
    rv.set_defaults(func=cmd_review)

    rp = sub.add_parser("replay", help="replay the logged questions on a candidate table/fusion")
    rp.add_argument("--index", default=None, help=INDEX_HELP)
    rp.add_argument("--candidate", default=None, metavar="TABLE@VERSION")
    rp.add_argument("--fusion", default=None, help="the fusion to try (default RAG_FUSION)")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_replay)


def cmd_log(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets import traffic_commands as tc

    uri = getattr(args, "index", None) or settings.index_uri
    if args.log_command == "purge":
        print(tc.log_purge(uri, args.before, args.id))
    elif args.log_command == "list":
        print(tc.log_list(uri, args.unreviewed, args.limit, args.json))
    elif args.log_command == "gaps":
        print(tc.log_gaps(settings, uri, args.json))
    else:
        raise CliError("log needs a command: list, purge or gaps (rag-assets log --help)")
    return 0


def _query_logs(text: str | None) -> tuple[str, ...]:
    """``bench --serve --query-log on,off``: the log states to time side by side."""
    if text is None:
        return ()
    states = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    if not states or any(s not in ("on", "off") for s in states):
        raise CliError(f"--query-log {text!r}: give on, off or on,off")
    return states


def cmd_review(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.traffic_commands import review

    return review(settings, args.index or settings.index_uri, args.limit)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.traffic_commands import replay_command

    out = replay_command(
        settings, args.index or settings.index_uri, args.candidate, args.fusion, args.json
    )
    print(out)
    return 0


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


# -- chunk ----------------------------------------------------------------------------------
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


# -- index ----------------------------------------------------------------------------------
def cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    # issue 31: a bad question set is reported in the first second, before Dagster is imported
    # (the folder given here; else the index's recorded folder, once it is read, below)
    given_folder = bool(args.documents or os.environ.get("RAG_DOCUMENTS_DIR"))
    if given_folder:
        _precheck_questions(_override(settings, documents_dir=args.documents))
    from rag_assets.defs.build import given_in, source_specs_of
    from rag_assets.runner import check_folder, index_settings, materialize_graph

    force = "1" if args.force_folder else None
    settings = _override(
        settings, documents_dir=args.documents, index_uri=args.index, force_folder=force
    )
    # issue 22: the index's recorded folder and strategy fill in what neither the environment
    # nor --documents gives, as in the code location; another folder is refused before Dagster
    given = given_in(os.environ) | ({"documents_dir"} if args.documents else set())
    settings = index_settings(settings, given)
    if source_specs_of(settings) is None:  # issue 41: sources are listed by the run itself
        _documents_folder(settings.documents_dir)
    check_folder(settings)
    if not given_folder:
        _precheck_questions(settings)  # issue 31: fails now, not after the pipeline
    outcome = materialize_graph(
        settings,
        progress=not args.quiet and sys.stderr.isatty(),  # no bar frames in a log file
        log_level="WARNING" if os.environ.get("RAG_DEBUG") else "CRITICAL",
        stage_lines=not args.quiet,  # issue 31: else one line per stage as it ends
    )
    print(outcome.summary())
    return 0 if outcome.success else 1


def cmd_adapt(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 32: one run of ``adapt_job`` (rag_assets/runner.py, :func:`run_adapt`)."""
    from rag_assets.defs.build import given_in
    from rag_assets.runner import check_folder, index_settings, run_adapt

    if args.steps is not None and args.steps < 0:
        raise CliError(f"--steps {args.steps}: give 0 (one epoch) or a positive number")
    settings = _override(settings, documents_dir=args.documents, index_uri=args.index)
    if args.steps is not None:
        from dataclasses import replace

        settings = replace(settings, adapt_steps=args.steps)
    given = given_in(os.environ) | ({"documents_dir"} if args.documents else set())
    settings = index_settings(settings, given)
    _documents_folder(settings.documents_dir)
    check_folder(settings)
    ok, md, text = run_adapt(
        settings,
        force=args.force,
        log_level="WARNING" if os.environ.get("RAG_DEBUG") else "CRITICAL",
        progress=sys.stderr.isatty(),  # issue 44: bars on a terminal, else timed lines
        stage_lines=True,
    )
    if not ok:
        raise CliError(text)
    shown = {k: v for k, v in md.items() if k != "loss_plot"}  # an inline PNG
    print(json.dumps(shown, indent=2, default=str) if args.json else text)
    return 0


# -- status ---------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.runner import status_report
    from rag_assets.ui import runs_report

    settings = _override(settings, index_uri=args.index)
    report = status_report(settings)
    report["runs"] = runs_report(settings, os.environ)  # issue 31: the index's own runs
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
        if pub.get("evaluation") == "unevaluated":  # issue 11: no question set fits this corpus
            print(f"  UNEVALUATED: {pub.get('evaluation_note')}")
        print(f"  cut source: {pub.get('threshold_source') or 'not recorded'}")
        if pub.get("threshold_warning"):  # issue 30: e.g. a folder too uniform to separate
            print(f"  WARNING: {pub['threshold_warning']}")
        counts = pub.get("evaluation_counts") or {}
        detail = ", ".join(f"{v} {k}" for k, v in counts.items() if k != "wanted")
        print(
            f"  evaluated on: {pub.get('evaluation_source') or 'not recorded'}"
            + (f" ({detail})" if detail else "")
        )
    else:
        print("published: nothing yet (run `rag-assets index`)")
    _print_query_log(report.get("query_log"))
    for t in report["tables"]:
        print(f"table: {t['table']} rows={t['rows']} version={t['version']}")
    docs = report["documents"]
    if docs["ok"] is None:
        where = docs["of"] or "this index"
        print(f"documents: unknown (no manifest stored with {where}; re-index)")
    else:
        print(
            f"documents: {docs['ok']} ok, {len(docs['failed'])} failed, "
            f"{len(docs.get('skipped', []))} skipped (of {docs['of']})"
        )
    src = report.get("source")  # issue 22: what the index is built from
    if src:
        print(f"  built from: {src['documents']} (strategy {src['strategy']})")
    for line in report.get("sources", []):  # issue 41: each source, ok or stale since when
        print(f"  {line}")
    rows = docs.get("list")
    if rows:  # issue 22: every document, its state, its rows and its reason
        width = max(len(one_line(r["document"])) for r in rows)
        print(f"  {'state':8} {'chunks':>6}  document")
        for r in rows:
            state = "ok" if r["state"] == "ok" else r["state"].upper()
            why = f": {one_line(r['reason'])}" if r["reason"] else ""
            print(f"  {state:8} {r['chunks']:>6}  {one_line(r['document']):{width}}{why}".rstrip())
    else:
        for f in docs["failed"]:
            print(f"  FAILED {one_line(f['document'])}: {one_line(f['reason'])}")
        for f in docs.get("partial", []):
            print(f"  PARTIAL {one_line(f['document'])}: {one_line(f['reason'])}")
        for f in docs.get("skipped", []):
            print(f"  SKIPPED {one_line(f['document'])}: {one_line(f['reason'])}")
    over = report["chunks_over_window"]
    print(f"chunks over the encoder window: {'not recorded' if over is None else over}")
    stack = report.get("rollback_stack", [])
    if stack:
        n = len(report["history"])
        print(f"rollback stack (newest first; {n} history entr{'y' if n == 1 else 'ies'}):")
        for e in stack:
            mark = "*" if e["current"] else " "
            print(
                f"  {mark} {e['table']}@{e['version']}  rows={e['rows']}  "
                f"threshold={e['threshold']}  published {e['published_at']}"
            )
    print(report["rerank"])
    from rag_assets.lib.index.adapted import status_lines

    for line in status_lines(report.get("adaptation")):  # issue 32
        print(line)
    _print_runs(report["runs"])
    return 0


def _print_query_log(q: dict[str, Any] | None) -> None:
    """Issue 33: the query log's line and what reviewed traffic still needs."""
    if not q:
        return
    if not q["enabled"]:
        print(f"query log: off (RAG_QUERY_LOG=off); {q['entries']} entries kept")
        return
    from rag_assets.lib.evaluate.traffic import progress_line

    if q.get("damaged"):  # issue 43: a log that cannot be read or set aside (object storage)
        print(q["damaged"])
        return
    print(f"query log: {q['entries']} entries; {progress_line(q['calibration'])}")


def _print_runs(runs: dict[str, Any]) -> None:
    """Issue 31: where this index's runs are recorded, and the command that shows them."""
    n = runs["index_runs"]
    where = runs["dagster_home"]
    if n is None:
        print(f"runs: none recorded yet in {where}")
    else:
        print(f"runs: {n} run{'' if n == 1 else 's'} of index_job in {where}")
    print(f"  the UI with them: {runs['ui_command']}")


# -- ask / search ---------------------------------------------------------------------------
def _open_index(settings: Settings, uri: str | None) -> Any:
    """The published version, queried as the service does: the query encoder of
    ``RAG_QUERY_ENCODER`` (default the exact ONNX export: no torch, no sentence-transformers),
    the reranker, the answer check, the fusion and the query rewriter of the settings."""
    from rag_assets.lib.index.onnx_encoder import query_embedder
    from rag_assets.lib.query.judge import apply_judge, llm_options
    from rag_assets.lib.query.rerank import load_reranker
    from rag_assets.lib.query.retrieve import Index, require_published

    settings = _override(settings, index_uri=uri)
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
    return index


#: said once per ``ask`` without ``RAG_LLM_URL`` (on stderr: ``--json`` stays one JSON document)
NO_LLM_NOTE = (
    "rag-assets: note: sources only; a written answer needs a local model: set RAG_LLM_URL to an "
    "OpenAI-compatible server (e.g. http://127.0.0.1:8080/v1)"
)


def cmd_ask(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.traffic_commands import flush_cli_log

    try:
        return _ask(args, settings)
    finally:
        flush_cli_log()  # issue 33: the query log entry, written after the answer is out


def _ask(args: argparse.Namespace, settings: Settings) -> int:
    import time

    from rag_assets.lib.query.generate import generate_answer
    from rag_assets.traffic_commands import record_cli_ask

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
    answer = None
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
    query_id = record_cli_ask(index, args.question, ctx, hits, started, settings)
    if args.json:
        from rag_assets.lib.query.output import ask_json, dumps

        notes = [note] if note else None
        print(dumps(ask_json(ctx, answer, index.published, notes) | {"query_id": query_id}))
        return 0
    from rag_assets.lib.query.plain import ask_lines

    # issue 31: links that open (RAG_BASE_URL's view, else path:LINE), how close a refusal came
    for line in ask_lines(ctx, answer.text if answer else None, settings.base_url or None):
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


# -- eval / bench / rollback ----------------------------------------------------------------
def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.runner import run_eval

    if not args.beir:
        _documents_folder(args.documents or settings.documents_dir)
    out, text = run_eval(args, settings)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    if args.sources:  # issue 41: listed/s and bytes re-read per source, nothing embedded
        from rag_assets.bench.sources import run_sources_bench

        out, text = run_sources_bench(_override(settings, documents_dir=args.documents))
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
            _override(settings, index_uri=args.index),
            args.queries,
            args.questions,
            workers=args.workers,
            query_logs=_query_logs(args.query_log),  # issue 33: the cost of logging
        )
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    if getattr(args, "scale", None):  # issue 13: synthetic chunks, no corpus or model load
        from rag_assets.bench.scale import run_scale_bench

        out, text = run_scale_bench(args.scale, settings)
        print(json.dumps(out, indent=2) if args.json else text)
        return 0
    documents = _documents_folder(args.documents or settings.documents_dir)
    out, text = run_bench(documents, args.queries, settings, args.questions)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def _export_questions(dest: Path, index_uri: str) -> int:
    """Copy the generated evaluation set of an index for review (``questions --export``); on
    object storage it is read from the index's ``_rag_files`` rows."""
    from rag_assets.lib.index.store import IndexStore, is_remote

    files: dict[str, bytes] = {}
    if is_remote(index_uri) or Path(index_uri).expanduser().is_dir():
        store = IndexStore(index_uri if is_remote(index_uri) else Path(index_uri).expanduser())
        for name in ("questions.jsonl", "out_of_domain.jsonl", "provenance.json"):
            data = store.read_file(f"evaluation/generated/{name}")
            if data is not None:
                files[name] = data
    if "questions.jsonl" not in files:
        raise FileNotFoundError(
            f"{index_uri} has no generated evaluation set (it is written when RAG_LLM_URL is set "
            "and no question set at RAG_EVAL_DIR belongs to the corpus)"
        )
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"--export {dest}: the folder is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (dest / name).write_bytes(data)
        print(dest / name)
    print(f"review the rows, then: RAG_EVAL_DIR={dest} rag-assets index (source: reviewed)")
    return 0


def _check_questions(folder: Path, documents: Path) -> int:
    """``questions --check DIR``: each bad row and each needle not found, then one summary
    line; exit 1 when the set has a problem."""
    from rag_assets.lib.evaluate.question_check import check_question_set

    if not folder.is_dir():
        raise CliError(f"--check {folder}: no such folder (give the folder of questions.jsonl)")
    if not documents.is_dir():  # (not _documents_folder: its listing loads every extractor)
        raise CliError(f"documents folder not found: {documents} (pass --documents DIR)")
    report = check_question_set(folder, documents)
    for line in report.lines():
        print(line)
    return 1 if report.problems else 0


def _precheck_questions(settings: Settings) -> None:
    """Issue 31: the question set at ``RAG_EVAL_DIR`` checked before the run does any work: a
    bad row fails the run now (not after the pipeline), each needle the evaluation will drop is
    named, and a set written for other documents is said to be unused."""
    from rag_assets.lib.evaluate.question_check import check_question_set

    folder = Path(settings.eval_dir) if settings.eval_dir else None
    if folder is None or not (folder / "questions.jsonl").is_file():
        return
    docs = Path(settings.documents_dir).expanduser()
    if not docs.is_dir():
        return  # a missing folder is refused on its own, in its own words
    report = check_question_set(folder, docs)
    if report.documents == 0:
        return  # an empty folder too
    if report.unusable:
        bad = sorted(
            (p for p in report.problems if not p.dropped), key=lambda p: (p.path, p.line or 0)
        )
        first = "; ".join(bad[0].lines())
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CliError(
            f"question set {folder} (RAG_EVAL_DIR): {first}{more}: fix the rows (`rag-assets "
            f"questions --check {folder}` lists them all) or point RAG_EVAL_DIR elsewhere"
        )
    if report.foreign:
        print(f"rag-assets: note: {report.summary()} (RAG_EVAL_DIR)", file=sys.stderr)
        return
    for problem in report.dropped:
        head, *detail = problem.lines()
        print(f"rag-assets: warning: {head} (dropped from the evaluation)", file=sys.stderr)
        for line in detail:
            print(f"  {line}", file=sys.stderr)


def cmd_questions(args: argparse.Namespace, settings: Settings) -> int:
    """``rag-assets questions``: needles, questions and out-of-domain queries (issue 9)."""
    if args.check is not None:  # issue 31: every problem of a set, in a second (no extractors)
        return _check_questions(args.check, args.documents or Path(settings.documents_dir))
    from rag_assets.lib.evaluate import questions_gen
    from rag_assets.lib.ingest.extract import extract_folder
    from rag_assets.lib.query.judge import llm_cache_dir, make_client

    if args.export is not None:
        return _export_questions(args.export, args.index or settings.index_uri)
    if args.documents is None or args.out is None:
        raise ValueError(
            "questions needs --documents DIR --out DIR (or --export DIR, or --check DIR)"
        )
    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    if not args.documents.is_dir():
        raise FileNotFoundError(f"--documents {args.documents}: no such folder")
    llm = make_client(
        settings.llm_url,
        settings.llm_model or None,
        settings.llm_api_key or None,
        llm_cache_dir(settings.shared_work_dir),  # issue 31: per user, not the current dir
    )
    docs = {
        d.document_id: {"text": d.text, "title": d.title, "headings": d.headings}
        for d in extract_folder(args.documents).documents
        if d.ok
    }
    out = questions_gen.generate(
        docs, llm, n=args.n, seed=args.seed, progress=lambda s: print(s, file=sys.stderr)
    )
    for path in questions_gen.write(out, args.out):
        print(path)
    p = out.provenance
    print(
        f"{p['questions']} questions, {p['near']} near-miss and {p['unrelated']} unrelated "
        f"out-of-domain queries ({len(p['rejected'])} rejected), model {p['model']}"
    )
    return 0 if out.questions else 1


def cmd_backfill(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 23: plan, one run per batch through DAGSTER_HOME's run queue, then index_job."""
    from dataclasses import replace

    from rag_assets.defs.backfill import run_backfill

    settings = _override(settings, documents_dir=args.documents, index_uri=args.index)
    if args.batch_rows is not None:
        if args.batch_rows < 1:
            raise ValueError(f"--batch-rows must be >= 1, got {args.batch_rows}")
        settings = replace(settings, backfill_batch_rows=args.batch_rows)
    _documents_folder(settings.documents_dir)
    return run_backfill(settings, dict(os.environ), wait=not args.no_wait)


def cmd_rollback(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.lib.index.store import IndexStore

    entry = IndexStore(args.index or settings.index_uri).rollback(args.to)  # checked: it exists
    print(f"published: {entry.table} @ v{entry.version} (threshold {entry.threshold})")
    return 0


def cmd_compact(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.lib.index.maintenance import compact_index
    from rag_assets.lib.index.store import IndexStore

    report = compact_index(IndexStore(args.index or settings.index_uri))
    if args.json:
        print(json.dumps([r.as_dict() for r in report], indent=2))
    for r in [] if args.json else report:
        print(r.line())
    return 0


def cmd_repair(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 25: an index that two concurrent writers left with duplicate ids (see
    :func:`rag_assets.lib.index.maintenance.repair_index`)."""
    from rag_assets.lib.index.maintenance import repair_index
    from rag_assets.lib.index.store import IndexStore

    store = IndexStore(args.index or settings.index_uri)
    report = repair_index(store)
    if args.json:
        print(json.dumps([r.as_dict() for r in report], indent=2))
    for r in [] if args.json else report:
        print(r.line())
    return 0


# -- serve / mcp ----------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.serve.app import serve
    from rag_assets.serve.service import Service

    settings = _override(settings, index_uri=args.index)
    auth = ", bearer token required" if settings.api_token else ""
    if args.workers > 1:  # each worker process opens the index itself (read-only, shared)
        from rag_assets.lib.query.retrieve import require_index
        from rag_assets.serve.workers import HOST_VAR, serve_workers

        require_index(settings.index_uri)
        os.environ["RAG_INDEX_URI"] = settings.index_uri  # what the workers' settings read
        os.environ[HOST_VAR] = args.host
        print(
            f"serving {settings.index_uri} with {args.workers} workers on "
            f"http://{args.host}:{args.port}/ (MCP at /mcp{auth})",
            file=sys.stderr,
            flush=True,
        )
        serve_workers("rag_assets.cli:worker_app", args.host, args.port, args.workers)
        return 0
    service = Service.open(settings)
    pub = service.index().published
    print(
        f"serving {pub.table} @ v{pub.version} on http://{args.host}:{args.port}/ "
        f"(MCP at /mcp{auth})",
        file=sys.stderr,
        flush=True,
    )
    serve(service, args.host, args.port)
    return 0


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 31: ``dagster dev`` on the index's instance, stopped as one on Ctrl-C / SIGTERM."""
    from rag_assets.ui import run_ui

    settings = _override(settings, index_uri=args.index)
    dev_args = [*(["--port", str(args.port)] if args.port else [])]
    dev_args += ["--host", args.host] if args.host else []
    return run_ui(
        settings,
        os.environ,
        dev_args,
        announce=lambda line: print(f"rag-assets: {line}", file=sys.stderr, flush=True),
    )


def worker_app() -> Any:
    """The ASGI app of one ``serve --workers N`` process (uvicorn calls it in each worker):
    settings from the environment the CLI set up, the published index opened in this process."""
    from rag_assets.serve.app import create_app
    from rag_assets.serve.service import Service
    from rag_assets.serve.workers import HOST_VAR

    settings = Settings.from_env(os.environ)
    return create_app(Service.open(settings), host=os.environ.get(HOST_VAR, "127.0.0.1"))


def cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    """MCP over stdio: the handshake is answered at once; the index and the query encoder load
    in the background right after the server starts (a tool call waits for them)."""
    from rag_assets.serve.service import Service
    from rag_assets.serve.tools import run_stdio

    service = Service.open(_override(settings, index_uri=args.index), lazy=True)
    service.stdio_token = args.token or settings.token  # issue 34: else the local operator
    if service.stdio_token and service.caller_of(None) is None:
        raise CliError("the MCP token is not valid (RAG_TOKEN or --token)")
    try:
        run_stdio(service)
    finally:
        if service.log is not None:  # issue 33: the queued log entries are written
            service.log.close()
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 34: tokens kept (hashed) with the index; the service reads them per request."""
    from rag_assets.lib.index.store import IndexStore, TokenError

    store = IndexStore(args.index or settings.index_uri)
    try:
        return _token_action(args, store)
    except TokenError as e:  # says what to do already
        raise CliError(str(e)) from None


def _token_action(args: argparse.Namespace, store: Any) -> int:
    if args.action == "add":
        groups = [g.strip() for g in args.groups.split(",") if g.strip()]
        token = store.add_token(args.name, groups)
        print(token)  # the only time it is shown: stdout alone, for `$(rag-assets token add …)`
        print(
            f"token {args.name!r} (groups: {', '.join(groups) or 'none: public documents only'})"
            " made; it is shown once: keep it now",
            file=sys.stderr,
        )
        return 0
    if args.action == "revoke":
        record = store.revoke_token(args.name)
        print(f"revoked {record.name!r}: a running service refuses it from its next request")
        return 0
    records = store.tokens()
    if args.json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return 0
    for r in records:
        state = f"revoked {r.revoked}" if r.revoked else "active"
        print(f"{r.name}  groups={','.join(r.groups) or '-'}  made {r.created}  {state}")
    if not records:
        print("no tokens (`rag-assets token add NAME --groups A,B` makes one)")
    return 0


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str | None) -> str:
    """A file name or reason on one table row (issue 30): control characters escaped as
    ``\\n``, ``\\t``, ``\\xNN`` (as non-UTF-8 bytes are), never a line break."""
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return _CONTROL.sub(lambda m: named.get(m.group(), f"\\x{ord(m.group()):02x}"), str(text or ""))


def _shorten(text: str, width: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``width`` characters with "…"."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def _override(settings: Settings, **values: Any) -> Settings:
    from dataclasses import replace

    changes: dict[str, Any] = {k: str(v) for k, v in values.items() if v is not None}
    if "index_uri" in changes:  # issue 31: the index's own working folder comes with it
        settings = settings.with_index(changes.pop("index_uri"))
    return replace(settings, **changes)


if __name__ == "__main__":
    sys.exit(main())
