"""Who is asking, and what they may see (issue 34).

A request's credential (:func:`credential`: the bearer token; else the search page's signed
session, issue 30's :mod:`rag_assets.serve.session`, which names its token) is resolved by
:class:`Access` into a :class:`Caller`:

- ``RAG_API_TOKEN`` is the administrator: every document (``groups`` None);
- a token made by ``rag-assets token add NAME --groups A,B`` (kept, hashed, with the index:
  :mod:`rag_assets.lib.index.store.tokens`) is ``NAME`` with groups ``{A, B}``: the documents
  without an ``access`` key, and those whose ``access`` names one of its groups;
- anything else is refused (401). Tokens are read on every request (a listing of the token
  events, no parse when nothing changed), so a revoked token is refused by the next request.

Authentication is on when ``RAG_API_TOKEN`` is set or the index has ever had a token (revoking
the last one never opens the service). With neither, every request is the local operator and
sees everything, as before tokens existed.

:func:`credential` is the one place that reads a bearer token from a request, and
:meth:`Access.by_session` turns a page session into its token's caller.
:func:`restricted_status` is ``/status`` as a token sees it: counts and document lists of the
documents it may see, nothing about the others (no tables, rollback stack, history, writers or
folder), and no refusal cut; :func:`without_cut` is its answers without the cut (issue 43).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag_assets.lib.query.filters import Filter, Scope

if TYPE_CHECKING:
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.query.retrieve import Index

TOKEN_COOKIE = "rag_token"
"""The cookie that held the raw token before issue 30's signed sessions: never a credential."""


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: a name and the groups it may see (None: every document)."""

    name: str
    groups: frozenset[str] | None

    @property
    def admin(self) -> bool:
        return self.groups is None

    def scope(self, flt: Filter | None = None) -> Scope:
        return Scope(flt or Filter(), self.groups)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "groups": None if self.groups is None else sorted(self.groups)}


ADMIN = Caller("admin", None)
"""``RAG_API_TOKEN``'s holder."""
OPERATOR = Caller("operator", None)
"""The local operator: the CLI, ``rag-assets mcp`` over stdio without a token, and every request
to a service that has no token at all."""


def log_name(caller: Caller | None) -> str | None:
    """Who the query log records as asking (issue 33): the token's name, or None for the
    administrator and the local operator (who see every document and may judge every query)."""
    return None if caller is None or caller.admin else caller.name


def credential(request: Any) -> str:
    """The bearer token a request carries (``Authorization: Bearer <token>``), else ""."""
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return ""


class Access:
    """Credentials of one index: ``RAG_API_TOKEN`` and the tokens kept with the index."""

    def __init__(self, store: IndexStore, admin_token: str = ""):
        self.store = store
        self.admin_token = admin_token

    def required(self) -> bool:
        """Whether requests need a credential: ``RAG_API_TOKEN`` is set, or the index has had
        a token (revoked ones count: revoking the last token does not open the service)."""
        return bool(self.admin_token) or bool(self.store.token_state().records)

    def caller(self, secret: str) -> Caller | None:
        """The caller a credential stands for, :data:`OPERATOR` when no credential is needed,
        or None (refused)."""
        state = self.store.token_state()  # read now: a revoke is seen by this very request
        if not self.admin_token and not state.records:
            return OPERATOR
        return self.resolve(secret)

    def resolve(self, secret: str) -> Caller | None:
        """The caller of ``secret`` itself (the administrator, or an active token of the
        index), or None; never the operator, even where no credential is needed."""
        if not secret:
            return None
        if self.admin_token and hmac.compare_digest(secret.encode(), self.admin_token.encode()):
            return ADMIN
        record = self.store.token_state().find(secret)
        return None if record is None else Caller(record.name, frozenset(record.groups))

    def session_hash(self, name: str) -> str | None:
        """The SHA-256 of the active token a page session names (:data:`~rag_assets.serve.
        session.ADMIN_NAME`: ``RAG_API_TOKEN``), or None: the session then ends."""
        from rag_assets.lib.index.store.tokens import token_hash
        from rag_assets.serve.session import ADMIN_NAME

        if name == ADMIN_NAME:
            return token_hash(self.admin_token) if self.admin_token else None
        found = [r for r in self.store.token_state().active if r.name == name]
        return found[-1].hash if found else None

    def by_session(self, name: str) -> Caller | None:
        """The caller of a checked page session naming the token ``name``."""
        from rag_assets.serve.session import ADMIN_NAME

        if name == ADMIN_NAME:
            return ADMIN if self.admin_token else None
        found = [r for r in self.store.token_state().active if r.name == name]
        return Caller(found[-1].name, frozenset(found[-1].groups)) if found else None

    def session_of(self, secret: str) -> tuple[str, str] | None:
        """(session name, token hash) for a page login with ``secret``, or None (refused)."""
        from rag_assets.lib.index.store.tokens import token_hash
        from rag_assets.serve.session import ADMIN_NAME

        who = self.resolve(secret)
        if who is None:
            return None
        return (ADMIN_NAME if who is ADMIN else who.name), token_hash(secret)

    def named(self, name: str) -> Caller:
        """The caller of the active token ``name`` (``search --as NAME``): what it would see."""
        for record in reversed(self.store.token_state().active):
            if record.name == name:
                return Caller(record.name, frozenset(record.groups))
        known = ", ".join(sorted({r.name for r in self.store.token_state().active})) or "none"
        raise ValueError(f"--as {name}: no active token of that name (active: {known})")


