"""``rag-assets serve --workers N``: N uvicorn worker processes on one port, one index.

Each worker is its own process with its own :class:`~rag_assets.serve.service.Service` (query
encoder, held version, BM25), built by the factory ``rag_assets.commands.serve:worker_app`` from the
environment the CLI prepared. They share the index directory read-only: LanceDB reads a table
version without locks, and each worker follows the publish pointer on its own (a publish is seen
by every worker on its next request), so no state passes between them. uvicorn's own supervisor
binds the socket once and hands it to the workers (``uvicorn.run(..., workers=N)``).
"""

from __future__ import annotations

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from rag_assets.serve.app import _Json400
from rag_assets.settings import Settings

HOST_VAR = "RAG_ASSETS_SERVE_HOST"
"""Private hand-off from ``rag-assets serve`` to its workers: the host it listens on (the MCP
endpoint's allowed Host). Not a setting: the CLI writes it, the worker factory reads it."""


#: uvicorn's HTTP protocol with the app's JSON 400s, importable by name (the workers load it)
Json400HTTPProtocol: type = type("Json400HTTPProtocol", (_Json400, AutoHTTPProtocol), {})


def serve_workers(
    factory: str, host: str, port: int, workers: int, settings: Settings | None = None
) -> None:
    """Run ``factory`` (``module:function`` returning the ASGI app) in ``workers`` processes.

    Issue 52: their metrics are kept in one folder (``PROMETHEUS_MULTIPROC_DIR``, made here
    unless given, removed at exit) so that a scrape of any worker counts every worker's
    requests; ``RAG_LOG_FORMAT=json`` makes uvicorn's lines JSON in each worker."""
    import os

    import uvicorn

    from rag_assets.serve.logs import uvicorn_options
    from rag_assets.serve.metrics import prepare_workers, remove_folder

    folder = prepare_workers(os.environ)
    try:
        uvicorn.run(
            factory,
            factory=True,
            host=host,
            port=port,
            workers=workers,
            http=f"{__name__}:Json400HTTPProtocol",
            **uvicorn_options(settings or Settings()),
        )
    finally:
        remove_folder(folder)
