"""An on-disk cache in front of :class:`~rag_assets.lib.models.llm.LLMClient`:
(model, request) → reply.

The judge, the LLM reranker and question writing send the same requests again on every
evaluation; at 1-5 s per request on a small CPU that dominates. The key is the SHA-256 of the
model name (the configured ``RAG_LLM_MODEL``, else the name the server reports) and the
canonical JSON of the request (messages, max_tokens, temperature, top_logprobs, seed, stop),
so a different model, prompt or decoding setting is a different entry. Entries are small JSON
files written atomically (``os.replace``); a corrupt entry is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.models.llm import Completion, LLMClient, LLMError


@dataclass
class CachedClient:
    """``chat`` with the signature of :meth:`LLMClient.chat`, answered from ``cache_dir`` when
    the same model saw the same request before. ``cache_dir`` None disables caching."""

    client: LLMClient
    cache_dir: Path | None = None
    hits: int = 0
    misses: int = 0
    _model: str | None = field(default=None, repr=False)
    _served: str | None = field(default=None, repr=False)

    @property
    def model_name(self) -> str:
        """Configured model, else the one the server names in its first reply ("" until then)."""
        return self.client.model or self._model or ""

    def key(self, request: dict[str, Any]) -> str:
        blob = json.dumps(
            {"model": self._identity(), "request": request},
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _identity(self) -> str:
        """The model the key names: the configured one, else the one the server lists (asked
        once), so two servers with different models behind one URL never share entries."""
        if self.client.model:
            return self.client.model
        if self._served is None:
            try:
                self._served = self.client.model_id()
            except LLMError:
                self._served = ""  # a server without /v1/models: keyed by the request alone
        return self._served

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
        request = {
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_logprobs": top_logprobs,
            "seed": seed,
            "stop": stop or [],
        }
        path = self._path(self.key(request))
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                self.hits += 1
                self._model = self._model or data.get("model") or None
                return Completion(
                    text=data["text"], top_logprobs=data["top_logprobs"], model=data["model"]
                )
            except (OSError, ValueError, KeyError):
                pass  # unreadable entry: ask again and overwrite it
        self.misses += 1
        out = self.client.chat(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_logprobs=top_logprobs,
            seed=seed,
            stop=stop,
        )
        self._model = self._model or out.model or None
        if path is not None:
            _write_atomic(
                path,
                json.dumps(
                    {"text": out.text, "top_logprobs": out.top_logprobs, "model": out.model},
                    ensure_ascii=False,
                ),
            )
        return out

    def _path(self, key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        return Path(self.cache_dir) / key[:2] / f"{key}.json"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
