"""Signed login sessions for the search page (issue 30): the cookie never holds the token.

``POST /login`` with the right token sets the ``rag_session`` cookie to a session value::

    v1.<token name>.<issued>.<expires>.<nonce>.<signature>

``token name`` is the name of the token logged in with (issue 34's ``rag-assets token add NAME``;
:data:`ADMIN_NAME` for ``RAG_API_TOKEN``), base64url-encoded. ``signature`` is HMAC-SHA256
over the rest under a key derived from a server-side secret and that token's SHA-256 (what the
index keeps of it: ``HMAC(secret, "rag-assets session" + sha256(token))``), so a session:

* **expires**: ``expires`` = issued + ``RAG_SESSION_TTL_S`` (default 12 h; the cookie's
  ``Max-Age`` too), checked on every request;
* **is revoked without changing the token**: ``POST /logout`` revokes the session it is sent
  with (its nonce is listed in ``revoked.json`` until it would have expired);
  ``POST /logout?all=1`` replaces the secret, which ends every session at once;
* **ends with its token**: the key is derived from the token's hash, which is looked up by name
  on every request: a revoked token (``rag-assets token revoke``), a token added again under the
  same name, or a changed ``RAG_API_TOKEN`` ends its sessions at once;
* **carries who logged in**: the session is the token's caller, with that token's groups.

The secret (32 random bytes) and the revocation list live in ``<RAG_WORK_DIR>/serve/``, the
local, per-machine folder ``serve`` already writes (the index may be read-only or a bucket):
every worker of ``serve --workers N`` reads the same files and notices a change by its
``stat``. Deleting ``session-secret`` also ends every session. Where the folder cannot be
written, a per-process secret is used (sessions then end with the process) and a warning says
so once.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COOKIE = "rag_session"
"""The session cookie (HttpOnly, SameSite=Strict, Path=/, Secure over https)."""

ADMIN_NAME = "@admin"
"""The name a session of ``RAG_API_TOKEN`` carries (no token made by ``token add`` has an @)."""

VERSION = "v1"
SECRET_FILE = "session-secret"
REVOKED_FILE = "revoked.json"


@dataclass(frozen=True)
class Session:
    token_name: str
    issued: int
    expires: int
    nonce: str


class Sessions:
    """Issue and check session values (thread-safe; see the module docstring)."""

    def __init__(self, folder: Path | None, ttl_s: float) -> None:
        self.folder = folder
        self.ttl_s = int(ttl_s)
        self._lock = threading.Lock()
        self._secret: tuple[Any, bytes] | None = None  # (stat key, secret)
        self._revoked: tuple[Any, dict[str, int]] = (None, {})  # (stat key, from the file)
        self._memory_revoked: dict[str, int] = {}  # where the file cannot be written
        self._fallback: bytes | None = None

    # -- issuing and checking --------------------------------------------------------------
    def issue(self, token_name: str, token_hash: str, now: float | None = None) -> str:
        """A session of the token ``token_name`` whose SHA-256 is ``token_hash``."""
        issued = int(now if now is not None else time.time())
        name = _b64(token_name.encode())
        payload = f"{VERSION}.{name}.{issued}.{issued + self.ttl_s}.{secrets.token_hex(16)}"
        return f"{payload}.{self._sign(payload, token_hash)}"

    def check(
        self, value: str, hash_of: Callable[[str], str | None], now: float | None = None
    ) -> Session | None:
        """The session ``value`` names when it is genuine, unexpired and not revoked, and its
        token is still active: ``hash_of(name)`` is that token's SHA-256 now (None: none)."""
        parts = value.split(".")
        if len(parts) != 6 or parts[0] != VERSION:
            return None
        try:
            name = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)).decode()
            session = Session(name, int(parts[2]), int(parts[3]), parts[4])
        except ValueError:
            return None
        token_hash = hash_of(name)
        if not token_hash:
            return None
        payload, signature = ".".join(parts[:5]), parts[5]
        if not hmac.compare_digest(signature.encode(), self._sign(payload, token_hash).encode()):
            return None
        if (now if now is not None else time.time()) >= session.expires:
            return None
        if session.nonce in self._revoked_nonces():
            return None
        return session

    def revoke(self, session: Session) -> None:
        """End one session (listed until it would have expired)."""
        with self._lock:
            now = int(time.time())
            revoked = {n: e for n, e in self._revoked_nonces().items() if e > now}
            revoked[session.nonce] = session.expires
            if self.folder is None or not self._write(REVOKED_FILE, json.dumps(revoked).encode()):
                self._memory_revoked[session.nonce] = session.expires

    def revoke_all(self) -> None:
        """A new secret: every session issued so far ends."""
        with self._lock:
            fresh = secrets.token_bytes(32)
            if self.folder is None or not self._write(SECRET_FILE, fresh):
                self._fallback = fresh
            self._secret = None

    # -- the secret ------------------------------------------------------------------------
    def _sign(self, payload: str, token_hash: str) -> str:
        key = hmac.new(self._secret_bytes(), b"rag-assets session" + token_hash.encode(), "sha256")
        return _b64(hmac.new(key.digest(), payload.encode(), hashlib.sha256).digest())

    def _secret_bytes(self) -> bytes:
        if self._fallback is not None or self.folder is None:
            return self._fallback_secret()
        path = self.folder / SECRET_FILE
        for _ in range(3):
            key = _stat_key(path)
            cached = self._secret
            if key is not None and cached is not None and cached[0] == key:
                return cached[1]
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                written = self._write(SECRET_FILE, secrets.token_bytes(32), exclusive=True)
                if not written and not path.exists():  # the folder cannot be written
                    return self._fallback_secret()
                continue
            except OSError:
                return self._fallback_secret()
            if len(data) >= 32:
                self._secret = (_stat_key(path), data)
                return data
        return self._fallback_secret()

    def _fallback_secret(self) -> bytes:
        if self._fallback is None:
            self._fallback = secrets.token_bytes(32)
            print(
                f"rag-assets: warning: sessions cannot be stored in {self.folder}: login "
                "sessions end when this process does (check RAG_WORK_DIR is writable)",
                file=sys.stderr,
            )
        return self._fallback

    def _revoked_nonces(self) -> dict[str, int]:
        """Nonce -> expiry of the revoked sessions (the file re-read when its stat changes)."""
        found: dict[str, int] = {}
        if self.folder is not None:
            path = self.folder / REVOKED_FILE
            key = _stat_key(path)
            if key is not None and self._revoked[0] != key:
                try:
                    data = json.loads(path.read_text())
                    self._revoked = (key, {str(k): int(v) for k, v in dict(data).items()})
                except (OSError, ValueError, TypeError):
                    pass
            found = self._revoked[1] if key is not None else {}
        return found | self._memory_revoked

    def _write(self, name: str, data: bytes, exclusive: bool = False) -> bool:
        """Write ``folder/name`` atomically (0600); ``exclusive``: only if it does not exist."""
        assert self.folder is not None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            try:
                if exclusive:
                    with contextlib.suppress(FileExistsError):
                        os.link(tmp, self.folder / name)
                else:
                    os.replace(tmp, self.folder / name)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        except OSError:
            return False
        return True


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _stat_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
