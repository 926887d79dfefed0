"""rag-assets: index a folder of documents, then ask it questions with cited sources.

Reads settings from the environment (RAG_*, see docs/settings.md); flags override them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from rag_assets.commands import COMMAND_MODULES
from rag_assets.commands.common import CliError, UsageError
from rag_assets.settings import Settings

#: exit status after the reader of stdout went away (``… | head``): what a process killed by
#: SIGPIPE reports in a shell (128 + 13), quietly, as Unix tools do
EXIT_BROKEN_PIPE = 141

#: a message that already says what to change (a setting, a flag or a command) gets no hint
_NAMES_A_FIX = re.compile(r"RAG_[A-Z_]+|(^|\s)--[a-z]|`rag-assets ")

#: the modules of ``rag_assets.commands`` that make the verbs: each registers its subcommands
#: and flags (``register(subparsers)``) and says which of them only read an index
#: (``QUERY_COMMANDS``) and which encode text (``DEVICE_COMMANDS``)
VERBS = [importlib.import_module(f"rag_assets.commands.{name}") for name in COMMAND_MODULES]

#: commands that only read an index: they refuse a missing directory instead of creating it
QUERY_COMMANDS = frozenset().union(*(getattr(m, "QUERY_COMMANDS", ()) for m in VERBS))

#: commands that build an index: the settings given to them (flags, environment) win over the
#: index's declaration and are recorded in it (issue 51); every other command with ``--index``
#: runs with the declared values, its environment filling only what they leave unset
BUILD_COMMANDS = frozenset().union(*(getattr(m, "BUILD_COMMANDS", ()) for m in VERBS))

#: commands whose ``--index`` is optional and names no index when absent: the declaration of
#: ``RAG_INDEX_URI`` does not apply to them unless ``--index`` is given
INDEX_OPTIONAL = frozenset().union(*(getattr(m, "INDEX_OPTIONAL", ()) for m in VERBS))

#: commands that encode text (documents or queries): an explicit ``RAG_DEVICE`` this machine
#: does not have is refused in one line before they start (issue 30)
DEVICE_COMMANDS = frozenset().union(*(getattr(m, "DEVICE_COMMANDS", ()) for m in VERBS))

__all__ = ["CliError", "UsageError", "main"]


def _attached_ids(argv: list[str]) -> list[str]:
    """``--id -x…`` as ``--id=-x…``: a query id may start with ``-`` (ids made before it could
    not), which argparse would read as an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--id" and arg.startswith("-") and not arg.startswith("--"):
            out[-1] = f"--id={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=r".*currently in beta")  # dagster API notices
    debug = os.environ.get("RAG_DEBUG", "") not in ("", "0")
    if not debug:
        warnings.showwarning = _warning_line
    parser = _parser()
    args = parser.parse_args(_attached_ids(sys.argv[1:] if argv is None else list(argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    logs = _json_logs(args.command)  # issue 52: RAG_LOG_FORMAT=json
    started = time.perf_counter()
    try:
        code = _run(args, debug)
    finally:
        if logs is not None:
            logs.flush()
            logs.restore()
    if logs is not None:
        elapsed = round((time.perf_counter() - started) * 1000, 1)
        level = "info" if code == 0 else "error"
        logs.record(
            f"rag-assets {args.command} exited {code}", level, status=code, duration_ms=elapsed
        )
    return code


def _json_logs(command: str) -> Any:
    """With ``RAG_LOG_FORMAT=json``: stderr as JSON lines, each with this run's id and command
    (:func:`rag_assets.serve.logs.configure`); else None."""
    if os.environ.get("RAG_LOG_FORMAT", "").strip().lower() != "json":
        return None
    import secrets

    from rag_assets.serve.logs import configure

    return configure("json", run_id=secrets.token_hex(8), command=command)


def _run(args: argparse.Namespace, debug: bool) -> int:
    """The command, its expected failures as one line on stderr and an exit code."""
    try:
        settings = Settings.from_env(os.environ)
        if args.command in DEVICE_COMMANDS:
            _check_device(settings)  # issue 30: before any work, even where torch is not used
        if hasattr(args, "index"):
            query = args.command in QUERY_COMMANDS or bool(getattr(args, "serve", False))
            _check_index_dir(args.index or settings.index_uri, must_exist=query)
            declared = args.command not in BUILD_COMMANDS and (
                args.index or args.command not in INDEX_OPTIONAL
            )
            if declared:  # issue 51: the index's declaration
                settings = _declared(settings, args.index, note=args.command != "status")
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


def _check_device(settings: Settings) -> None:
    """``RAG_DEVICE=cuda`` (or ``cuda:N``, ``mps``) on a machine without it: one line naming
    the setting, from :func:`rag_assets.lib.index.embed.resolve_device`. ``auto`` and ``cpu``
    are not checked (no torch import on the query path)."""
    if settings.device.strip().lower() in ("", "auto", "cpu"):
        return
    from rag_assets.lib.index.embed import resolve_device

    resolve_device(settings.device)


def _declared(settings: Settings, index: str | None, note: bool = True) -> Settings:
    """The settings of a command that reads the index ``index`` (or ``RAG_INDEX_URI``): its
    declared values win over this environment (:mod:`rag_assets.lib.index.declaration`); with
    ``note``, a value of this environment that is not taken says so on stderr, one line each."""
    from rag_assets.lib.index.declaration import apply_declaration, ignored_lines, read_declaration

    settings = settings.with_index(index) if index else settings
    declaration = read_declaration(settings.index_uri)
    for line in ignored_lines(declaration, os.environ) if note else []:
        print(f"rag-assets: note: {line}", file=sys.stderr)
    return apply_declaration(settings, declaration)


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


def _parser() -> argparse.ArgumentParser:
    from rag_assets import __version__

    p = argparse.ArgumentParser(
        prog="rag-assets", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"rag-assets {__version__}")
    sub = p.add_subparsers(dest="command")
    for module in VERBS:  # a new verb: a module of rag_assets.commands with its register()
        module.register(sub)
    return p


if __name__ == "__main__":
    sys.exit(main())
