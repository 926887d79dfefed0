"""Optional answer generation through an OpenAI-compatible chat endpoint, and marker mapping.

Generation is off unless the caller passes a URL (the CLI reads ``RAG_LLM_URL``); only the
standard library is used (``urllib``). The model's text is never trusted for links: citation
URLs come only from the server's :class:`~rag_assets.lib.cite.Citation` objects. The model's
``[n]`` markers are mapped onto those citations; markers naming no source are removed and
reported, markdown link targets the model wrote are dropped (label kept) and every URL in its
text is reported in :attr:`Answer.urls` so a caller can warn about it.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_assets.lib.cite import PROMPT_INSTRUCTION, Context

ENV_URL = "RAG_LLM_URL"
"""Environment variable naming the endpoint (read by the caller; named in every error)."""

MAX_RANGE = 20
"""Largest marker range ``[a-b]`` expanded; wider ones are treated as invalid."""


class GenerationError(RuntimeError):
    """The generator endpoint could not produce an answer."""


@dataclass
class Answer:
    """A generated answer mapped onto the context's citations.

    ``text`` keeps the citation numbers (``[n]`` is ``Context.citations[n-1]``); markers are
    normalised (``[1][2]`` stays, ``[1,2]`` becomes ``[1, 2]``, ranges are expanded, duplicates
    inside one marker dropped) and invalid numbers removed.
    """

    text: str
    raw: str
    used: list[int] = field(default_factory=list)  # valid indices, in order of first use
    invalid_markers: list[str] = field(default_factory=list)  # e.g. "[9]", "[0]", per occurrence
    uncited: bool = True  # no valid marker at all
    urls: list[str] = field(default_factory=list)  # URLs the model wrote (never used as links)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def generate_answer(
    context: Context,
    url: str,
    model: str | None = None,
    timeout: float = 60,
    api_key: str | None = None,
) -> Answer:
    """POST the context to ``{url}/v1/chat/completions`` (temperature 0) and map its markers.

    ``url`` may be given with or without a trailing ``/v1`` (or as the full
    ``…/chat/completions`` endpoint). ``model`` is omitted from the request when None (servers
    such as llama.cpp then use their loaded model). Any transport or protocol failure raises
    :class:`GenerationError`. A refused context (``no_answer``) must not be sent.
    """
    if context.no_answer or not context.citations:
        raise ValueError("context has no sources (no_answer); do not call a generator")
    endpoint = chat_endpoint(url)
    body: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": PROMPT_INSTRUCTION},
            {"role": "user", "content": context.user_message},
        ],
        "temperature": 0,
        "stream": False,
    }
    if model is not None:
        body["model"] = model
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        endpoint, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST"
    )
    where = f"{ENV_URL}={url} ({endpoint})"
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        try:
            detail = exc.read()[:300].decode("utf-8", "replace")
        except OSError:
            detail = str(exc.reason)
        raise GenerationError(f"{where} answered HTTP {exc.code}: {detail}") from exc
    except TimeoutError as exc:
        raise GenerationError(f"{where} did not answer within {timeout:g} s") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise GenerationError(f"{where} did not answer within {timeout:g} s") from exc
        raise GenerationError(f"cannot reach {where}: {reason}") from exc
    raw = _content_of(payload, where)
    return map_markers(raw, len(context.citations))


def chat_endpoint(url: str) -> str:
    """Normalise a base URL to its ``/v1/chat/completions`` endpoint."""
    base = url.strip().rstrip("/")
    if not base:
        raise GenerationError(f"{ENV_URL} is empty")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return base + "/chat/completions"
    return base + "/v1/chat/completions"


def _content_of(payload: bytes, where: str) -> str:
    """Extract ``choices[0].message.content`` or raise :class:`GenerationError`."""
    try:
        data = json.loads(payload.decode("utf-8"))
        content = data["choices"][0]["message"]["content"]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GenerationError(f"{where} returned malformed JSON: {payload[:200]!r}") from exc
    except (KeyError, IndexError, TypeError) as exc:
        raise GenerationError(
            f"{where} returned no choices[0].message.content: {payload[:200]!r}"
        ) from exc
    if not isinstance(content, str):
        raise GenerationError(f"{where} returned non-text content: {content!r:.200}")
    return content


_MD_LINK = re.compile(r"\[([^\[\]\n]*)\]\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_BARE_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s<>\"'\])]+|\bwww\.[^\s<>\"'\])]+", re.I)
_ITEM = r"\d+(?:\s*[-–]\s*\d+)?"
_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`", re.S)
# a marker is not glued to a preceding word character, so a[0] or x[2] in prose is left alone
_MARKER = re.compile(rf"([ \t]*)(?<!\w)\[\s*({_ITEM}(?:\s*[,;]\s*{_ITEM})*)\s*\]")


def map_markers(raw_text: str, n_sources: int) -> Answer:
    """Map ``[n]``, ``[n, m]``, ``[n][m]`` and ``[a-b]`` markers onto sources ``1..n_sources``.

    Pure function. Valid numbers are kept (``used`` lists them in order of first use); invalid
    ones (``[0]``, ``[7]`` with 4 sources) are removed from the text, together with the blanks
    before a marker left empty, and recorded in ``invalid_markers``. Markdown links lose their
    target (the label stays); all URLs the model wrote are listed in ``urls``.
    """
    urls: list[str] = []
    used: list[int] = []
    invalid: list[str] = []

    def drop_link(m: re.Match[str]) -> str:
        urls.append(m.group(2))
        label = m.group(1)
        return f"[{label}]" if _MARKER.fullmatch(f"[{label}]") else label

    def replace(m: re.Match[str]) -> str:
        keep: list[int] = []
        for item in re.split(r"\s*[,;]\s*", m.group(2).strip()):
            valid, bad = _expand(item, n_sources)
            invalid.extend(bad)
            for n in valid:
                if n not in keep:
                    keep.append(n)
        for n in keep:
            if n not in used:
                used.append(n)
        if not keep:
            return ""
        return m.group(1) + "[" + ", ".join(str(n) for n in keep) + "]"

    pieces: list[str] = []
    pos = 0
    for code in [*_CODE.finditer(raw_text), None]:
        prose = raw_text[pos : code.start() if code else len(raw_text)]
        prose = _MARKER.sub(replace, _MD_LINK.sub(drop_link, prose))
        urls.extend(u.group(0).rstrip(".,;:!?") for u in _BARE_URL.finditer(prose))
        pieces.append(prose)
        if code:
            urls.extend(u.group(0).rstrip(".,;:!?") for u in _BARE_URL.finditer(code.group(0)))
            pieces.append(code.group(0))
            pos = code.end()
    return Answer(
        text="".join(pieces),
        raw=raw_text,
        used=used,
        invalid_markers=invalid,
        uncited=not used,
        urls=urls,
    )


def _expand(item: str, n_sources: int) -> tuple[list[int], list[str]]:
    """Split one marker item into (valid numbers, invalid marker texts).

    ``"3"`` → one number; ``"1-3"`` → 1, 2, 3; a reversed or over-wide range is invalid whole.
    """
    parts = re.split(r"\s*[-–]\s*", item)
    if len(parts) == 1:
        numbers = [int(parts[0])]
    else:
        lo, hi = int(parts[0]), int(parts[1])
        if lo > hi or hi - lo > MAX_RANGE:
            return [], [f"[{lo}-{hi}]"]
        numbers = list(range(lo, hi + 1))
    valid = [n for n in numbers if 1 <= n <= n_sources]
    return valid, [f"[{n}]" for n in numbers if not 1 <= n <= n_sources]
