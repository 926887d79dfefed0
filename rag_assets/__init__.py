"""rag_assets: a Dagster asset graph that turns a folder of documents into a retrieval index."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Index", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: importing the package must not load torch
    if name == "Index":
        from rag_assets.lib.query.retrieve import Index

        return Index
    raise AttributeError(name)
