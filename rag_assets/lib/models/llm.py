"""A small client for OpenAI-compatible chat endpoints (llama.cpp's server, vLLM, Ollama, hosted).

Standard library only (``urllib``): no model runtime is a dependency of the install. Used by
answer generation, the LLM reranker and judge, question writing and query rewriting.

Endpoint hygiene: credentials in the URL (``http://user:pass@host``) are redacted from every
message, an API key (``RAG_LLM_API_KEY``) is sent as a bearer token and never printed, at most
200 bytes of a server's reply appear in an error, and a plain ``http://`` endpoint on a host that
is not loopback is warned about once per process.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import math
import threading
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass, field
from typing import Any

ENV_URL = "RAG_LLM_URL"
"""Environment variable naming the endpoint (read by the caller; named in every error)."""

_warned: set[str] = set()
_warn_lock = threading.Lock()


class LLMError(RuntimeError):
    """The endpoint could not produce a completion."""


def redact(url: str) -> str:
    """``url`` with any ``user:password@`` and ``key=`` style query values replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{k}=***" for k, _ in pairs)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def chat_endpoint(url: str) -> str:
    """Normalise a base URL to its ``/v1/chat/completions`` endpoint."""
    base = url.strip().rstrip("/")
    if not base:
        raise LLMError(f"{ENV_URL} is empty")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return base + "/chat/completions"
    return base + "/v1/chat/completions"


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_insecure(url: str) -> bool:
    """Warn once per endpoint when ``url`` is plain http to a non-loopback host; True if so."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return False
    key = f"{parts.hostname}:{parts.port}"
    with _warn_lock:
        if key in _warned:
            return True
        _warned.add(key)
    warnings.warn(
        f"{ENV_URL} {redact(url)} is plain http:// to a non-loopback host: questions and "
        "sources travel unencrypted; use https:// or a loopback address",
        stacklevel=3,
    )
    return True


@dataclass
class Completion:
    """One chat completion: its text and, where the server gave them, the top log-probabilities
    of each generated token (``top_logprobs[i]`` maps token text → natural-log probability)."""

    text: str
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    model: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def first_token_probability(self, *words: str) -> float | None:
        """P(first generated token is one of ``words``), case- and blank-insensitive, summed over
        the matching entries of the first position's top log-probabilities; None when the server
        gave no log-probabilities."""
        if not self.top_logprobs:
            return None
        wanted = {w.strip().lower() for w in words}
        return sum(
            math.exp(lp)
            for tok, lp in self.top_logprobs[0].items()
            if tok.strip().lower() in wanted
        )


@dataclass
class LLMClient:
    """An OpenAI-compatible chat endpoint. ``model`` None lets the server pick its loaded one."""

    url: str
    model: str | None = None
    api_key: str | None = None
    timeout: float = 120.0

    def __post_init__(self) -> None:
        # ``user:password@`` in the URL becomes a Basic Authorization header (urllib cannot send
        # it from the URL); the request URL never carries it, and every secret is scrubbed
        parts = urllib.parse.urlsplit(self.url.strip())
        self._basic: str | None = None
        bare = self.url
        if parts.username is not None or parts.password is not None:
            user = urllib.parse.unquote(parts.username or "")
            password = urllib.parse.unquote(parts.password or "")
            self._basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            host = parts.netloc.rsplit("@", 1)[1]
            bare = urllib.parse.urlunsplit(
                (parts.scheme, host, parts.path, parts.query, parts.fragment)
            )
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        self._secrets = [
            v
            for v in (
                self.api_key,
                parts.password,
                urllib.parse.unquote(parts.password or ""),
                self._basic,  # a server echoing the header must not leak it base64-encoded
            )
            if v
        ] + [v for _, v in query if len(v) >= 4]
        self.endpoint = chat_endpoint(bare)
        warn_if_insecure(self.url)

    @property
    def where(self) -> str:
        return f"{ENV_URL}={redact(self.url)}"

    def model_id(self) -> str:
        """``model`` if set, else the first id the server lists at ``/v1/models`` (issue 15:
        generated views are stamped with it)."""
        if self.model:
            return self.model
        url = self.endpoint.rsplit("/chat/completions", 1)[0] + "/models"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            req = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                data = json.loads(response.read().decode("utf-8"))
            return str(data["data"][0]["id"])
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"cannot list models at {self.where}: {exc}") from exc

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        seed: int | None = 0,
        stop: list[str] | None = None,
    ) -> Completion:
        """POST one chat completion; raise :class:`LLMError` (with the URL redacted) on failure."""
        body: dict[str, Any] = {
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "stream": False,
        }
        if self.model:
            body["model"] = self.model
        if seed is not None:
            body["seed"] = seed
        if stop:
            body["stop"] = stop
        if top_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = top_logprobs
        payload = self._post(body)
        try:
            return _completion_of(payload, self.where)
        except LLMError as exc:  # the reply is quoted: a server may echo a credential
            raise LLMError(_scrub(str(exc), *self._secrets)) from exc

    def _post(self, body: dict[str, Any]) -> bytes:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        elif self._basic:
            headers["Authorization"] = f"Basic {self._basic}"
        request = urllib.request.Request(
            self.endpoint, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = _scrub(exc.read()[:200].decode("utf-8", "replace"), *self._secrets)
            except OSError:
                detail = str(exc.reason)
            raise LLMError(f"{self.where} answered HTTP {exc.code}: {detail}") from exc
        except TimeoutError as exc:
            raise LLMError(f"{self.where} did not answer within {self.timeout:g} s") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise LLMError(f"{self.where} did not answer within {self.timeout:g} s") from exc
            raise LLMError(f"cannot reach {self.where}: {reason}") from exc


def _scrub(text: str, *secrets: str | None) -> str:
    """``text`` with every non-empty secret (longest first) replaced by ``***``."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _completion_of(payload: bytes, where: str) -> Completion:
    try:
        data = json.loads(payload.decode("utf-8"))
        choice = data["choices"][0]
        content = choice["message"]["content"]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LLMError(f"{where} returned malformed JSON: {payload[:200]!r}") from exc
    except (KeyError, IndexError, TypeError) as exc:
        raise LLMError(
            f"{where} returned no choices[0].message.content: {payload[:200]!r}"
        ) from exc
    if not isinstance(content, str):
        raise LLMError(f"{where} returned non-text content: {content!r:.200}")
    return Completion(
        text=content,
        top_logprobs=_top_logprobs(choice.get("logprobs")),
        model=str(data.get("model", "")),
        raw=data,
    )


def _top_logprobs(lp: Any) -> list[dict[str, float]]:
    """Both shapes servers use: chat (``content[i].top_logprobs[j] = {token, logprob}``) and
    completions (``top_logprobs[i] = {token: logprob}``)."""
    if not isinstance(lp, dict):
        return []
    out: list[dict[str, float]] = []
    if isinstance(lp.get("content"), list):
        for pos in lp["content"]:
            tops = pos.get("top_logprobs") or [
                {"token": pos.get("token"), "logprob": pos.get("logprob")}
            ]
            out.append(
                {
                    str(t["token"]): float(t["logprob"])
                    for t in tops
                    if t.get("token") is not None and t.get("logprob") is not None
                }
            )
    elif isinstance(lp.get("top_logprobs"), list):
        for pos in lp["top_logprobs"]:
            if isinstance(pos, dict):
                out.append({str(k): float(v) for k, v in pos.items()})
    return out
