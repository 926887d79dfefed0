"""Metadata filters and the caller's groups, applied during the search (issue 34).

A :class:`Filter` is a list of clauses over document metadata
(:mod:`rag_assets.lib.ingest.metadata`): ``key=value`` (repeating a key means any of its values:
``tags=a`` and ``tags=b`` is "tagged a or b"), different keys must all hold, and ``size`` /
``modified`` also take ``>=``, ``<=``, ``>``, ``<`` (bytes; an ISO date or time, UTC).
``document=ID`` is one document, ``folder=PATH`` a folder and everything below it. The same
filter comes from the CLI (``--filter key=value``, ``--document``, ``--folder``), from ``GET
/search?filter=key=value`` and from JSON (``{"key": "value" | ["v1", "v2"]}``, a range as
``{"modified>=": "2025-01-01"}``).

A :class:`Scope` is a filter plus the caller's groups (``None``: every document, the
administrator's or the local operator's view). :class:`DocumentFacts` holds one index version's
documents as arrays (labels → documents, groups → documents, sizes, times) and turns a scope into
a per-document mask in microseconds; :meth:`Scope.sql` is the same scope as a LanceDB ``where``
clause over the chunk rows' ``meta`` / ``access`` / ``size`` / ``modified`` columns, used as a
prefilter (``prefilter=True``) on the exact scan, the ANN index and the native full-text index.

A key that no document the caller can see has is refused (:class:`FilterError`, one line),
never answered with a silent empty list; the keys listed in that line are the visible ones, so
the error says nothing about hidden documents either.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag_assets.lib.ingest.metadata import (
    ACCESS_KEY,
    KEY_RE,
    Metadata,
    system_facts,
)

RANGE_OPS = (">=", "<=", ">", "<")
RANGE_KEYS = ("size", "modified")
ALWAYS_KEYS = ("document", "folder", "format", "title", "size", "modified")
"""Keys every index knows (the file system's); other keys are known when a visible document
has them."""
PUBLIC = "*"  # rag_assets.lib.index.metadata.PUBLIC: the access value of an unrestricted document
MAX_CLAUSES = 32
MAX_VALUES = 256
FACET_VALUES = 200
"""Values listed per key by :meth:`DocumentFacts.facets` (the page's suggestions)."""

_ITEM = re.compile(r"([A-Za-z][A-Za-z0-9_-]*)\s*(>=|<=|>|<|=)(.*)", re.S)


class FilterError(ValueError):
    """A malformed filter or an unknown key: one line naming it and what is accepted."""


@dataclass(frozen=True)
class Clause:
    key: str
    op: str  # "=" (any of values) or one of RANGE_OPS (one value)
    values: tuple[str, ...]


@dataclass(frozen=True)
class Filter:
    """Clauses over document metadata; all must hold (see the module docstring)."""

    clauses: tuple[Clause, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.clauses)

    @classmethod
    def parse(
        cls,
        items: Iterable[str] = (),
        *,
        document: str | None = None,
        folder: str | None = None,
    ) -> Filter:
        """``key=value`` texts (``--filter``, ``?filter=``), plus ``--document`` / ``--folder``."""
        pairs: list[tuple[str, str, str]] = []
        for item in items:
            m = _ITEM.fullmatch(item.strip())
            if not m:
                raise FilterError(
                    f"filter {item!r} is not key=value (e.g. tags=policy, folder=hr, "
                    "modified>=2025-01-01)"
                )
            pairs.append((m.group(1), m.group(2), m.group(3)))
        if document:
            pairs.append(("document", "=", document))
        if folder is not None:
            pairs.append(("folder", "=", folder))
        return cls._build(pairs)

    @classmethod
    def from_mapping(cls, obj: Any) -> Filter:
        """``{"key": "value" | ["v1", "v2"], "modified>=": "2025-01-01"}`` (POST /ask, MCP)."""
        if obj is None:
            return cls()
        if not isinstance(obj, Mapping):
            raise FilterError(
                'filter must be an object of key: value or [values], e.g. {"tags": "policy"}'
            )
        pairs: list[tuple[str, str, str]] = []
        for raw_key, value in obj.items():
            key, op = str(raw_key).strip(), "="
            for candidate in RANGE_OPS:
                if key.endswith(candidate):
                    key, op = key[: -len(candidate)].strip(), candidate
                    break
            values = value if isinstance(value, list) else [value]
            if not values:
                raise FilterError(f"filter {raw_key!r}: give a value or a list of values")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, str | int | float):
                    raise FilterError(
                        f"filter {raw_key!r}: {json.dumps(v)} is not a string (give text or a "
                        "list of texts)"
                    )
                pairs.append((key, op, str(v)))
        return cls._build(pairs)

    @classmethod
    def _build(cls, pairs: list[tuple[str, str, str]]) -> Filter:
        merged: dict[str, list[str]] = {}
        ranges: list[Clause] = []
        for key, op, raw in pairs:
            key = key.lower()
            if not KEY_RE.fullmatch(key):
                raise FilterError(f"filter key {key!r} is not a metadata key")
            value = raw.strip()
            if op == "=":
                if key == "folder":
                    value = value.strip("/")
                    if value in ("", "."):
                        continue  # the top folder: every document
                if not value:
                    raise FilterError(f"filter {key}=: give a value (e.g. {key}=something)")
                merged.setdefault(key, [])
                if value not in merged[key]:
                    merged[key].append(value)
            else:
                if key not in RANGE_KEYS:
                    raise FilterError(
                        f"filter {key}{op}{value}: only {' and '.join(RANGE_KEYS)} take "
                        f"{', '.join(RANGE_OPS)}; use {key}=value"
                    )
                ranges.append(Clause(key, op, (_range_value(key, op, value),)))
        clauses = [Clause(k, "=", tuple(vs)) for k, vs in merged.items()] + ranges
        if len(clauses) > MAX_CLAUSES or sum(len(c.values) for c in clauses) > MAX_VALUES:
            raise FilterError(
                f"filter too large: at most {MAX_CLAUSES} keys and {MAX_VALUES} values"
            )
        return cls(tuple(clauses))

    def as_dict(self) -> dict[str, list[str]]:
        """The filter as JSON (``{"tags": ["a", "b"], "modified>=": ["2025-01-01T00:00:00Z"]}``)."""
        out: dict[str, list[str]] = {}
        for c in self.clauses:
            out.setdefault(c.key if c.op == "=" else f"{c.key}{c.op}", []).extend(c.values)
        return out


def _range_value(key: str, op: str, value: str) -> str:
    if key == "size":
        if not value.isdigit():
            raise FilterError(f"filter size{op}{value}: give a whole number of bytes")
        return str(int(value))
    try:
        if len(value) == 10:
            when = _dt.datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=_dt.UTC)
        else:
            when = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            if when.tzinfo is None:
                when = when.replace(tzinfo=_dt.UTC)
    except ValueError:
        raise FilterError(
            f"filter modified{op}{value}: give an ISO date or time (2025-01-31, "
            "2025-01-31T12:00:00Z)"
        ) from None
    return when.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Scope:
    """What one request may see: its filter and the caller's groups (None: everything)."""

    filter: Filter = field(default_factory=Filter)
    groups: frozenset[str] | None = None

    @property
    def unrestricted(self) -> bool:
        return self.groups is None and not self.filter

    def sql(self) -> str | None:
        """The scope as a LanceDB ``where`` clause over the chunk rows' metadata columns."""
        parts: list[str] = []
        if self.groups is not None:
            parts.append(f"array_has_any(access, {_sql_list([PUBLIC, *sorted(self.groups)])})")
        for c in self.filter.clauses:
            if c.op == "=":
                parts.append(f"array_has_any(meta, {_sql_list(f'{c.key}={v}' for v in c.values)})")
            elif c.key == "size":
                parts.append(f"size {c.op} {int(c.values[0])}")
            else:
                parts.append(f"modified {c.op} {_sql_text(c.values[0])}")
        return " AND ".join(parts) or None


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sql_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_sql_text(v) for v in values) + "]"


