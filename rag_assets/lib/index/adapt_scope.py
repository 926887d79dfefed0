"""Where adapting the encoder applies (issue 51): only to a model whose weights this process has.

``RAG_ADAPT=auto`` trains nothing it cannot: an encoder behind a model server (``RAG_EMBED_URL``)
or a local model without a transformer's config and weights here is left as it is, the index's
declaration says why, and ``index`` goes on (exit 0). ``RAG_ADAPT=on`` with such an encoder is
refused before anything runs (:func:`refuse_on`).
"""

from __future__ import annotations

import json
from pathlib import Path

from rag_assets.settings import Settings


def why_not_trainable(settings: Settings) -> str:
    """Why this process cannot train the configured encoder ("" when it can)."""
    url = settings.embed_url.strip()
    if url:
        from rag_assets.lib.models.http import redact

        return (
            f"the encoder is a model server (RAG_EMBED_URL={redact(url)}): its weights are not "
            "here to train"
        )
    from rag_assets.lib.index.embed import default_model_path

    path = Path(settings.embedding_model).expanduser() if settings.embedding_model else None
    if path is None:
        try:
            path = default_model_path()
        except (ImportError, RuntimeError):  # said where the model is loaded
            return ""
    if not path.is_dir():
        return ""  # refused where the model is resolved, naming RAG_EMBEDDING_MODEL
    return _missing_parts(path)


def _missing_parts(path: Path) -> str:
    """What a sentence-transformers directory lacks to be trained here ("" = nothing)."""
    configs = [path / "config.json", *sorted(path.glob("*/config.json"))]
    typed = False
    for config in configs:
        try:
            typed = typed or bool(json.loads(config.read_text(encoding="utf-8")).get("model_type"))
        except (OSError, ValueError, AttributeError):
            continue
    if not typed:
        return f"the model at {path} has no transformer config.json (model_type) to train"
    weights = [*path.rglob("*.safetensors"), *path.rglob("pytorch_model*.bin")]
    if not weights:
        return f"the model at {path} has no weights here (*.safetensors, pytorch_model.bin)"
    return ""


def refusal(settings: Settings) -> str:
    """The one line that refuses ``RAG_ADAPT=on`` for an encoder this process cannot train
    ("" when it can, or adaptation is not ``on``)."""
    from rag_assets.settings import adapt_mode

    if adapt_mode(settings.adapt) != "on":
        return ""
    why = why_not_trainable(settings)
    if not why:
        return ""
    return f"RAG_ADAPT=on: {why}; set RAG_ADAPT=auto (adapts only what it can) or off"
