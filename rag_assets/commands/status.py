"""``rag-assets status``, ``rollback``, ``compact`` and ``repair``: what the index publishes
and keeps (the report itself: :mod:`rag_assets.serve.status`, which the service answers too)."""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

from rag_assets.commands.common import (
    INDEX_HELP,
    override,
)
from rag_assets.settings import Settings

#: commands that only read an index: see :data:`rag_assets.cli.QUERY_COMMANDS`
QUERY_COMMANDS = frozenset({"status", "rollback", "compact"})


def register(sub: Any) -> None:
    """``status``, ``rollback``, ``compact``, ``repair``."""
    s = sub.add_parser("status", help="published table, stamps, documents, chunk counts")
    s.add_argument("--index", default=None, help=INDEX_HELP)
    s.add_argument("--json", action="store_true", help="the report as JSON")
    s.set_defaults(func=cmd_status)

    r = sub.add_parser("rollback", help="point queries back at the previously published table")
    r.add_argument("--index", default=None, help=INDEX_HELP)
    r.add_argument(
        "--to",
        default=None,
        metavar="VERSION",
        help="the index's VERSION (as status shows it), or TABLE@V with LanceDB's (status --json)",
    )
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


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.defs.ui import runs_report
    from rag_assets.serve.status import status_report

    settings = override(settings, index_uri=args.index)
    report = status_report(settings)
    report["runs"] = runs_report(settings, os.environ)  # issue 31: the index's own runs
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    pub = report["published"]
    if pub:
        st = pub["stamps"]
        print(f"published: {pub['table']} {_version(pub)}  rows={pub['rows']}")
        print(
            f"  model={st['model']} rev={st['revision']} dims={st['dims']} "
            f"pipeline={st['pipeline']} extractor={st['extractor']}"
        )
        print(f"  threshold={pub['threshold']} ({pub['threshold_policy']})")
        if pub.get("evaluation") == "unevaluated":  # issue 11: no question set fits this corpus
            print(f"  UNEVALUATED: {pub.get('evaluation_note')}")
        print(f"  cut source: {pub.get('threshold_source') or 'not recorded'}")
        if pub.get("threshold_warning"):  # issue 53: the day-0 cut failed closed
            print(f"  WARNING: {pub['threshold_warning']}")
        if pub.get("cut_note"):  # issue 53: no question set checked the cut yet
            print(f"  NOTE: {pub['cut_note']}")
        counts = pub.get("evaluation_counts") or {}
        detail = ", ".join(f"{v} {k}" for k, v in counts.items() if k != "wanted")
        print(
            f"  evaluated on: {pub.get('evaluation_source') or 'not recorded'}"
            + (f" ({detail})" if detail else "")
        )
    else:
        print("published: nothing yet (run `rag-assets index`)")
    _print_query_log(report.get("query_log"))
    for t in report["tables"]:  # issue 51: LanceDB's version of a table only in --json
        print(f"table: {t['table']} rows={t['rows']}" + ("  (published)" if t["published"] else ""))
    docs = report["documents"]
    of = _described(pub, docs["of"])  # issue 51: the index's version, not LanceDB's
    if docs["ok"] is None:
        print(f"documents: unknown (no manifest stored with {of or 'this index'}; re-index)")
    else:
        print(
            f"documents: {docs['ok']} ok, {len(docs['failed'])} failed, "
            f"{len(docs.get('skipped', []))} skipped (of {of})"
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
            counted = f"version {e['index_version']}" if e.get("index_version") else "version ?"
            print(
                f"  {mark} {counted}  {e['table']}  rows={e['rows']}  "
                f"threshold={e['threshold']}  published {e['published_at']}"
            )
    print(report["rerank"])
    from rag_assets.lib.index.adapted import status_lines

    for line in status_lines(report.get("adaptation")):  # issue 32
        print(line)
    _print_declaration(settings, os.environ)
    _print_runs(report["runs"])
    return 0


def _print_declaration(settings: Settings, env: Any) -> None:
    """Issue 51: the adaptation the index declares (``adaptation: off, set at the first build on
    2026-12-05``), what was changed since its first build, and this environment's values the
    declaration overrode."""
    from rag_assets.lib.index.declaration import (
        adaptation_line,
        ignored_lines,
        read_declaration,
    )

    declaration = read_declaration(settings.index_uri)
    if declaration is None:
        print("declared: nothing yet (the first `rag-assets index` records what shapes the index)")
        return
    line = adaptation_line(declaration)
    if line:
        print(line)
    changed = [
        f"{k}={e.value!r} ({e.said()})"
        for k, e in sorted(declaration.entries.items())
        if e.by != "the first build" and k != "adapt"
    ]
    print(
        f"declared: {len(declaration.entries)} settings kept with the index since "
        f"{declaration.first_build[:10]} (`status --json` lists them)"
        + (f"; changed since: {', '.join(changed)}" if changed else "")
    )
    for line in ignored_lines(declaration, env):
        print(f"  {line}")


def _described(pub: dict[str, Any] | None, key: str | None) -> str:
    """What the documents' line describes: ``version 2`` (published), else the table version
    embedded last, awaiting evaluation."""
    if key is None:
        return ""
    if pub and key == f"{pub['table']}@{pub['lancedb_version']}":
        return _version(pub)
    return "the version embedded last, not published yet"


def _version(pub: dict[str, Any]) -> str:
    """``version 1``: the index's own count (issues 39 and 51: LanceDB's version of the table is
    only in ``--json``, as ``lancedb_version``)."""
    n = pub.get("index_version")
    return f"version {n}" if n else "(a version the history does not list)"


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


def cmd_rollback(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.index.store.records import index_versions

    store = IndexStore(args.index or settings.index_uri)
    entry = store.rollback(args.to)  # checked: it exists
    n = index_versions(store.history_records()).get(entry.key)
    print(f"published: version {n} ({entry.table}, threshold {entry.threshold})")
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


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str | None) -> str:
    """A file name or reason on one table row (issue 30): control characters escaped as
    ``\\n``, ``\\t``, ``\\xNN`` (as non-UTF-8 bytes are), never a line break."""
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return _CONTROL.sub(lambda m: named.get(m.group(), f"\\x{ord(m.group()):02x}"), str(text or ""))
