"""``rag-assets serve``, ``mcp`` and ``ui``: the published index over HTTP and MCP
(:mod:`rag_assets.serve`), and the Dagster UI of the index (:mod:`rag_assets.defs.ui`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rag_assets.commands.common import (
    INDEX_HELP,
    CliError,
    bounded,
    override,
    workers_arg,
)
from rag_assets.settings import Settings

#: commands that only read an index: see :data:`rag_assets.cli.QUERY_COMMANDS`
QUERY_COMMANDS = frozenset({"serve", "mcp"})
#: commands that encode text: see :data:`rag_assets.cli.DEVICE_COMMANDS`
DEVICE_COMMANDS = frozenset({"serve", "mcp"})


def register(sub: Any) -> None:
    """``serve``, ``ui``, ``mcp``."""
    sv = sub.add_parser("serve", help="HTTP API, search page and MCP over the published index")
    sv.add_argument("--index", default=None, help=INDEX_HELP)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default local)")
    sv.add_argument(
        "--port", type=bounded("--port", 1, 65535), default=8000, help="port (default 8000)"
    )
    sv.add_argument(
        "--workers",
        type=workers_arg,
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


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.serve.app import serve
    from rag_assets.serve.service import Service

    settings = override(settings, index_uri=args.index)
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
        app = "rag_assets.commands.serve:worker_app"
        serve_workers(app, args.host, args.port, args.workers, settings)
        return 0
    service = Service.open(settings)
    index = service.index()
    print(
        f"serving version {index.index_version} ({index.published.table}) on "
        f"http://{args.host}:{args.port}/ "
        f"(MCP at /mcp{auth})",
        file=sys.stderr,
        flush=True,
    )
    serve(service, args.host, args.port)
    return 0


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 31: ``dagster dev`` on the index's instance, stopped as one on Ctrl-C / SIGTERM."""
    from rag_assets.defs.ui import run_ui

    settings = override(settings, index_uri=args.index)
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
    from rag_assets.lib.index.declaration import declared_settings
    from rag_assets.serve.app import create_app
    from rag_assets.serve.logs import configure as configure_logs
    from rag_assets.serve.service import Service
    from rag_assets.serve.workers import HOST_VAR

    settings = declared_settings(Settings.from_env(os.environ))  # issue 51: as `serve` reads it
    configure_logs(settings.log_format, pid=os.getpid())  # issue 52: JSON lines in each worker
    return create_app(Service.open(settings), host=os.environ.get(HOST_VAR, "127.0.0.1"))


def cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    """MCP over stdio: the handshake is answered at once; the index and the query encoder load
    in the background right after the server starts (a tool call waits for them)."""
    from rag_assets.serve.service import Service
    from rag_assets.serve.tools import run_stdio

    service = Service.open(override(settings, index_uri=args.index), lazy=True)
    service.stdio_token = args.token or settings.token  # issue 34: else the local operator
    if service.stdio_token and service.caller_of(None) is None:
        raise CliError("the MCP token is not valid (RAG_TOKEN or --token)")
    try:
        run_stdio(service)
    finally:
        if service.log is not None:  # issue 33: the queued log entries are written
            service.log.close()
    return 0
