"""Optional answer generation through an OpenAI-compatible chat endpoint, and marker mapping.

Generation is off unless the caller passes a URL (the CLI reads ``RAG_LLM_URL`` and
``RAG_LLM_API_KEY``); requests go through
:class:`~rag_assets.lib.models.llm.LLMClient`, which redacts
credentials from every message, sends the key as a bearer token and warns once about plain
``http://`` to a non-loopback host. The model's text is never trusted for links: citation
URLs come only from the server's :class:`~rag_assets.lib.query.cite.Citation` objects. The model's
``[n]`` markers are mapped onto those citations; markers naming no source are removed and
reported, markdown link targets the model wrote are dropped (label kept) and every URL in its
text is reported in :attr:`Answer.urls` so a caller can warn about it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_assets.lib import observe
from rag_assets.lib.models import llm
from rag_assets.lib.models.llm import ENV_URL, LLMClient, LLMError
from rag_assets.lib.query.cite import PROMPT_INSTRUCTION, Context

__all__ = ["ENV_URL", "Answer", "GenerationError", "generate_answer", "map_markers"]

ANSWER_MAX_TOKENS = 1024
"""Generation budget of one answer (tokens); cited answers over a few sources are far shorter."""

MAX_RANGE = 20
"""Largest marker range ``[a-b]`` expanded; wider ones are treated as invalid."""


class GenerationError(LLMError):
    """The generator endpoint could not produce an answer (an :class:`LLMError`)."""


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
    messages = [
        {"role": "system", "content": PROMPT_INSTRUCTION},
        {"role": "user", "content": context.user_message},
    ]
    try:
        client = LLMClient(url, model=model, api_key=api_key, timeout=timeout)
        with observe.timed("generate"):  # issue 52: the service's stage histogram and span
            completion = client.chat(messages, max_tokens=ANSWER_MAX_TOKENS, temperature=0.0)
    except GenerationError:
        raise
    except LLMError as exc:  # already redacted by the client
        raise GenerationError(str(exc)) from exc
    return map_markers(completion.text, len(context.citations))


def chat_endpoint(url: str) -> str:
    """Normalise a base URL to its ``/v1/chat/completions`` endpoint."""
    try:
        return llm.chat_endpoint(url)
    except LLMError as exc:
        raise GenerationError(str(exc)) from None


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
