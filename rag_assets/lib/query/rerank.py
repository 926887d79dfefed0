"""Cross-encoder reranking (sentence-transformers ``CrossEncoder``), loaded offline.

The model is named by ``RAG_RERANK_MODEL`` (read by the caller and passed in): a local
CrossEncoder directory (a Hugging Face sequence-classification model with one label plus its
tokenizer) or a hub name. A hub name is loaded from the local Hugging Face cache only, so an
uncached name fails at once with a clear error instead of retrying the network for ~45 s; set
``HF_HUB_OFFLINE=0`` on a connected machine to let sentence-transformers download it.

Scores are the model's raw logits (monotone in its default sigmoid, and free of the ties that
a saturated sigmoid produces in float32).

Defaults measured on the 2-core target, 25 passages of ≈500 chars (≈151 word-pieces with the
query), MiniLM-L6-sized cross-encoder, torch CPU: batch 1 is fastest at either thread count
(1 thread: 1.03 s vs 1.25 s at batch 8 and 1.46 s at batch 25). Two threads help only on an
idle machine (0.68 s at batch 1); while other processes keep the cores busy they collapse
(2.2-23 s: every small parallel region waits for a descheduled thread), whereas one thread
stays at ≈1.0 s. Hence batch 1 and one intra-op thread by default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

T = TypeVar("T")

DEFAULT_BATCH_SIZE = 1  # measured: see module docstring
DEFAULT_THREADS: int | None = 1  # measured; None leaves torch's process-wide count alone
SETTING = "RAG_RERANK_MODEL"
NOT_CONFIGURED = "rerank: no model configured"


class RerankerLoadError(RuntimeError):
    """The configured cross-encoder cannot be loaded (message names ``RAG_RERANK_MODEL``)."""


LLM = "llm"
"""``RAG_RERANK_MODEL=llm``: rerank with the chat model at ``RAG_LLM_URL`` (LLMReranker)."""


def load_reranker(
    setting: str | None,
    *,
    llm_url: str | None = None,
    llm_model: str | None = None,
    api_key: str | None = None,
    depth: int | None = None,
    cache_dir: Path | None = None,
    rerank_url: str | None = None,
    rerank_api_key: str | None = None,
    rerank_timeout: float | None = None,
    **kwargs: Any,
) -> Reranker | None:
    """Load the reranker named by ``setting``; None when not configured (empty/None).

    ``rerank_url`` (``RAG_RERANK_URL``, issue 35) selects a ``/rerank`` server
    (:class:`~rag_assets.lib.query.rerank_http.HttpReranker`) whatever ``setting`` says:
    ``setting`` is then the model name sent to it ("" = the server's own).

    ``"llm"`` selects :class:`LLMReranker` over the endpoint ``llm_url`` (``RAG_LLM_URL``),
    scoring the hybrid top ``depth`` (``RAG_RERANK_DEPTH``); anything else is a cross-encoder.
    The caller reports ``NOT_CONFIGURED`` when this returns None. Raises
    :class:`RerankerLoadError` when a model is configured but cannot be loaded.
    """
    if rerank_url and rerank_url.strip():
        from rag_assets.lib.query.rerank_http import DEFAULT_TIMEOUT_S, HttpReranker

        remote = HttpReranker(
            rerank_url,
            model=(setting or "").strip(),
            api_key=rerank_api_key or "",
            depth=RERANK_DEPTH if depth is None else depth,
            timeout=DEFAULT_TIMEOUT_S if rerank_timeout is None else rerank_timeout,
        )
        return cast(Reranker, remote)  # the same interface (not a subclass: no import cycle)
    if setting is None or not setting.strip():
        return None
    if setting.strip().lower() == LLM:
        if not llm_url or not llm_url.strip():
            raise RerankerLoadError(
                f"rerank: {SETTING}=llm needs a model endpoint: set RAG_LLM_URL"
            )
        from rag_assets.lib.query.judge import make_client

        return LLMReranker(
            make_client(llm_url, llm_model, api_key, cache_dir),
            depth=DEFAULT_LLM_DEPTH if depth is None else depth,
        )
    return Reranker(setting.strip(), **kwargs)


RERANK_DEPTH = 25
"""Hybrid top-k a ``/rerank`` server scores unless ``RAG_RERANK_DEPTH`` says otherwise."""

DEFAULT_LLM_DEPTH = 10
"""Hybrid top-k the LLM reranker scores unless ``RAG_RERANK_DEPTH`` says otherwise: one model
request per passage (≈1-5 s each on 2 busy cores), so k=10 costs ≈10-50 s per uncached query."""


class Reranker:
    """Scores (query, passage) pairs with a CrossEncoder; higher is more relevant."""

    def __init__(
        self,
        model: str,
        batch_size: int = DEFAULT_BATCH_SIZE,
        threads: int | None = DEFAULT_THREADS,
        max_length: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"rerank: batch_size must be >= 1, got {batch_size}")
        if threads is not None and threads < 1:
            raise ValueError(f"rerank: threads must be >= 1, got {threads}")
        self.model_name = model
        self.batch_size = batch_size
        self.threads = threads
        path = Path(model).expanduser()
        local = path.is_dir()
        offline = local or os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() not in {
            "0",
            "false",
            "no",
            "off",
        }
        from sentence_transformers import CrossEncoder  # heavy import: only when configured

        try:
            self._model = CrossEncoder(
                str(path) if local else model,
                device="cpu",
                local_files_only=offline,
                max_length=max_length,
            )
        except Exception as exc:  # the library raises OSError/ValueError/... variously
            if local:
                why = f"the directory {path} is not a loadable CrossEncoder model ({exc})"
            elif offline:
                why = (
                    "it is not an existing directory and not in the local Hugging Face cache "
                    "(downloads are off; set HF_HUB_OFFLINE=0 on a connected machine, or point "
                    "it at a local CrossEncoder directory)"
                )
            else:
                why = f"sentence-transformers could not load or download it ({exc})"
            raise RerankerLoadError(f"rerank: cannot load {SETTING}={model!r}: {why}") from exc
        if self._model.num_labels != 1:
            raise RerankerLoadError(
                f"rerank: {SETTING}={model!r} has {self._model.num_labels} labels; a reranking "
                "cross-encoder has exactly one relevance output"
            )

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance logit per passage, in the order given."""
        if not passages:
            return []
        import torch

        pairs = [(query, p) for p in passages]
        with _torch_threads(self.threads):
            scores = self._model.predict(
                pairs,
                batch_size=self.batch_size,
                activation_fn=torch.nn.Identity(),
                show_progress_bar=False,
                convert_to_numpy=True,
            )
        return [float(s) for s in scores]

    def rerank(
        self,
        query: str,
        items: Sequence[T],
        text_of: Callable[[T], str],
        top: int | None = None,
    ) -> list[tuple[T, float]]:
        """``items`` sorted by score descending (stable: ties keep their original order)."""
        scores = self.score(query, [text_of(item) for item in items])
        order = sorted(range(len(items)), key=lambda i: (-scores[i], i))
        ranked = [(items[i], scores[i]) for i in order]
        return ranked if top is None else ranked[: max(0, top)]


class LLMReranker(Reranker):
    """Scores (query, passage) by the chat model's P(yes) that the passage answers the query
    (the per-source judge's prompt and score,
    :func:`rag_assets.lib.query.judge.passage_yes_probability`,
    sharing its cached requests). Ties keep retrieval order (:meth:`Reranker.rerank`). A
    :class:`Reranker` so that every place taking the cross-encoder takes it too."""

    def __init__(self, llm: Any, depth: int = DEFAULT_LLM_DEPTH) -> None:  # no CrossEncoder
        if depth < 1:
            raise ValueError(f"rerank: RAG_RERANK_DEPTH must be >= 1, got {depth}")
        self.llm = llm
        self.depth = depth
        self.batch_size = 1
        self.threads = None
        self.model_name = f"llm:{llm.model_name or 'server default'}"

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        from rag_assets.lib.query.judge import passage_yes_probability

        out = [passage_yes_probability(self.llm, query, p) for p in passages]
        self.model_name = f"llm:{self.llm.model_name or 'server default'}"  # named by the server
        return out


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` intra-op torch threads, restoring the previous count after.

    ``torch.set_num_threads`` is process-wide: do not score from several Python threads at once.
    """
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
