"""The answer verifier (issue 50): how well it tells supported sentences from changed ones, and
how long it takes a sentence without a model.

``rag-assets bench verify --index DIR --questions SET`` (SET: a needle set folder such as
``../shared/eval/course-dev``): every needle of the set, cited with the chunk of ``DIR`` that
holds it, and its four changes (a number, a negation, a swapped term, another document's
needle; :mod:`rag_assets.lib.evaluate.verify_eval`) are verified; it prints the detection
rates and the time per sentence (p50/p95/mean over :data:`REPEAT` passes, the verifier alone:
sentence split, alignment and checks; no retrieval, no model). With ``--answers FILE`` (JSON
lines with ``question`` and ``answer``, e.g. written by the model) each answer is verified
against the sources ``ask`` cites, as ``rag-assets verify`` does, and the time per sentence of
those (four sources each) is reported too, with the verdict counts.

``python -m rag_assets.bench.verify --index DIR --set SET --llm URL --cache DIR --out FILE``
writes such a file first: for each question and phrasing the answer the model at ``URL`` writes
from the sources ``ask`` cites, with ``ask``'s own prompt (every reply cached by the served
model under ``--cache``, so a run that stops goes on where it stopped), then verifies them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

REPEAT = 5
"""Passes over the sentences timed (the first warms the caches and is not counted)."""


def _ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p95": 0.0, "mean": 0.0, "n": 0}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
        "mean": round(statistics.fmean(ordered), 3),
        "n": len(ordered),
    }


def open_index(index_uri: str | Path, settings: Any = None) -> Any:
    """The published index, its queries embedded by the packaged model (or the settings')."""
    from rag_assets.lib.index.embed import Embedder, resolve_model
    from rag_assets.lib.query.retrieve import Index

    model = getattr(settings, "embedding_model", "") or None
    return Index.open(index_uri, embedder=Embedder(resolve_model(model), batch_size=16))


def run_verify_bench(
    index: Any, set_dir: Path, answers: Path | None = None, repeat: int = REPEAT
) -> tuple[dict[str, Any], str]:
    """Detection rates and the time per sentence (see the module doc): (JSON, text)."""
    from rag_assets.lib.evaluate.questions import load_needle_set
    from rag_assets.lib.evaluate.verify_eval import index_detection, needle_cases
    from rag_assets.lib.query.verify import verify_answer

    qset = load_needle_set(set_dir)
    cases = needle_cases(index, qset.questions)
    detection = index_detection(index, qset.questions, cases)
    by_id = {c.question_id: c for c in cases}
    texts = [
        (r[k]["text"], by_id[r["question_id"]].source)
        for r in detection["rows"]
        for k in ("originals", "number", "negation", "term", "elsewhere")
        if k in r
    ]
    per_sentence: list[float] = []
    for n in range(max(2, repeat)):
        for text, source in texts:
            t = time.perf_counter()
            verify_answer(f"{text} [1]", [source])
            if n:
                per_sentence.append((time.perf_counter() - t) * 1000)
    out: dict[str, Any] = {
        "index": str(index.store.uri),
        "table": index.published.table,
        "set": str(set_dir),
        "detection": {k: v for k, v in detection.items() if k != "rows"},
        "ms_per_sentence": _ms(per_sentence),
    }
    if answers is not None:
        out["answers"] = verify_answers(index, answers, repeat)
    return out, _text(out)


def verify_answers(index: Any, path: Path, repeat: int = REPEAT) -> dict[str, Any]:
    """Each answer of ``path`` (JSON lines: question, answer) verified against the sources
    ``ask`` cites: verdict counts, the share supported, and the verifier's time per sentence
    (sources already cited; retrieval not counted)."""
    from collections import Counter

    from rag_assets.lib.evaluate.verify_eval import faithfulness

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    judged: list[tuple[str, Any, str]] = []
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    per_sentence: list[float] = []
    answered = 0
    for row in rows:
        if not row.get("answer"):
            continue
        ctx = index.ask(row["question"])
        if ctx.no_answer:
            continue
        answered += 1
        judged.append((row["answer"], index.sources(ctx), row["question"]))
        for n in range(max(2, repeat)):
            t = time.perf_counter()
            result = index.verify(ctx, row["answer"])
            if n and result.total:
                per_sentence.append((time.perf_counter() - t) * 1000 / result.total)
        for v in result.sentences:
            counts[v.verdict] += 1
            if v.kind:
                kinds[v.kind] += 1
    total = sum(counts.values())
    return {
        "file": str(path),
        "answers": answered,
        "sentences": total,
        "verdicts": dict(counts),
        "unsupported_kinds": dict(kinds),
        "supported_share": counts["supported"] / total if total else None,
        "alce": {  # citation recall and precision, the verifier as the judge
            k: v
            for k, v in faithfulness(judged).items()
            if k in ("citation_recall", "citation_precision")
        },
        "ms_per_sentence": _ms(per_sentence),
    }


def _detection_text(title: str, det: dict[str, Any]) -> str:
    """The detection rates, one line each."""
    orig = det["originals"]
    lines = [f"verifier on {title}:"]
    lines.append(
        f"  originals supported   {orig['supported']:>3} of {orig['total']:<3} {_pct(orig)}"
    )
    for kind, name in (
        ("number", "changed number"),
        ("negation", "negation"),
        ("term", "swapped term"),
        ("elsewhere", "from elsewhere"),
        ("changed", "all changes"),
    ):
        row = det[kind]
        lines.append(f"  {name:<18} flagged {row['flagged']:>3} of {row['total']:<3} {_pct(row)}")
    return "\n".join(lines)


def _text(out: dict[str, Any]) -> str:
    lines = _detection_text(f"{out['set']} ({out['table']})", out["detection"]).splitlines()
    ms = out["ms_per_sentence"]
    lines.append(f"  ms per sentence: p50 {ms['p50']}  p95 {ms['p95']}  mean {ms['mean']}")
    ans = out.get("answers")
    if ans:
        share = ans["supported_share"]
        lines.append(
            f"answers {ans['file']}: {ans['answers']} answers, {ans['sentences']} sentences, "
            f"verdicts {ans['verdicts']}, supported "
            f"{'-' if share is None else f'{share:.0%}'}; unsupported {ans['unsupported_kinds']}; "
            f"ALCE {ans['alce']}"
        )
        ms = ans["ms_per_sentence"]
        lines.append(f"  ms per sentence: p50 {ms['p50']}  p95 {ms['p95']}  mean {ms['mean']}")
    return "\n".join(lines)


def _pct(row: dict[str, Any]) -> str:
    return "" if row.get("rate") is None else f"({row['rate']:.1%})"


def write_answers(
    index: Any, set_dir: Path, url: str, cache: Path, out: Path, phrasings: tuple[str, ...]
) -> None:
    """The model's answer to each question of ``set_dir`` (each phrasing in ``phrasings``), as
    ``ask`` asks for it, one JSON line each in ``out`` (rewritten; replies from ``cache``)."""
    from rag_assets.lib.evaluate.questions import load_needle_set
    from rag_assets.lib.models.llm import LLMClient
    from rag_assets.lib.models.llm_cache import CachedClient
    from rag_assets.lib.query.cite import PROMPT_INSTRUCTION
    from rag_assets.lib.query.generate import ANSWER_MAX_TOKENS, map_markers

    llm = CachedClient(LLMClient(url, timeout=900), cache)
    qset = load_needle_set(set_dir)
    with out.open("w", encoding="utf-8") as f:
        for phrasing in phrasings:
            for q in qset.questions:
                text = q.queries.get(phrasing)
                if not text:
                    continue
                ctx = index.ask(text)
                row: dict[str, Any] = {"id": q.id, "phrasing": phrasing, "question": text}
                if not ctx.no_answer:
                    messages = [
                        {"role": "system", "content": PROMPT_INSTRUCTION},
                        {"role": "user", "content": ctx.user_message},
                    ]
                    reply = llm.chat(messages, max_tokens=ANSWER_MAX_TOKENS, temperature=0.0)
                    row["answer"] = map_markers(reply.text, len(ctx.citations)).text
                    row["model"] = llm.model_name
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m rag_assets.bench.verify", description=__doc__)
    p.add_argument("--index", required=True, help="a published index of the set's corpus")
    p.add_argument("--set", required=True, type=Path, help="a needle set folder")
    p.add_argument("--llm", default=None, help="OpenAI-compatible server: write answers first")
    p.add_argument("--cache", type=Path, default=Path("llm-cache"), help="model replies kept")
    p.add_argument("--out", type=Path, default=None, help="the answers file (JSON lines)")
    p.add_argument("--phrasings", default="course,ticket", help="which queries to answer")
    p.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="also: N sentences of the index's own chunks (chosen by hash) and their changes",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    index = open_index(args.index)
    if args.sample:
        from rag_assets.lib.evaluate.verify_eval import index_detection, sampled_cases

        sampled = index_detection(index, [], sampled_cases(index, args.sample))
        rows = {k: v for k, v in sampled.items() if k != "rows"}
        print(
            json.dumps({"sampled": rows}, indent=2)
            if args.json
            else _detection_text(f"{args.sample} sentences of {args.index}", rows)
        )
    answers = args.out
    if args.llm:
        answers = answers or Path(f"answers-{args.set.name}.jsonl")
        phrasings = tuple(x.strip() for x in args.phrasings.split(",") if x.strip())
        write_answers(index, args.set, args.llm, args.cache, answers, phrasings)
    out, text = run_verify_bench(index, args.set, answers)
    print(json.dumps(out, indent=2) if args.json else text)


if __name__ == "__main__":
    main()