@dataclass
class Plan:
    """A scope resolved against one index version: which documents (and resident rows) match,
    how many chunks, and the ``where`` clause for LanceDB's prefilter."""

    docs: np.ndarray  # bool per document (DocumentFacts order)
    rows: np.ndarray | None  # bool per resident row, or None (rows not held in memory)
    count: int  # chunks that match
    sql: str | None


class DocumentFacts:
    """One index version's documents as arrays for masks (see the module docstring)."""

    def __init__(self, documents: list[tuple[str, Metadata, list[str] | None]]):
        """``documents``: (id, metadata, access values: groups or ``["*"]``, or None for a
        document whose access is unknown: visible to the administrator only)."""
        self.ids = [d[0] for d in documents]
        self.pos = {d: i for i, d in enumerate(self.ids)}
        n = len(self.ids)
        labels: dict[str, list[int]] = {}
        keys: dict[str, list[int]] = {}
        groups: dict[str, list[int]] = {}
        self.size = np.full(n, -1, dtype=np.int64)
        modified = [""] * n
        self.metadata: list[Metadata] = []
        for i, (_, md, access) in enumerate(documents):
            self.metadata.append(md)
            for k, vs in md.items():
                keys.setdefault(k, []).append(i)
                for v in vs:
                    labels.setdefault(f"{k}={v}", []).append(i)
            for g in access or []:
                groups.setdefault(g, []).append(i)
            size = (md.get("size") or [""])[0]
            if size.isdigit():
                self.size[i] = int(size)
            modified[i] = (md.get("modified") or [""])[0]
        self.modified = np.array(modified, dtype="U20") if n else np.zeros(0, dtype="U20")
        self.labels = {k: np.asarray(v, dtype=np.int64) for k, v in labels.items()}
        self.keys = {k: np.asarray(v, dtype=np.int64) for k, v in keys.items()}
        self.groups = {g: np.asarray(v, dtype=np.int64) for g, v in groups.items()}

    @classmethod
    def from_documents(cls, docs: Mapping[str, Mapping[str, Any]]) -> DocumentFacts:
        """From ``IndexStore.canonical_texts`` records (``metadata_json``, ``access``); a store
        from before issue 34 has neither: its documents get their file-system keys and are
        visible to every caller, as they were."""
        out: list[tuple[str, Metadata, list[str] | None]] = []
        for doc_id in sorted(docs):
            r = docs[doc_id]
            blob = r.get("metadata_json")
            if blob:
                md = {str(k): [str(v) for v in vs] for k, vs in json.loads(blob).items()}
                access = list(r.get("access") or [])
            else:
                md = system_facts(doc_id, str(r.get("kind") or ""), None, str(r.get("title") or ""))
                access = [PUBLIC]
            out.append((doc_id, md, access))
        return cls(out)

    def __len__(self) -> int:
        return len(self.ids)

    def visible(self, groups: frozenset[str] | None) -> np.ndarray:
        """Per document: may a caller with ``groups`` (None: everything) see it?"""
        n = len(self.ids)
        if groups is None:
            return np.ones(n, dtype=bool)
        out = np.zeros(n, dtype=bool)
        for g in (PUBLIC, *groups):
            if g in self.groups:
                out[self.groups[g]] = True
        return out

    def mask(self, scope: Scope) -> np.ndarray:
        """Per document: visible to the scope's groups and matching its filter. Raises
        :class:`FilterError` for a key no visible document has."""
        out = self.visible(scope.groups)
        if scope.filter:
            self.check_keys(scope.filter, out)
        for c in scope.filter.clauses:
            hit = np.zeros(len(self.ids), dtype=bool)
            if c.op == "=":
                for v in c.values:
                    idx = self.labels.get(f"{c.key}={v}")
                    if idx is not None:
                        hit[idx] = True
            elif c.key == "size":
                hit = _compare(self.size, c.op, int(c.values[0])) & (self.size >= 0)
            else:
                hit = _compare(self.modified, c.op, c.values[0]) & (self.modified != "")
            out &= hit
        return out

    def check_keys(self, flt: Filter, visible: np.ndarray) -> None:
        known = self.known_keys(visible)
        for c in flt.clauses:
            if c.key not in known:
                raise FilterError(
                    f"unknown filter key {c.key!r}: the documents here have "
                    f"{', '.join(sorted(known))}"
                )

    def known_keys(self, visible: np.ndarray) -> set[str]:
        known = set(ALWAYS_KEYS)
        for k, idx in self.keys.items():
            if k not in known and bool(visible[idx].any()):
                known.add(k)
        return known

    def facets(self, groups: frozenset[str] | None) -> dict[str, Any]:
        """What the page offers a caller: the folders and, per key, the values of the documents
        it can see (``document``, ``size``, ``modified``, ``title``: the key only)."""
        visible = self.visible(groups)
        values: dict[str, set[str]] = {}
        for i in np.flatnonzero(visible).tolist():
            for k, vs in self.metadata[i].items():
                values.setdefault(k, set()).update(vs)
        folders = sorted(values.pop("folder", set()))
        keys = {}
        for k in sorted(self.known_keys(visible) - {"folder"}):
            listed = k not in ("document", "size", "modified", "title")
            keys[k] = sorted(values.get(k, ()))[:FACET_VALUES] if listed else []
        return {"documents": int(visible.sum()), "folders": folders, "keys": keys}

    def access_of(self, document_id: str) -> list[str] | None:
        i = self.pos.get(document_id)
        if i is None:
            return None
        return [g for g, idx in self.groups.items() if i in set(idx.tolist())]

    def metadata_of(self, document_id: str) -> Metadata | None:
        i = self.pos.get(document_id)
        return None if i is None else self.metadata[i]


def _compare(arr: np.ndarray, op: str, value: Any) -> np.ndarray:
    if op == ">=":
        return np.asarray(arr >= value)
    if op == "<=":
        return np.asarray(arr <= value)
    if op == ">":
        return np.asarray(arr > value)
    return np.asarray(arr < value)


def positions(facts: DocumentFacts, document_ids: Iterable[str]) -> np.ndarray:
    """Document positions of ``document_ids`` (-1 for one the documents table lacks)."""
    return np.asarray([facts.pos.get(d, -1) for d in document_ids], dtype=np.int64)


def take(mask: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``mask[where]`` with -1 (unknown document) read as False."""
    out = np.zeros(len(where), dtype=bool)
    ok = where >= 0
    out[ok] = mask[where[ok]]
    return out


__all__ = [
    "ACCESS_KEY",
    "ALWAYS_KEYS",
    "Clause",
    "DocumentFacts",
    "Filter",
    "FilterError",
    "Plan",
    "Scope",
    "positions",
    "take",
]
