"""A small client for OpenAI-compatible chat endpoints (llama.cpp's server, vLLM, Ollama, hosted).

Standard library only (``urllib``): no model runtime is a dependency of the install. Used by
answer generation, the LLM reranker and judge, question writing and query rewriting.

Endpoint hygiene: credentials in the URL (``http://user:pass@host``) are redacted from every
message, an API key (``RAG_LLM_API_KEY``) is sent as a bearer token and never printed, at most
200 bytes of a server's reply appear in an error, and a plain ``http://`` endpoint on a host that
is not loopback is warned about once per process.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass, field
from typing import Any

# the URL, credential and error plumbing is shared with the embedding and rerank clients
from rag_assets.lib.models.http import HttpError, credentials, is_loopback, redact, send
from rag_assets.lib.models.http import scrub as _scrub

ENV_URL = "RAG_LLM_URL"
"""Environment variable naming the endpoint (read by the caller; named in every error)."""

_warned: set[str] = set()
_warn_lock = threading.Lock()


class LLMError(RuntimeError):
    """The endpoint could not produce a completion."""


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
        creds = credentials(self.url, self.api_key)
        self._creds = creds
        self._basic: str | None = creds.basic
        self._secrets = list(creds.secrets)
        self.endpoint = chat_endpoint(creds.url)
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
        try:
            return send(
                self.endpoint, body, where=self.where, creds=self._creds, timeout=self.timeout
            )
        except HttpError as exc:
            raise LLMError(str(exc)) from exc


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
