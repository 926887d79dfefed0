"""API tokens kept with the index (issue 34): ``rag-assets token add NAME --groups A,B``.

A token is shown once, when it is made; the index keeps only its SHA-256 (tokens are 256 random
bits, so a fast hash is the right one: nothing to brute-force). Each change is an event file
that is never rewritten, under ``access/tokens/`` (a folder of a local index, ``_rag_files``
rows on object storage, written through :class:`~.files.FileRows` like the evaluation
reports): ``add`` (name, groups, hash) or ``revoke`` (name). The state is the events replayed
in order, so two operators adding and revoking at once never overwrite each other, and a
revoke cannot be lost to a concurrent add.

:meth:`TokenFiles.token_state` is what a running service calls on every request: it lists the
event names (a directory listing, or one small ``_rag_files`` query remotely) and reads only
new events, so a revoked token is refused by the next request, with no cache to wait for.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field

from rag_assets.lib.index.store.files import FileRows
from rag_assets.lib.index.store.schema import now_iso
from rag_assets.lib.ingest.metadata import GROUP_RE

TOKENS_DIR = "access/tokens"
TOKEN_PREFIX = "rag_"
NAME_RE = GROUP_RE
"""Token names follow the group-name rule: letters, digits, ``_``, ``.``, ``-``."""


class TokenError(ValueError):
    """A token command that cannot be done (one line naming why)."""


@dataclass(frozen=True)
class TokenRecord:
    """One token as the index knows it (never the token itself)."""

    name: str
    groups: tuple[str, ...]
    hash: str  # sha256 hex of the token
    created: str
    revoked: str = ""  # ISO time of the revocation, "" while active

    @property
    def active(self) -> bool:
        return not self.revoked

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "groups": list(self.groups),
            "created": self.created,
            "revoked": self.revoked or None,
        }


@dataclass
class TokenState:
    """The replayed events: every token ever added (revoked ones included), newest last."""

    names: tuple[str, ...] = ()
    records: list[TokenRecord] = field(default_factory=list)

    @property
    def active(self) -> list[TokenRecord]:
        return [r for r in self.records if r.active]

    def find(self, token: str) -> TokenRecord | None:
        """The active record of ``token`` (compared in constant time), or None."""
        digest = token_hash(token)
        found = None
        for r in self.active:
            if hmac.compare_digest(digest, r.hash):
                found = r
        return found


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_name(name: str, what: str = "token name") -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise TokenError(
            f"{name!r} is not a valid {what}: use letters, digits, _ . - (up to 64, starting "
            "with a letter or digit)"
        )
    return name


class TokenFiles(FileRows):
    """Token events beside the tables (see the module docstring)."""

    _token_cache: TokenState | None = None

    def add_token(self, name: str, groups: list[str]) -> str:
        """Make a token for ``name`` with ``groups``; returns it (the only time it exists
        outside the caller's hands). Refuses a name that has an active token."""
        check_name(name)
        for g in groups:
            check_name(g, "group name")
        if any(r.name == name for r in self.token_state().active):
            raise TokenError(
                f"token {name!r} exists: revoke it first (`rag-assets token revoke {name}`)"
            )
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        event = {"action": "add", "name": name, "groups": sorted(set(groups))}
        self._token_event({**event, "hash": token_hash(token)})
        return token

    def revoke_token(self, name: str) -> TokenRecord:
        """Revoke the active token of ``name`` (a running service refuses it on its next
        request); returns its record."""
        active = [r for r in self.token_state().active if r.name == name]
        if not active:
            known = ", ".join(sorted({r.name for r in self.token_state().active})) or "none"
            raise TokenError(f"no active token named {name!r} (active: {known})")
        self._token_event({"action": "revoke", "name": name})
        return active[-1]

    def tokens(self) -> list[TokenRecord]:
        """Every token added, revoked ones too, in the order they were made."""
        return list(self.token_state().records)

    def token_state(self) -> TokenState:
        """The current tokens: the event names are listed on every call and only events not
        seen before are read (a revoke is seen by the very next call)."""
        names = tuple(self.file_names(TOKENS_DIR))
        cached = self._token_cache
        if cached is not None and cached.names == names:
            return cached
        events = []
        for name in names:
            data = self.read_file(name)
            if data is None:
                continue
            try:
                event = json.loads(data)
            except ValueError:
                continue  # a torn event is no event (never a half-revoked token)
            events.append(event)
        state = TokenState(names, _replay(events))
        self._token_cache = state
        return state

    def _token_event(self, event: dict[str, object]) -> None:
        seq = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
        body = json.dumps({**event, "at": now_iso()}, sort_keys=True)
        self.write_file(f"{TOKENS_DIR}/{seq}.json", body)


def _replay(events: list[dict[str, object]]) -> list[TokenRecord]:
    records: list[TokenRecord] = []
    for e in events:  # names sort by time: the events' order
        name = str(e.get("name", ""))
        if e.get("action") == "add" and e.get("hash"):
            groups = e.get("groups") or []
            records.append(
                TokenRecord(
                    name,
                    tuple(str(g) for g in groups) if isinstance(groups, list) else (),
                    str(e["hash"]),
                    str(e.get("at", "")),
                )
            )
        elif e.get("action") == "revoke":
            at = str(e.get("at", "")) or now_iso()
            records = [
                TokenRecord(r.name, r.groups, r.hash, r.created, at)
                if r.name == name and r.active
                else r
                for r in records
            ]
    return records
