"""Adapt the encoder to the corpus it serves (issue 32): inverse-cloze pairs from the chunks,
an in-batch-negatives fine-tune of the configured model, and a held-out self-retrieval measure.

No question is used, only the corpus. The recipe (:data:`RECIPE_VERSION`, :class:`Recipe`):

- **Pairs** (:func:`build_pairs`). Every sentence (:func:`sentence_spans`) of a chunk's
  ``content`` that is 40-300 characters long and occurs once in the corpus is a query; its
  positive is the chunk's embedded ``text`` (header + content) with that sentence removed, except
  for 10 % of the pairs (:attr:`Recipe.keep_rate`) where it is kept (a seeded draw per pair,
  ``random.Random(f"{seed}|{chunk_id}|{sentence}")``, so adding a chunk changes no other pair).
  A pair whose positive keeps fewer than ``min_chars`` characters of content is dropped.
- **Held out** (:func:`is_held_out`). A sentence whose sha256 is 0 modulo
  :attr:`Recipe.held_out_mod` (10) is never a query and is removed from every positive, so the
  model never sees it; it is asked afterwards against the whole corpus, its own chunk with the
  sentence removed (:func:`self_retrieval`). The slice depends on the sentence's text only:
  the same sentences are held out on every run and for every model.
- **Training** (:func:`train_encoder`). A plain torch loop on the sentence-transformers modules:
  multiple-negatives ranking loss (cross-entropy over the cosine similarities × ``scale`` 20 of
  each query to every positive in the batch), batches of 16 pairs from 16 different chunks (no
  false negatives, :func:`batches`), AdamW at 3e-5 with 10 % linear warm-up and linear decay,
  gradients clipped at norm 1, 128 word-pieces in training and the model's own window (256 for
  MiniLM) when encoding, torch seeded with the recipe's seed.
- **Steps** (:meth:`Recipe.steps_for`). ``steps`` > 0 is exact; 0 = one epoch of the pairs
  (``ceil(pairs / batch)``), at least :data:`MIN_STEPS`; both at most ``max_steps``, the cap that
  keeps a large corpus bounded (its cost in quality: ``python -m rag_assets.bench.adapt cap``),
  and at most ``max_epochs`` epochs (:data:`MAX_EPOCHS`, issue 44), the bound that keeps a small
  corpus from being trained over and over: more training is worse (course corpus, held-out
  dense MRR .671 at 1.08 epochs, .639 at 5.4, .573 at 21.5).

Measured by the probe that led to issue 32 (course corpus, 1,387 pairs, 100 steps): course-dev
dense MRR .560 → .661 and answered at ≤ 5/50 bluffs 31 → 36 of 64, on questions never seen.

Determinism: the same pairs, recipe, seed, device and thread count give the same weights on a
CPU (the tests compare two trainings; :data:`WEIGHT_TOLERANCE`). This module knows nothing of
Dagster or of the index: :mod:`rag_assets.lib.index.adapted` stores what it produces.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rag_assets.lib.index.embed import Embedder, ModelSpec
    from rag_assets.lib.types import Chunk

RECIPE_VERSION = "ict-2"
"""Bump when what the recipe does changes (pairs, loss, schedule): another adaptation key."""

MIN_STEPS = 100
"""Fewest steps of an automatic (one-epoch) schedule: the probe's 100 on the course corpus
(87 steps per epoch there)."""

MAX_EPOCHS = 1.5
"""The most epochs of the pairs a training takes, whatever the step count says (issue 44). The
measurements: on the course corpus (93 steps an epoch) held-out dense MRR was .671 at 100 steps
(1.08 epochs, the best measured), .639 at 500 (5.4) and .573 at 2,000 (21.5, below the untrained
base on R@4): quality falls as epochs grow past one. 1.5 is the smallest bound that leaves the
measured recipe as it was (100 steps: 1.08 epochs of the course corpus, 1.46 of the pdf corpus)
and stays under the issue's ceiling of 2, where nothing was measured. Before it, the 100-step
minimum trained a corpus of 160 pairs (10 steps an epoch) for 10 epochs."""

DEFAULT_MAX_STEPS = 500
"""The cap on steps (``RAG_ADAPT_MAX_STEPS``): 1 epoch up to 8,000 pairs (about 5,000 chunks of
the course corpus's density); a larger corpus trains on a random 500 × 16 pairs of it."""

WEIGHT_TOLERANCE = 1e-6
"""Largest |Δweight| allowed between two CPU trainings of the same data, recipe and seed (with
the same thread count): the tests measure 0, float summation order is the only excuse."""

TRAINING_FILE = "adaptation.json"  # provenance inside the model folder (part of its revision)

_SENTENCE_END = re.compile(r"[.!?](?=\s)")
_STRUCTURED = re.compile(r"[ \t]*(?:[-*+][ \t]+|\d+[.)][ \t]+|>[ \t]?)")  # list items, quotes
_SKIPPED_LINE = re.compile(r"[ \t]*(?:#{1,6}[ \t]|\||<)")  # headings, table rows, markup
_FENCE = re.compile(r"[ \t]*(?:```|~~~)")


@dataclass(frozen=True)
class Recipe:
    """What the adaptation does; every field is part of the adaptation key."""

    min_chars: int = 40  # a query sentence is 40..300 characters
    max_chars: int = 300
    keep_rate: float = 0.10  # share of pairs whose positive keeps the query sentence
    held_out_mod: int = 10  # sha256(sentence) % 10 == 0: held out for the self-retrieval MRR
    scale: float = 20.0  # cosine similarities × scale are the logits
    batch_size: int = 16
    steps: int = 0  # 0 = one epoch, at least MIN_STEPS; > 0 = exactly this many
    max_steps: int = DEFAULT_MAX_STEPS  # the cap
    max_epochs: float = MAX_EPOCHS  # the bound in epochs, on both (issue 44)
    lr: float = 3e-5
    warmup: float = 0.10  # share of the steps with a linear warm-up
    train_max_length: int = 128  # word-pieces seen in training (encoding: the model's window)
    seed: int = 0

    def steps_for(self, pairs: int) -> int:
        """Optimiser steps for ``pairs`` training pairs (see the module doc): ``steps`` or one
        epoch (at least :data:`MIN_STEPS`), at most ``max_steps`` and ``max_epochs`` epochs."""
        if not pairs:
            return min(self.steps, self.max_steps) if self.steps > 0 else 0
        epoch = math.ceil(pairs / self.batch_size)
        wanted = self.steps if self.steps > 0 else max(MIN_STEPS, epoch)
        return min(wanted, self.max_steps, self.epoch_bound(pairs))

    def epoch_bound(self, pairs: int) -> int:
        """The most steps ``max_epochs`` epochs of ``pairs`` pairs take (at least 1)."""
        return max(1, math.floor(self.max_epochs * math.ceil(pairs / self.batch_size)))

    def params(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def stamp(self) -> str:
        """``ict-2:<digest of the parameters>``: what the model's stamps name as its recipe."""
        blob = json.dumps(self.params(), sort_keys=True).encode()
        return f"{RECIPE_VERSION}:{hashlib.sha256(blob).hexdigest()[:12]}"


@dataclass(frozen=True)
class Pair:
    query: str  # a sentence of the chunk
    positive: str  # the chunk's embedded text, the sentence removed (or kept)
    chunk_id: str
    kept: bool  # the sentence was left in the positive (keep_rate of the pairs)


@dataclass(frozen=True)
class HeldOut:
    query: str  # a held-out sentence
    chunk_id: str  # the chunk it comes from
    target: str  # that chunk's embedded text without the sentence


@dataclass
class PairSet:
    pairs: list[Pair]
    held_out: list[HeldOut]
    sentences: int  # candidate sentences (length in range, unique in the corpus)
    chunks: int
    dropped: int = 0  # pairs dropped because too little content was left

    @property
    def digest(self) -> str:
        """sha256 (24 hex) over every pair, in order: the training data's identity."""
        h = hashlib.sha256()
        for p in self.pairs:
            h.update(f"{p.chunk_id}\0{p.query}\0{p.positive}\0".encode())
        return h.hexdigest()[:24]

    def counts(self) -> dict[str, int]:
        return {
            "pairs": len(self.pairs),
            "kept_sentences": sum(p.kept for p in self.pairs),
            "held_out": len(self.held_out),
            "sentences": self.sentences,
            "chunks": self.chunks,
            "dropped": self.dropped,
        }


def build_pairs(chunks: Sequence[Chunk], recipe: Recipe = Recipe()) -> PairSet:
    """Inverse-cloze training pairs and the held-out slice of a corpus's chunks.

    Chunks are taken in (document, offset, id) order; within a chunk, sentences in text order.
    A sentence is compared, hashed and asked on one line (its whitespace runs, hard wraps
    included, become one space); its length is counted on that line.
    """
    ordered = sorted(chunks, key=lambda c: (c.document_id, c.start, c.chunk_id))
    found: dict[str, list[tuple[int, int, str]]] = {}
    for c in ordered:
        spans = [(a, b, _one_line(c.content[a:b])) for a, b in sentence_spans(c.content)]
        found[c.chunk_id] = [s for s in spans if recipe.min_chars <= len(s[2]) <= recipe.max_chars]
    seen = Counter(s for spans in found.values() for _, _, s in spans)
    pairs: list[Pair] = []
    held: list[HeldOut] = []
    dropped = 0
    for c in ordered:
        unique = [s for s in found[c.chunk_id] if seen[s[2]] == 1]
        out = [(a, b) for a, b, s in unique if is_held_out(s, recipe.held_out_mod)]
        header = _header(c)
        for a, b, sentence in unique:
            if (a, b) in out:
                held.append(HeldOut(sentence, c.chunk_id, header + _without(c.content, [(a, b)])))
                continue
            keep = keeps_sentence(recipe.seed, c.chunk_id, sentence, recipe.keep_rate)
            content = _without(c.content, out if keep else [*out, (a, b)])
            if len(content) < recipe.min_chars:
                dropped += 1
                continue
            pairs.append(Pair(sentence, header + content, c.chunk_id, keep))
    return PairSet(pairs, held, sum(n == 1 for n in seen.values()), len(ordered), dropped)


def is_held_out(sentence: str, mod: int = 10) -> bool:
    """Whether a sentence belongs to the held-out slice: sha256 of its UTF-8 text mod ``mod``
    is 0 (a tenth of the sentences, the same ones on every run)."""
    return int(hashlib.sha256(sentence.encode("utf-8")).hexdigest(), 16) % mod == 0


def keeps_sentence(seed: int, chunk_id: str, sentence: str, rate: float = 0.10) -> bool:
    """The seeded draw that leaves the query sentence in its positive (``rate`` of the pairs)."""
    return random.Random(f"{seed}|{chunk_id}|{sentence}").random() < rate


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Sentence spans of a chunk's content: prose lines of a paragraph run together (hard
    wraps are not ends), a list item or quote line is a block of its own, headings, table rows,
    markup lines and fenced code are skipped; a sentence ends after ``. ! ?`` followed by
    whitespace or at its block's end. Spans are trimmed of whitespace."""
    blocks: list[tuple[int, int]] = []
    open_block: list[int] = []  # [start, end] of the prose block being read
    fenced = False
    pos = 0

    def close() -> None:
        if open_block:
            blocks.append((open_block[0], open_block[1]))
            open_block.clear()

    for line in text.splitlines(keepends=True):
        start, end = pos, pos + len(line.rstrip("\r\n"))
        pos += len(line)
        if _FENCE.match(line):
            close()
            fenced = not fenced
            continue
        if fenced or not line.strip() or _SKIPPED_LINE.match(line):
            close()
            continue
        item = _STRUCTURED.match(line)
        if item:
            close()
            blocks.append((start + item.end(), end))
            continue
        if open_block:
            open_block[1] = end
        else:
            open_block.extend([start, end])
    close()
    out: list[tuple[int, int]] = []
    for a, b in blocks:
        cuts = [a, *(m.end() for m in _SENTENCE_END.finditer(text, a, b)), b]
        for x, y in zip(cuts, cuts[1:], strict=False):
            while x < y and text[x].isspace():
                x += 1
            while y > x and text[y - 1].isspace():
                y -= 1
            if x < y:
                out.append((x, y))
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _header(chunk: Chunk) -> str:
    """What ``text`` puts before ``content`` (the ``[Title > Section]`` line), or ""."""
    if chunk.text.endswith(chunk.content):
        return chunk.text[: len(chunk.text) - len(chunk.content)]
    return ""


def _without(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``text`` with ``spans`` cut out, the whitespace left behind collapsed."""
    pieces, pos = [], 0
    for a, b in sorted(spans):
        pieces.append(text[pos:a])
        pos = b
    pieces.append(text[pos:])
    out = "".join(pieces)
    out = re.sub(r"[ \t]{2,}", " ", out)
    out = re.sub(r"[ \t]+\n", "\n", out)
    out = re.sub(r"\n[ \t]+(?=\S)", "\n", out)
    return re.sub(r"\n{3,}", "\n\n", out).strip()


def batches(chunk_of: Sequence[str], size: int, steps: int, seed: int) -> Iterator[list[int]]:
    """``steps`` batches of pair indices, no two from the same chunk in a batch.

    Each epoch is a seeded shuffle (``random.Random(f"{seed}|epoch|{n}")``); a pair whose chunk
    is already in the batch waits for the next one; what is left at an epoch's end opens the
    next. A corpus with fewer distinct chunks than ``size`` gets batches of that many.
    """
    n = len(chunk_of)
    if n == 0 or steps <= 0:
        return
    size = min(size, len(set(chunk_of)))
    made, epoch = 0, 0
    pool: deque[int] = deque()
    while made < steps:
        order = list(range(n))
        random.Random(f"{seed}|epoch|{epoch}").shuffle(order)
        epoch += 1
        pool.extend(order)
        while made < steps and len(pool) >= size:
            batch: list[int] = []
            seen: set[str] = set()
            waiting: list[int] = []
            while pool and len(batch) < size:
                i = pool.popleft()
                if chunk_of[i] in seen:
                    waiting.append(i)
                else:
                    batch.append(i)
                    seen.add(chunk_of[i])
            if len(batch) < size:  # not enough distinct chunks left: wait for the next epoch
                pool.extendleft(reversed(batch + waiting))
                break
            pool.extendleft(reversed(waiting))
            made += 1
            yield batch


@dataclass
class Training:
    """What one training did (kept beside the model folder, shown as asset metadata)."""

    steps: int
    loss_curve: list[float]
    seconds: float
    device: str
    threads: int
    pairs: int
    started: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def final_loss(self) -> float:
        return self.loss_curve[-1] if self.loss_curve else float("nan")

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.loss_curve)) if self.loss_curve else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_encoder(
    base: ModelSpec,
    pair_set: PairSet,
    recipe: Recipe,
    out_dir: Path,
    *,
    model_id: str,
    provenance: dict[str, Any],
    device: str = "cpu",
    threads: int = 2,
    progress: Callable[[int, int, float], None] | None = None,
) -> Training:
    """Fine-tune ``base`` on the pairs and save a sentence-transformers folder at ``out_dir``
    (named ``model_id`` in its config, ``provenance`` in ``adaptation.json``).

    ``device``: a torch device (``resolve_device`` of ``RAG_DEVICE``); ``threads``: torch's
    intra-op threads during training (restored afterwards). ``progress(step, steps, loss)`` is
    called after every step."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import torch.nn.functional as F
    from sentence_transformers import SentenceTransformer
    from transformers import get_linear_schedule_with_warmup
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # as the Embedder does: no bar frames in a log file
    steps = recipe.steps_for(len(pair_set.pairs))
    if steps == 0:
        raise ValueError(
            "no training pairs: the corpus has no sentence of "
            f"{recipe.min_chars}-{recipe.max_chars} characters to adapt the encoder on"
        )
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        random.seed(recipe.seed)
        np.random.seed(recipe.seed)
        torch.manual_seed(recipe.seed)
        model = SentenceTransformer(str(base.path), device=device, local_files_only=True)
        window = int(model.max_seq_length or 512)
        model.max_seq_length = recipe.train_max_length
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
        warmup = math.ceil(recipe.warmup * steps)
        schedule = get_linear_schedule_with_warmup(optimizer, warmup, steps)
        pairs = pair_set.pairs
        chunk_of = [p.chunk_id for p in pairs]
        labels_cache: dict[int, Any] = {}
        curve: list[float] = []
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.perf_counter()
        for step, batch in enumerate(batches(chunk_of, recipe.batch_size, steps, recipe.seed)):
            queries = [base.query_prompt + pairs[i].query for i in batch]
            positives = [base.document_prompt + pairs[i].positive for i in batch]
            q = _embed(model, queries, device)
            p = _embed(model, positives, device)
            logits = F.normalize(q, dim=-1) @ F.normalize(p, dim=-1).T * recipe.scale
            n = len(batch)
            labels = labels_cache.setdefault(n, torch.arange(n, device=device))
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            curve.append(round(float(loss.item()), 6))
            if progress is not None:
                progress(step + 1, steps, curve[-1])
        seconds = time.perf_counter() - t0
        model.eval()
        model.max_seq_length = window
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save(str(out_dir), create_model_card=False)
        _name_model(out_dir, model_id, window)
        (out_dir / TRAINING_FILE).write_text(json.dumps(provenance, indent=1, sort_keys=True))
    finally:
        torch.set_num_threads(previous_threads)
    return Training(steps, curve, round(seconds, 2), str(device), threads, len(pairs), started)


def _embed(model: Any, texts: list[str], device: str) -> Any:
    features = model.preprocess(texts)
    features = {k: v.to(device) if hasattr(v, "to") else v for k, v in features.items()}
    return model(features)["sentence_embedding"]


def _name_model(folder: Path, model_id: str, window: int) -> None:
    """Record ``model_id`` in the folder's ``config_sentence_transformers.json`` (where
    :func:`rag_assets.lib.index.embed.resolve_model` reads a local model's id) and the encoding
    window in ``sentence_bert_config.json`` (sentence-transformers 6 saves it only in the
    tokenizer's config; the ONNX query encoder and older readers look for it there)."""
    for name, key, value in (
        ("config_sentence_transformers.json", "model_id", model_id),
        ("sentence_bert_config.json", "max_seq_length", window),
    ):
        f = folder / name
        cfg = json.loads(f.read_text()) if f.exists() else {}
        cfg[key] = value
        f.write_text(json.dumps(cfg, indent=2, sort_keys=True))


@dataclass
class SelfRetrieval:
    """Held-out sentences asked against the corpus (their own chunk without them)."""

    mrr: float
    hit_at_1: float
    queries: int
    ranks: list[int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "mrr": round(self.mrr, 4),
            "hit@1": round(self.hit_at_1, 4),
            "queries": self.queries,
            "ranks": self.ranks,
        }


@dataclass
class Separation:
    """How far the shipped unrelated questions stay from the corpus, measured where the refusal
    gate works (issue 44): ``cut`` is the cosine distance under which at most
    :data:`SEPARATION_BLUFF_RATE` of the unrelated questions find a chunk (what the model-free
    cut allows them), ``answered`` the share of the held-out sentences whose own chunk lies
    under it. Training never sees either side: a model that pulls unrelated questions towards
    the corpus faster than the corpus's own unseen sentences answers fewer of them."""

    cut: float
    answered: float
    held_out: int
    unrelated: int
    unrelated_nearest_median: float
    held_out_own_median: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


SEPARATION_BLUFF_RATE = 0.10
"""Share of the unrelated questions the separation's cut lets through: the default
``RAG_MAX_BLUFF_RATE``, the bound the model-free cut puts on them."""


def self_retrieval(
    embedder: Embedder, chunks: Sequence[Chunk], held_out: Sequence[HeldOut]
) -> SelfRetrieval:
    """MRR of the held-out sentences: each one is a query (query prompt) against every chunk's
    embedded text (document prompt), its own chunk replaced by that chunk without the sentence.
    Rank = 1 + the chunks scoring strictly higher than the own one (ties count for it)."""
    return held_out_measures(embedder, chunks, held_out)[0]


def held_out_measures(
    embedder: Embedder,
    chunks: Sequence[Chunk],
    held_out: Sequence[HeldOut],
    unrelated: Sequence[str] = (),
) -> tuple[SelfRetrieval, Separation | None]:
    """:func:`self_retrieval` and, with ``unrelated`` questions, the :class:`Separation` of the
    corpus from them (the corpus embedded once for both)."""
    if not held_out:
        return SelfRetrieval(0.0, 0.0, 0, []), None
    corpus = embedder.encode([c.text for c in chunks])
    row = {c.chunk_id: i for i, c in enumerate(chunks)}
    queries = embedder.encode_queries([h.query for h in held_out])
    targets = embedder.encode([h.target for h in held_out])
    scores = queries @ corpus.T
    ranks, own = [], []
    for j, h in enumerate(held_out):
        own.append(float(queries[j] @ targets[j]))
        s = scores[j].copy()
        if h.chunk_id in row:
            s[row[h.chunk_id]] = -np.inf
        ranks.append(1 + int(np.sum(s > own[-1])))
    rr = [1.0 / r for r in ranks]
    measured = SelfRetrieval(
        float(np.mean(rr)), sum(r == 1 for r in ranks) / len(ranks), len(ranks), ranks
    )
    if not unrelated or not len(corpus):
        return measured, None
    nearest = 1.0 - np.max(embedder.encode_queries(list(unrelated)) @ corpus.T, axis=1)
    distances = 1.0 - np.asarray(own)
    cut = float(np.sort(nearest)[int(SEPARATION_BLUFF_RATE * len(nearest))])  # ≤ 10 % below it
    return measured, Separation(
        cut=cut,
        answered=float(np.mean(distances < cut)),
        held_out=len(distances),
        unrelated=len(nearest),
        unrelated_nearest_median=float(np.median(nearest)),
        held_out_own_median=float(np.median(distances)),
    )


def max_weight_difference(a: Path, b: Path) -> float:
    """Largest |Δ| over every tensor of two saved models' ``model.safetensors``."""
    from safetensors.numpy import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    if sorted(wa) != sorted(wb):
        raise ValueError("the two models have different tensors")
    return max(
        float(np.max(np.abs(wa[k].astype(np.float64) - wb[k].astype(np.float64)))) for k in wa
    )
