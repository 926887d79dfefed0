"""``rag-assets log …``, ``review`` and ``replay``, and the CLI ``ask``'s log entry
(issue 33). They read the index store directly: whoever can run them can read the index.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from rag_assets.commands.common import INDEX_HELP, CliError
from rag_assets.settings import Settings

#: commands that only read an index: see :data:`rag_assets.cli.QUERY_COMMANDS`
QUERY_COMMANDS = frozenset({"log", "review", "replay"})


def _store(uri: str) -> Any:
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.query.retrieve import require_index

    require_index(uri)
    return IndexStore(uri)


def record_cli_ask(
    index: Any, question: str, ctx: Any, hits: list[Any], started: float, settings: Settings
) -> str | None:
    """Write the CLI ``ask``'s entry (after its output went out); its id, or None with the log
    off. The entry is written by :func:`flush_cli_log` once the answer is printed."""
    from rag_assets.lib.index.store import shown_uri
    from rag_assets.lib.index.store.querylog import QueryLog
    from rag_assets.lib.query.log import ask_entry, new_query_id
    from rag_assets.serve.bounds import log_enabled, redacting

    if not log_enabled(settings):
        return None
    row = ask_entry(
        new_query_id(),
        question,
        ctx,
        hits,
        index.published,
        interface="cli/ask",
        caller=None,
        fusion=index.fusion.label,
        latency_ms=(time.perf_counter() - started) * 1000,
        redacting=redacting(settings),
    )
    pending.append((QueryLog(index.store), row, shown_uri(str(index.store.uri))))
    return str(row["id"])


pending: list[tuple[Any, dict[str, Any], str]] = []
"""Entries of this CLI process not written yet (log, row, where)."""


def flush_cli_log() -> None:
    """Write the CLI's pending entries; a failure is one warning line on stderr."""
    import sys

    while pending:
        log, row, where = pending.pop(0)
        try:
            log.add_entries([row])
        except Exception as exc:  # noqa: BLE001 - the answer was printed: report, go on
            why = " ".join(str(exc).split())[:200]
            print(
                f"rag-assets: warning: query log: the entry could not be written to {where} "
                f"({why}); RAG_QUERY_LOG=off turns the log off",
                file=sys.stderr,
            )


# -- rag-assets log ---------------------------------------------------------------------------
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?")


def parse_before(text: str) -> int:
    """``--before`` as nanoseconds since the epoch: a date (midnight UTC) or an ISO 8601 time
    (UTC unless it names an offset)."""
    value = text.strip()
    if not _DATE.fullmatch(value):
        raise ValueError(
            f"--before {text!r}: give a date such as 2026-01-31 or a time such as "
            "2026-01-31T12:00:00Z"
        )
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00").replace(" ", "T"))
    except ValueError:
        raise ValueError(f"--before {text!r}: not a real date or time") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1e9)


def log_purge(uri: str, before: str | None, ids: list[str]) -> str:
    """``rag-assets log purge``: entries and their verdicts gone from the store's files; the
    traffic set and content-gap report made from them removed (the next run makes them
    again)."""
    from rag_assets.defs.traffic_set import forget_derived
    from rag_assets.lib.index.store.querylog import QueryLog
    from rag_assets.lib.query.log import valid_query_id

    if before is None and not ids:
        raise ValueError("log purge needs --before DATE or --id ID (repeatable)")
    bad = [i for i in ids if not valid_query_id(i)]
    if bad:
        raise ValueError(f"--id {bad[0]!r} is not a query id (22 characters: A-Z a-z 0-9 _ -)")
    before_ns = parse_before(before) if before is not None else None
    store = _store(uri)
    log = QueryLog(store)
    if not log.exists():
        return "the query log is empty: nothing to purge"
    entries, verdicts = log.purge(before_ns=before_ns, ids=ids)
    missing = [i for i in ids if log.entry(i) is None] if entries < len(ids) else []
    derived = forget_derived(store) if entries else []
    line = f"purged {entries} entries and {verdicts} verdicts"
    if derived:
        line += f"; removed {len(derived)} files made from the log (remade by the next run)"
    if missing and entries == 0:
        line += f"; no entry with id {missing[0]}"
    return line


def log_list(uri: str, unreviewed: bool, limit: int, as_json: bool) -> str:
    from rag_assets.lib.evaluate.traffic import entries_for_review
    from rag_assets.lib.index.store.querylog import QueryLog

    if limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    log = QueryLog(_store(uri))
    rows = entries_for_review(log, unreviewed=unreviewed, limit=limit) if log.exists() else []
    if as_json:
        return json.dumps(rows, indent=2, ensure_ascii=False)
    if not rows:
        return "no logged queries" + (" without a verdict" if unreviewed else "")
    out = []
    for r in rows:
        how = r.get("decision") or "search"
        out.append(
            f"{r.get('at') or '-'}  {r['id']}  {r.get('interface') or '-':<10} "
            f"{r.get('caller') or 'admin':<10} {how:<8} "
            f"{r['review'] or '-':<13} {' '.join(str(r['question']).split())[:90]}"
        )
    return "\n".join(out)


def log_gaps(settings: Settings, uri: str, as_json: bool) -> str:
    """The content-gap report computed now (the query encoder groups the questions)."""
    from rag_assets.lib.evaluate import traffic_watch as watch
    from rag_assets.lib.index.onnx_encoder import query_embedder
    from rag_assets.lib.index.store.querylog import QueryLog
    from rag_assets.lib.query.log import now

    store = _store(uri)
    report = watch.gap_report(QueryLog(store), store, lambda: query_embedder(settings)[0])
    report.pop("questions")  # issue 43: refusals caused by access are counted apart
    if as_json:
        return json.dumps(report, indent=2, ensure_ascii=False)
    by, access = report["grouped_by"], report["refused_for_access"]
    return watch.gaps_markdown(report["groups"], now()[0], by, access).rstrip()