LINK_REASON = (
    "symbolic link: skipped (links are followed once, only to a file inside the documents "
    "folder; the administrator's status names its target)"
)
"""Issue 43: what a token's ``/status`` says of a skipped link, whose reason names its target
(a file or folder the token may not see; a link's target is no document of its own)."""


FAILED_REASON = "could not be read or extracted (the administrator's status has the reason)"
"""A failed document's reason as a token sees it (issue 49): the cause (a bucket's or a
repository's error, a URL, a path) is the administrator's."""


def _scrubbed(row: dict[str, Any], failed: bool = False) -> dict[str, Any]:
    """A status row for a token: a skip reason that names another path (a link's target, a
    document it is indexed as) says only what kind of skip it is; a failure's reason is the
    administrator's (issue 49)."""
    reason = row.get("reason")
    if reason and (failed or row.get("state") == "failed"):
        return {**row, "reason": FAILED_REASON}
    if isinstance(reason, str) and "symbolic link" in reason:
        return {**row, "reason": LINK_REASON}
    return row


CUT_HIDDEN = "nothing close enough in the documents you may see"
"""A group token's refusal reason: the cut's number is left out (issue 43)."""


def without_cut(out: dict[str, Any]) -> dict[str, Any]:
    """Issue 43: ``POST /ask``'s object (and the MCP ``ask`` result) for a group token, without
    the refusal cut: it is calibrated on every document, hidden ones included, so its number
    is the administrator's (``threshold`` None, the reason, message and closeness lines without
    it, no ``over_cut``). The token's own distances stay: what it was shown."""
    if out.get("threshold") is None:
        return out
    shown = dict(out) | {"threshold": None}
    if out.get("refused_by") == "distance":
        nearest = out.get("nearest_distance")
        shown["reason"] = CUT_HIDDEN
        shown["message"] = f'NO ANSWER: {CUT_HIDDEN} for "{out.get("question")}"'
        shown["closeness"] = (
            f"nearest source at cosine distance {nearest:.3f}"
            if isinstance(nearest, int | float)
            else "nothing retrieved"
        )
    elif out.get("refused_by") in ("judge", "verification") and out.get("closeness"):
        shown["closeness"] = str(out["closeness"]).split(" (under the cut")[0]
    shown["nearest"] = [n | {"over_cut": None} for n in out.get("nearest") or []]
    return shown


def restricted_documents(index: Index) -> int:
    """How many published documents have an ``access`` key (are not visible to every token)."""
    return int(len(index.facts) - index.facts.visible(frozenset()).sum())


def restricted_status(report: dict[str, Any], index: Index, caller: Caller) -> dict[str, Any]:
    """``status --json`` as ``caller`` sees it: the published version (its row count over the
    visible documents), the visible documents with their states and chunk counts, and the
    metadata keys of those documents; nothing about documents it may not see."""
    groups = caller.groups

    def visible(row: dict[str, Any]) -> bool:
        doc = str(row.get("document", ""))
        if doc in index.facts.pos:
            return index.visible(doc, groups)
        md = row.get("metadata") or {}
        access = md.get("access")
        return access is None or bool(groups and set(access) & groups)

    manifest = index.store.manifest(index.published) or {}
    manifest_md = {
        str(r.get("document_id")): r.get("metadata") for r in manifest.get("documents") or []
    }
    docs = report.get("documents", {})

    def keep(rows: list[dict[str, Any]], failed: bool = False) -> list[dict[str, Any]]:
        return [
            _scrubbed(r, failed)
            for r in rows
            if visible({**r, "metadata": manifest_md.get(str(r.get("document")))})
        ]

    listed = keep(list(docs.get("list", [])))
    shown_docs = {
        "of": docs.get("of"),
        "ok": sum(1 for r in listed if r.get("state") == "ok") if "list" in docs else None,
        "failed": keep(list(docs.get("failed", [])), failed=True),
        "skipped": keep(list(docs.get("skipped", []))),
        "partial": keep(list(docs.get("partial", []))),
        "list": listed,
    }
    pub = report.get("published")
    published = None
    if pub:
        plan = index.plan(caller.scope())
        rows = plan.count if plan is not None else pub.get("rows")
        published = {
            k: v
            for k, v in pub.items()
            # figures over every document; the cut too (issue 43: calibrated on all of them)
            if k not in ("evaluation_note", "evaluation_counts") and not k.startswith("threshold")
        } | {"rows": rows}
    return {
        "caller": caller.as_dict(),
        "published": published,
        "documents": shown_docs,
        "metadata": index.facets(groups),
        "rerank": report.get("rerank"),
    }
