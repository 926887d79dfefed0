"""Sources (issue 41): where documents come from besides a local folder, behind one interface.

A :class:`Source` lists its items, each with a *content identity* (an object's ETag or version,
a Git blob id, a page's HTTP validators, a file's sha256) and the URL a citation opens, and
reads one item's bytes. An item whose identity did not change since the last run is never read
again (:mod:`.sync` reuses its extraction). Kinds, one module each:

- :mod:`.folder`: a local folder (what ``--documents DIR`` has always been);
- :mod:`.objects`: ``s3://bucket/prefix``, ``gs://…``, ``az://…`` (obstore; :mod:`.s3_listing`
  for keys it refuses; configured from the same variables as the index: ``AWS_ENDPOINT``, …);
- :mod:`.git`: ``git+file:///path/repo.git@ref`` or ``git+https://…@ref`` (the ``git`` binary);
- :mod:`.web`: ``https://host/start`` or ``https://host/sitemap.xml`` (httpx through
  :mod:`.fetch`, robots.txt by protego, main content by :mod:`.boilerplate`).

:mod:`.config` reads a sources file (``RAG_SOURCES=sources.toml``) or one location into
:class:`~.config.SourceSpec` values; :mod:`.sync` extracts them into documents with the failure,
deletion-share and limit rules of docs/sources.md. Nothing here imports Dagster.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from rag_assets.lib.ingest.metadata import META_FILE

VIEW = "view:"
"""The ``url`` of an item no web address opens (a Git file on an unknown host or in a local
repository, a private object), issue 49: ``view:`` and what a terminal shows of it (``path@commit``,
``s3://bucket/key``). Its citation links the service's own view of the document (the service,
``RAG_BASE_URL``), else shows that text with ``:LINE`` (or the fragment a viewer reads)."""


class SourceError(Exception):
    """A source could not be listed or read; the message is one line, without credentials."""


class LimitHit(SourceError):
    """A per-source limit stopped the listing or a read; the message names the limit."""


@dataclass(frozen=True)
class Item:
    """One document of a source: ``key`` (a ``/``-separated path, the document id after the
    source's name), ``identity`` (content identity: equal identities mean equal bytes),
    ``size`` in bytes when the listing knows it, ``url`` (what a citation opens: may hold a
    ``{line}`` placeholder) and ``facts`` (metadata stamped on the document, e.g. the commit)."""

    key: str
    identity: str
    size: int | None = None
    url: str = ""
    facts: dict[str, str] = field(default_factory=dict)
    suffix: str = ""  # the extension its extractor is chosen by, when the key has none


@dataclass
class Listing:
    """What a source answered: its items, its state (one string: a new state is a change),
    notes (limits hit, pages skipped) to show beside the run, and its ``.ragmeta`` files
    (``meta``: items read for their rules, never documents; issue 49)."""

    items: list[Item]
    state: str
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    meta: list[Item] = field(default_factory=list)


class Source(Protocol):
    """One configured source (see :mod:`.config` for how one is opened)."""

    def list_items(self) -> Listing:
        """Every item, or :class:`SourceError` when the source did not answer."""
        ...

    def read(self, item: Item) -> bytes:
        """The item's bytes, or :class:`SourceError` (that item fails alone)."""
        ...


META_NAME = META_FILE  # the folder's own name for it


def is_meta_key(key: str) -> bool:
    """Whether ``key`` is a ``.ragmeta`` file of a source's tree (not in a hidden folder)."""
    *folders, name = key.split("/")
    return name == META_NAME and not any(p.startswith(".") or not p for p in folders)


def digest_items(items: list[Item], *extra: str) -> str:
    """A source's state: its items' keys and identities (and ``extra``, e.g. the commit)."""
    blob = json.dumps([sorted((i.key, i.identity) for i in items), list(extra)])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
