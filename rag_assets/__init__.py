"""rag_assets: a Dagster asset graph that turns a folder of documents into a retrieval index."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Index", "RagIndex", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: importing the package must not load torch
    if name == "Index":
        from rag_assets.lib.query.retrieve import Index

        return Index
    if name == "RagIndex":  # issue 51: the Dagster component (dg list components shows it)
        from rag_assets.defs.component import RagIndex

        return RagIndex
    raise AttributeError(name)


def __dir__() -> list[str]:  # what `dg list components` scans (the entry point is this package)
    return sorted(__all__)
