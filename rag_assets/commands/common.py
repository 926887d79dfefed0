"""What the command modules share: the errors the CLI prints in one line, the argparse types of
checked flags, and the settings a command's flags override."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings


class CliError(Exception):
    """An expected failure: its message is the one line printed (cause and what to change)."""


class UsageError(ValueError):
    """A flag the index refuses (an unknown filter key): printed as a usage error, exit 2."""


INDEX_HELP = "index directory (default RAG_INDEX_URI, else data/index)"


def question_arg(text: str) -> str:
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


def workers_arg(text: str) -> int:
    """argparse type of ``serve --workers``: a positive whole number."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: give a whole number, 1 or more")
    return value


def bounded(flag: str, lo: int, hi: int) -> Any:
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


def documents_folder(path: str | Path, flag: str = "--documents") -> Path:
    """A documents folder that exists and holds files, else a one-line :class:`CliError`."""
    from rag_assets.lib.ingest.extract import list_files

    folder = Path(path).expanduser()
    fix = f"pass {flag} DIR or set RAG_DOCUMENTS_DIR"
    if not folder.exists():
        raise CliError(f"documents folder not found: {folder} ({fix})")
    if not folder.is_dir():
        raise CliError(f"documents folder is a file, not a folder: {folder} ({fix})")
    if not list_files(folder):
        raise CliError(f"documents folder is empty: {folder} (add documents, or {fix})")
    return folder


def override(settings: Settings, **values: Any) -> Settings:
    from dataclasses import replace

    changes: dict[str, Any] = {k: str(v) for k, v in values.items() if v is not None}
    if "index_uri" in changes:  # issue 31: the index's own working folder comes with it
        settings = settings.with_index(changes.pop("index_uri"))
    return replace(settings, **changes)
