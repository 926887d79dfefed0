"""``rag-assets index``, ``adapt`` and ``backfill``: the graph runs that build an index
(:mod:`rag_assets.defs.run`; ``backfill``: :mod:`rag_assets.defs.backfill`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from rag_assets.commands.common import (
    INDEX_HELP,
    CliError,
    bounded,
    documents_folder,
    override,
)
from rag_assets.settings import Settings

#: ``rag-assets index`` published what could be read, but a source failed (its documents kept
#: as they were) or had deletions withheld: cron and CI see it (issue 49, docs/sources.md)
EXIT_SOURCES_INCOMPLETE = 3

#: commands that encode text (documents or queries): see :data:`rag_assets.cli.DEVICE_COMMANDS`
DEVICE_COMMANDS = frozenset({"index", "backfill"})
#: commands that build the index and record what they are given: :data:`rag_assets.cli.
#: BUILD_COMMANDS` (issue 51)
BUILD_COMMANDS = frozenset({"index", "adapt", "backfill"})


def register(sub: Any) -> None:
    """``index``, ``adapt``, ``backfill``."""
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

    bf = sub.add_parser(
        "backfill", help="re-embed in batches: one Dagster run per batch through the run queue"
    )
    bf.add_argument("--documents", default=None, help="documents folder (RAG_DOCUMENTS_DIR)")
    bf.add_argument("--index", default=None, help=INDEX_HELP)
    bf.add_argument(
        "--batch-rows",
        type=bounded("--batch-rows", 1, 100000000),
        default=None,
        help="chunks per batch run",
    )
    bf.add_argument("--no-wait", action="store_true", help="launch the runs and return")
    bf.set_defaults(func=cmd_backfill)


def cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    # issue 31: a bad question set is reported in the first second, before Dagster is imported
    # (the folder given here; else the index's recorded folder, once it is read, below)
    given_folder = bool(args.documents or os.environ.get("RAG_DOCUMENTS_DIR"))
    if given_folder:
        _precheck_questions(override(settings, documents_dir=args.documents))
    from rag_assets.defs.build import source_specs_of
    from rag_assets.defs.run import check_folder, index_settings, materialize_graph

    force = "1" if args.force_folder else None
    settings = override(
        settings, documents_dir=args.documents, index_uri=args.index, force_folder=force
    )
    # issue 51: what this run is given (flags, this command's environment) wins and is kept in
    # the index's declaration; the declaration gives the rest (issue 22: an older index, its
    # recorded folder and strategy); another folder is refused before Dagster
    given = build_given(os.environ, documents=bool(args.documents))
    settings = index_settings(settings, given)
    _refuse_adaptation(settings)
    if source_specs_of(settings) is None:  # issue 41: sources are listed by the run itself
        documents_folder(settings.documents_dir)
    check_folder(settings)
    if not given_folder:
        _precheck_questions(settings)  # issue 31: fails now, not after the pipeline
    outcome = materialize_graph(
        settings,
        progress=not args.quiet and sys.stderr.isatty(),  # no bar frames in a log file
        log_level="WARNING" if os.environ.get("RAG_DEBUG") else "CRITICAL",
        stage_lines=not args.quiet,  # issue 31: else one line per stage as it ends
        given=given,
        announce=lambda line: print(f"rag-assets: {line}", file=sys.stderr, flush=True),
    )
    print(outcome.summary())
    if outcome.interrupted == "training":  # issue 51: Ctrl-C while training: the base serves
        return _sources_incomplete(outcome.metadata.get("extracted_documents", {}))
    if outcome.interrupted:
        return 130
    if not outcome.success:
        return 1
    return _sources_incomplete(outcome.metadata.get("extracted_documents", {}))


def _sources_incomplete(extracted: dict[str, Any]) -> int:
    """Issue 49: :data:`EXIT_SOURCES_INCOMPLETE` (with one line on stderr) when a source
    failed or had deletions withheld in this run, else 0."""
    failed, withheld = extracted.get("sources_failed", 0), extracted.get("deletions_withheld", 0)
    if not failed and not withheld:
        return 0
    print(f"rag-assets: warning: {failed} source(s) FAILED, {withheld} deletion(s) withheld: "
          "published what could be read; see the source lines above (exit status "
          f"{EXIT_SOURCES_INCOMPLETE})", file=sys.stderr)  # fmt: skip
    return EXIT_SOURCES_INCOMPLETE


def build_given(env: Any, documents: bool = False) -> set[str]:
    """Issue 51: the declared settings a build command is given: those its environment sets
    (even to "") and ``--documents``."""
    from rag_assets.lib.index.declaration import given_in_env

    return given_in_env(env) | ({"documents_dir"} if documents else set())


def _refuse_adaptation(settings: Settings) -> None:
    """Issue 51: ``RAG_ADAPT=on`` with an encoder this process cannot train (a model server, a
    model without weights here), refused in one line before anything runs."""
    from rag_assets.lib.index.adapt_scope import refusal

    refused = refusal(settings)
    if refused:
        raise CliError(refused)


def cmd_adapt(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 32: one run of ``adapt_job`` (:func:`rag_assets.defs.run.run_adapt`)."""
    from rag_assets.defs.run import check_folder, index_settings, run_adapt

    if args.steps is not None and args.steps < 0:
        raise CliError(f"--steps {args.steps}: give 0 (one epoch) or a positive number")
    settings = override(settings, documents_dir=args.documents, index_uri=args.index)
    if args.steps is not None:
        from dataclasses import replace

        settings = replace(settings, adapt_steps=args.steps)
    given = build_given(os.environ, documents=bool(args.documents))
    settings = index_settings(settings, given)
    _refuse_adaptation(dataclasses.replace(settings, adapt="on"))  # adapt: on, for its run
    documents_folder(settings.documents_dir)
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


def cmd_backfill(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 23: plan, one run per batch through DAGSTER_HOME's run queue, then index_job."""
    from dataclasses import replace

    from rag_assets.defs.backfill import run_backfill
    from rag_assets.defs.run import index_settings

    settings = override(settings, documents_dir=args.documents, index_uri=args.index)
    given = build_given(os.environ, documents=bool(args.documents))  # issue 51, as `index`
    settings = index_settings(settings, given)
    if args.batch_rows is not None:
        if args.batch_rows < 1:
            raise ValueError(f"--batch-rows must be >= 1, got {args.batch_rows}")
        settings = replace(settings, backfill_batch_rows=args.batch_rows)
    from rag_assets.defs.build import source_specs_of

    if source_specs_of(settings) is None:  # issue 41: sources are listed by the runs
        documents_folder(settings.documents_dir)
    return run_backfill(settings, dict(os.environ), wait=not args.no_wait, given=given)


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
