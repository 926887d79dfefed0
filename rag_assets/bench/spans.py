"""``python -m rag_assets.bench.spans``: how often the pinpoint span holds the needle (issue 21).

For every answerable question of a needle set (``shared/eval/<set>/questions.jsonl``) and each
phrasing, the top :data:`TOP` hybrid hits of a built index are cited with each span scoring of
:data:`~rag_assets.lib.query.cite.SPAN_SCORINGS`; a question counts when one of those hits'
chunks holds the needle (whitespace collapsed, the pdf-dev match rule), and it is a success
when that citation's span holds the needle too. Also reported: the mean span and chunk lengths
(a span as long as its chunk would succeed trivially) and the p50 / p90 time the span choice
adds to one ``ask`` (candidates + scoring + locators, the gate's at most four sources).

With ``--llm URL`` (an OpenAI-compatible server, e.g. llama.cpp's) each question's four sources
also go to the model as ``ask`` sends them, and the row ``answer`` counts the spans re-chosen by
the answer's own claims (:func:`~rag_assets.lib.query.cite.ground_spans`); ``answer_cites``
counts how often the answer cited the needle's chunk at all (an uncited chunk keeps the
question's span). Replies are cached under ``--cache`` keyed by the served model.

    python -m rag_assets.bench.spans --set /work/shared/eval/course-dev \\
        --documents /work/shared/corpus/course --index /tmp/spans21/course-index

The index is built (``index_folder``, chunk strategy E) when ``--index`` holds none yet.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

from rag_assets.lib.types import normalize_ws

TOP = 4
_MARKERS = re.compile(r"\[[\d,\s]+\]")
SCORINGS = ("lexical", "dense", "mix")  # == cite.SPAN_SCORINGS (imported lazily there)
"""Hits per question that may hold the needle (the gate cites at most four)."""


def run(
    set_dir: Path,
    documents: Path,
    index_uri: Path,
    window: int = 1,
    scorings: tuple[str, ...] | None = None,
    llm_url: str | None = None,
    cache_dir: Path | None = None,
    instruction: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    from rag_assets.lib.index.embed import Embedder, resolve_model
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.models.llm import LLMClient
    from rag_assets.lib.models.llm_cache import CachedClient
    from rag_assets.lib.query.cite import (
        PROMPT_INSTRUCTION,
        SPAN_SCORINGS,
        cite_hits,
        ground_spans,
        render_user_message,
        span_scorer,
    )
    from rag_assets.lib.query.generate import ANSWER_MAX_TOKENS, map_markers
    from rag_assets.lib.query.retrieve import Index
    from rag_assets.lib.types import locators_from_json

    embedder = Embedder(resolve_model(model), batch_size=16)  # None: the packaged MiniLM
    if IndexStore(index_uri).published() is None:
        from rag_assets.lib.index.pipeline import index_folder
        from rag_assets.lib.ingest.chunk import strategy

        index_folder(documents, index_uri, strategy("E"), embedder)
    index = Index.open(index_uri, embedder=embedder)
    docs = index.documents
    scorers = {name: span_scorer(name, embedder) for name in scorings or SPAN_SCORINGS}
    llm = CachedClient(LLMClient(llm_url), cache_dir) if llm_url else None
    cites = {"retrieved": 0, "answer_cites": 0}
    rows = [json.loads(line) for line in (set_dir / "questions.jsonl").read_text().splitlines()]
    tally: dict[str, dict[str, dict[str, float]]] = {}
    lengths: dict[str, list[int]] = {
        name: [] for name in [*scorers, "answer", "answer, worded replies"]
    }
    chunk_lengths: list[int] = []
    ms: dict[str, list[float]] = {name: [] for name in [*scorers, "answer"]}

    def count(name: str, phrasing: str, span: Any) -> None:
        cell = tally.setdefault(name, {}).setdefault(
            phrasing, {"retrieved": 0, "span_holds_needle": 0}
        )
        cell["retrieved"] += 1
        cell["span_holds_needle"] += int(needle in normalize_ws(span.text))
        lengths[name].append(span.end - span.start)

    def cite(question: str, hits: list[Any], name: str) -> list[Any]:
        return cite_hits(
            question,
            hits,
            canonical_text=lambda d: docs[d]["text"],
            document_path=lambda d: docs[d]["path"],
            document_locators=lambda d: (
                docs[d]["kind"],
                locators_from_json(docs[d].get("locators_json")),
            ),
            span_scorer=scorers[name],
            span_window=window,
        )

    for row in rows:
        if not row.get("needle"):
            continue
        needle = normalize_ws(row["needle"])
        for phrasing, question in sorted(row["queries"].items()):
            hits = index.search(question, retriever="hybrid", k=TOP)
            at = next((i for i, h in enumerate(hits) if needle in normalize_ws(h.content)), None)
            for name in scorers:
                t = time.perf_counter()
                cits = cite(question, hits, name)
                ms[name].append((time.perf_counter() - t) * 1000)
                if at is not None:
                    count(name, phrasing, cits[at].span)
            if at is not None:
                chunk_lengths.append(hits[at].end - hits[at].start)
            if llm is not None and at is not None:
                cits = cite(question, hits, "lexical")
                messages = [
                    {"role": "system", "content": instruction or PROMPT_INSTRUCTION},
                    {"role": "user", "content": render_user_message(question, cits)},
                ]
                reply = llm.chat(messages, max_tokens=ANSWER_MAX_TOKENS, temperature=0.0)
                answer = map_markers(reply.text, len(cits))
                t = time.perf_counter()
                grounded = ground_spans(
                    question,
                    cits,
                    answer.text,
                    canonical_text=lambda d: docs[d]["text"],
                    document_locators=lambda d: (
                        docs[d]["kind"],
                        locators_from_json(docs[d].get("locators_json")),
                    ),
                )
                ms["answer"].append((time.perf_counter() - t) * 1000)
                count("answer", phrasing, grounded[at].span)
                if _MARKERS.sub("", answer.text).strip():  # the reply has words, not only [n]
                    count("answer, worded replies", phrasing, grounded[at].span)
                cites["retrieved"] += 1
                cites["answer_cites"] += int(at + 1 in answer.used)
    for by_phrasing in tally.values():
        total = {"retrieved": 0.0, "span_holds_needle": 0.0}
        for cell in by_phrasing.values():
            cell["rate"] = round(cell["span_holds_needle"] / max(1, cell["retrieved"]), 3)
            total["retrieved"] += cell["retrieved"]
            total["span_holds_needle"] += cell["span_holds_needle"]
        total["rate"] = round(total["span_holds_needle"] / max(1, total["retrieved"]), 3)
        by_phrasing["all"] = total
    return {
        "set": str(set_dir),
        "index": str(index_uri),
        "top": TOP,
        "window": window,
        "model": embedder.spec.model_id,
        "span_holds_needle": tally,
        "mean_span_chars": {n: round(statistics.fmean(v or [0]), 1) for n, v in lengths.items()},
        "mean_chunk_chars": round(statistics.fmean(chunk_lengths or [0]), 1),
        "llm": (
            {"url": llm_url, "model": llm.model_name, "instruction": instruction, **cites}
            if llm
            else None
        ),
        "cite_ms_p50": {n: round(statistics.median(v), 2) for n, v in ms.items() if v},
        "cite_ms_p90": {
            n: round(statistics.quantiles(v, n=10)[-1], 2) for n, v in ms.items() if len(v) > 1
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rag_assets.bench.spans", description=__doc__)
    p.add_argument("--set", required=True, type=Path, help="needle set folder")
    p.add_argument("--documents", required=True, type=Path, help="its corpus folder")
    p.add_argument("--index", required=True, type=Path, help="index dir (built when empty)")
    p.add_argument("--window", type=int, default=1, help="candidates per span (default 1)")
    p.add_argument("--scoring", action="append", choices=SCORINGS, help="only these (default: all)")
    p.add_argument("--llm", help="OpenAI-compatible server: also measure answer-chosen spans")
    p.add_argument("--cache", type=Path, help="on-disk cache of the model's replies")
    p.add_argument("--instruction", help="another system instruction than the product's")
    p.add_argument("--model", help="a local sentence-transformers folder (default: MiniLM)")
    args = p.parse_args(argv)
    out = run(
        args.set,
        args.documents,
        args.index,
        args.window,
        tuple(args.scoring) if args.scoring else None,
        args.llm,
        args.cache,
        args.instruction,
        args.model,
    )
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