# -- rag-assets review ------------------------------------------------------------------------
def review(settings: Settings, uri: str, limit: int) -> int:
    from rag_assets.commands.review import run_review
    from rag_assets.lib.index.store.querylog import QueryLog
    from rag_assets.serve.bounds import redacting

    if limit < 0:
        raise ValueError(f"--limit must be >= 0, got {limit}")
    store = _store(uri)
    pub = store.published()
    if pub is None:
        raise FileNotFoundError(f"nothing is published in {uri}: run `rag-assets index` first")
    log = QueryLog(store)
    if not log.exists():
        print("the query log is empty: nothing to review")
        return 0
    texts = store.canonical_texts(pub.documents_version)
    done = run_review(log, texts, limit=limit, redacting=redacting(settings))
    if done:
        from rag_assets.lib.evaluate.traffic import progress_line, review_progress

        print(", ".join(f"{n} {v}" for v, n in sorted(done.items())) + " recorded")
        print(progress_line(review_progress(log)))
    return 0


# -- rag-assets replay ------------------------------------------------------------------------
def candidate_spec(settings: Settings, store: Any, stamps: Any) -> Any:
    """The model that asks a table with ``stamps``: the adapted model stored in the index when
    the stamps name one adapted from the configured model (issue 32), else the configured one
    (whose stamp check then names a real mismatch). A model server's table keeps the server."""
    from rag_assets.lib.index.adapted import spec_for
    from rag_assets.lib.index.embed import configured_model

    base = configured_model(settings)
    return spec_for(stamps, base, store, settings.work_dir) or base


def replay_command(
    settings: Settings, uri: str, candidate: str | None, fusion: str | None, as_json: bool
) -> str:
    """Replay the log on a candidate: ``--candidate TABLE@VERSION`` (default: the staged table
    when it is not the published one, else the published one) with ``--fusion`` (default
    RAG_FUSION), at the candidate's calibrated cut."""
    from rag_assets.defs.evaluation import eval_name
    from rag_assets.lib.evaluate.replay import replay
    from rag_assets.lib.index.onnx_encoder import query_embedder
    from rag_assets.lib.index.store import Published
    from rag_assets.lib.index.store.querylog import QueryLog
    from rag_assets.lib.query.fusion import parse_fusion
    from rag_assets.lib.query.judge import llm_options
    from rag_assets.lib.query.rerank import load_reranker
    from rag_assets.lib.query.retrieve import Index

    store = _store(uri)
    log = QueryLog(store)
    entries = log.entries() if log.exists() else []
    if not entries:
        raise ValueError(f"the query log of {uri} is empty: nothing to replay")
    published = store.published()
    entry: Published | None = None
    if candidate:
        table, _, version = candidate.rpartition("@")
        if not table or not version.isdigit():
            raise ValueError(
                f"--candidate {candidate!r}: give TABLE@VERSION (see `rag-assets status`)"
            )
        known = [
            e for e in store.rollback_stack() if e.table == table and e.version == int(version)
        ]
        try:
            staged = store.staging()
        except FileNotFoundError:
            staged = None
        if staged is not None and staged.table == table and staged.version == int(version):
            known.append(staged)
        if not known:
            raise ValueError(
                f"--candidate {candidate}: not a staged or published table version of {uri}"
            )
        entry = known[-1]
    else:
        try:
            staged = store.staging()
        except FileNotFoundError:
            staged = None
        entry = (
            staged
            if staged is not None and (published is None or staged.key != published.key)
            else published
        )
    if entry is None:
        raise FileNotFoundError(f"nothing staged or published in {uri}: run `rag-assets index`")
    th = store.read_text(eval_name(entry, "threshold.json"))
    if th is not None:
        cut = float(json.loads(th)["cut"])
    elif entry.threshold is not None:
        cut = float(entry.threshold)
    else:  # never calibrated (built outside the graph): the cut the service would use
        from rag_assets.lib.query.cite import DEFAULT_DISTANCE_CUT

        cut = DEFAULT_DISTANCE_CUT
    if settings.cut_override is not None:
        cut = settings.cut_override
    chosen = parse_fusion(fusion if fusion is not None else settings.fusion)
    # issue 44: the candidate's own encoder (its adapted model when it is embedded with one)
    embedder, _ = query_embedder(settings, spec=candidate_spec(settings, store, entry.stamps))
    reranker = load_reranker(settings.rerank_model or None, **llm_options(settings))
    index = Index(store, entry, embedder, reranker, distance_cut=cut, fusion=chosen)
    report = replay(index, entries, log.reviews(trusted=True), cut=cut)
    if as_json:
        return json.dumps(report, indent=2)
    return str(report["table"])


# -- the verbs ------------------------------------------------------------------------------
def register(sub: Any) -> None:
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
    uri = getattr(args, "index", None) or settings.index_uri
    if args.log_command == "purge":
        print(log_purge(uri, args.before, args.id))
    elif args.log_command == "list":
        print(log_list(uri, args.unreviewed, args.limit, args.json))
    elif args.log_command == "gaps":
        print(log_gaps(settings, uri, args.json))
    else:
        raise CliError("log needs a command: list, purge or gaps (rag-assets log --help)")
    return 0


def cmd_review(args: argparse.Namespace, settings: Settings) -> int:
    return review(settings, args.index or settings.index_uri, args.limit)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    out = replay_command(
        settings, args.index or settings.index_uri, args.candidate, args.fusion, args.json
    )
    print(out)
    return 0
