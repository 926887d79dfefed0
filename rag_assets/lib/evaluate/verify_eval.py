"""How well the answer verifier (issue 50) tells supported sentences from changed ones.

:func:`verifier_detection`: each needle of a question set, cited with the chunk that holds it,
must be ``supported``; the same sentence with a changed number, a negation, a swapped term, or
another document's needle in its place must not be (:func:`mutations` makes them, the same way
for any set: nothing here knows a needle). :func:`faithfulness`: the share of supported sentences
of generated answers, and citation recall and precision as ALCE defines them (Gao et al. 2023,
"Enabling Large Language Models to Generate Text with Citations"), with the verifier as the
entailment judge.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rag_assets.lib.query.verify import (
    NEGATIONS,
    NUMBER_WORDS,
    STOPWORDS,
    Source,
    check_claim,
    content_stems,
    split_sentences,
    stem,
    verify_answer,
    words,
)
from rag_assets.lib.types import normalize_ws

MUTATIONS = ("number", "negation", "term", "elsewhere")
"""The changes made to each needle (a needle without a number gets no number change)."""

_AUX = re.compile(
    r"\b(is|are|was|were|can|will|should|must|may|might|would|could|has|have|had|does|do|did)\b"
)
_NEGATION_OFF = [  # (pattern, replacement): the first that matches removes a negation
    (re.compile(r"\bcannot\b"), "can"),
    (re.compile(r"\b(\w+)n['’]t\b"), r"\1"),
    (re.compile(r"\bnever\b"), "always"),
    (re.compile(r"\bno need\b"), "a need"),
    (re.compile(r"\bwithout\b"), "with"),
    (re.compile(r"\bnot only\b"), "only"),
    (re.compile(r"\b(\w+) not\b"), r"\1"),
    (re.compile(r"\bnot\b ?"), ""),
    (re.compile(r"\bno\b"), "some"),
    (re.compile(r"\bnone\b"), "all"),
]
_NUMBER_TOKEN = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?|\b(?:{})\b".format("|".join(NUMBER_WORDS))
)


def _pick(key: str, n: int) -> int:
    """A deterministic choice in ``0..n-1`` from ``key`` (the same mutation every run)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % n


def change_number(sentence: str) -> str | None:
    """The sentence with its first number changed (digits: the last digit moved by one; a
    number word: the next one), or None without a number."""
    m = _NUMBER_TOKEN.search(sentence)
    if m is None:
        return None
    raw = m.group()
    if raw.lower() in NUMBER_WORDS:
        names = list(NUMBER_WORDS)
        new = names[(names.index(raw.lower()) + 1) % len(names)]
    else:
        i = max(k for k, ch in enumerate(raw) if ch.isdigit())
        digit = int(raw[i])
        new = raw[:i] + str(digit + 1 if digit < 9 else digit - 1) + raw[i + 1 :]
    return sentence[: m.start()] + new + sentence[m.end() :]


def negate(sentence: str) -> str:
    """The sentence with its polarity turned: its first negation removed, else "not" after its
    first auxiliary verb, else "It is not true that …"."""
    lowered = sentence
    for pattern, repl in _NEGATION_OFF:
        if pattern.search(lowered):
            out = pattern.sub(repl, lowered, count=1)
            return " ".join(out.split())
    m = _AUX.search(sentence)
    if m is not None:
        return f"{sentence[: m.end()]} not{sentence[m.end() :]}"
    return f"It is not true that {sentence[0].lower()}{sentence[1:]}"


def swap_term(sentence: str, source_text: str, vocabulary: Sequence[str], key: str) -> str | None:
    """The sentence with its most specific content word (the longest, not a number) replaced
    by a word of ``vocabulary`` (other documents' content words) that the source lacks, of the
    same shape (capitalised or not). None when there is nothing to swap."""
    have = set(content_stems(source_text))
    candidates = [
        w
        for w in words(sentence)
        if w.lower() not in STOPWORDS
        and w.lower() not in NEGATIONS
        and not w[0].isdigit()
        and w.lower() not in NUMBER_WORDS
        and len(w) >= 4
    ]
    if not candidates:
        return None
    target = max(candidates, key=lambda w: (len(w), w))
    upper = target[0].isupper()
    pool = [
        v
        for v in vocabulary
        if v[0].isupper() == upper and stem(v.lower()) not in have and v.lower() != target.lower()
    ]
    if not pool:
        return None
    new = pool[_pick(key, len(pool))]
    return re.sub(rf"\b{re.escape(target)}\b", new, sentence, count=1)


def mutations(
    needle: str,
    source_text: str,
    vocabulary: Sequence[str],
    other_needles: Sequence[str],
    key: str,
) -> dict[str, str | None]:
    """Each kind of :data:`MUTATIONS` of ``needle`` (None where it has nothing to change)."""
    return {
        "number": change_number(needle),
        "negation": negate(needle),
        "term": swap_term(needle, source_text, vocabulary, key),
        "elsewhere": other_needles[_pick(key, len(other_needles))] if other_needles else None,
    }


@dataclass(frozen=True)
class NeedleCase:
    """A needle with the source that holds it (and the question it answers)."""

    question_id: str
    needle: str
    source: Source


def vocabulary_of(texts: Iterable[str], limit: int = 4000) -> list[str]:
    """Content words (4+ letters, no digits) of ``texts``, sorted, at most ``limit``: what a
    swapped term is drawn from."""
    seen: dict[str, None] = {}
    for text in texts:
        for w in words(text):
            if len(w) >= 4 and w.isalpha() and w.lower() not in STOPWORDS:
                seen.setdefault(w, None)
    return sorted(seen)[:limit]


def verifier_detection(
    cases: Sequence[NeedleCase], vocabulary_for: Callable[[NeedleCase], Sequence[str]]
) -> dict[str, Any]:
    """Verdicts on every case's needle and its mutations: ``originals`` (supported count) and
    one entry per kind of :data:`MUTATIONS` (flagged count, with how often the reason named
    that kind), each with its total and rate, plus the per-case rows."""
    rows = []
    tally: dict[str, dict[str, int]] = {
        k: {"n": 0, "hit": 0, "named": 0} for k in ("originals", *MUTATIONS)
    }
    needles = [c.needle for c in cases]
    for case in cases:
        others = [
            n
            for c, n in zip(cases, needles, strict=True)
            if c.source.document_id != case.source.document_id
        ]
        variants: dict[str, str | None] = {"originals": case.needle}
        variants |= mutations(
            case.needle, case.source.text, vocabulary_for(case), others, case.question_id
        )
        row: dict[str, Any] = {"question_id": case.question_id}
        for kind, text in variants.items():
            if text is None:
                continue
            v = verify_answer(f"{text} [{case.source.number}]", [case.source]).sentences
            verdict = v[0] if v else None
            got = verdict.verdict if verdict else "none"
            named = verdict.kind if verdict else None
            t = tally[kind]
            t["n"] += 1
            if kind == "originals":
                t["hit"] += got == "supported"
            else:
                t["hit"] += got == "unsupported"
                t["named"] += named == kind
            row[kind] = {
                "text": text,
                "verdict": got,
                "kind": named,
                "reason": verdict.reason if verdict else "",
            }
        rows.append(row)
    out: dict[str, Any] = {}
    for kind, t in tally.items():
        out[kind] = {
            "total": t["n"],
            ("supported" if kind == "originals" else "flagged"): t["hit"],
            "rate": t["hit"] / t["n"] if t["n"] else None,
        }
        if kind != "originals":
            out[kind]["named"] = t["named"]
    changed = [t for k, t in tally.items() if k != "originals"]
    n = sum(t["n"] for t in changed)
    out["changed"] = {
        "total": n,
        "flagged": sum(t["hit"] for t in changed),
        "rate": sum(t["hit"] for t in changed) / n if n else None,
    }
    out["rows"] = rows
    return out


def faithfulness(answers: Sequence[tuple[str, Sequence[Source], str]]) -> dict[str, Any]:
    """Over generated answers ``(text, sources, question)``: the share of supported sentences,
    and ALCE's citation recall (a sentence's cited sources together state it) and precision (a
    citation that states the sentence alone, or without which the rest no longer does)."""
    sentences = supported = 0
    recall_hits = recall_n = 0
    precision_hits = precision_n = 0
    for text, sources, question in answers:
        framing = frozenset(content_stems(question))
        by = {s.number: s for s in sources}
        for s in split_sentences(text, len(sources)):
            sentences += 1
            cites = [by[n] for n in s.cites if n in by]
            recall_n += 1
            if not cites:
                continue
            whole = check_claim(s.claim, cites, framing).supported
            supported += whole
            recall_hits += whole
            for c in cites:
                precision_n += 1
                alone = check_claim(s.claim, [c], framing).supported
                rest = [x for x in cites if x is not c]
                needed = whole and rest and not check_claim(s.claim, rest, framing).supported
                precision_hits += bool(alone or needed)
    return {
        "answers": len(answers),
        "sentences": sentences,
        "supported_share": supported / sentences if sentences else None,
        "citation_recall": recall_hits / recall_n if recall_n else None,
        "citation_precision": precision_hits / precision_n if precision_n else None,
    }


def needle_in(needle: str, content: str, collapse: bool) -> bool:
    return (normalize_ws(needle) in normalize_ws(content)) if collapse else needle in content


def needle_cases(index: Any, questions: Sequence[Any]) -> list[NeedleCase]:
    """Each question whose needle a chunk of ``index`` holds whole, with that chunk as source
    [1] (the first such chunk in id order; a PDF's needle matched with white space collapsed,
    the pdf-dev rule). Destroyed needles are left out (the evaluation counts them)."""
    from rag_assets.lib.index.store import scan
    from rag_assets.lib.query.verify import chunk_source
    from rag_assets.lib.types import locators_from_json

    docs = index.documents
    cols = ["chunk_id", "document_id", "section", "from", "to", "page", "content"]
    rows = sorted(scan(index.table, cols).to_pylist(), key=lambda r: r["chunk_id"])
    out = []
    for q in questions:
        doc = (
            q.document
            if q.document in docs
            else next((d for d in docs if d.rsplit("/", 1)[-1] == q.document), None)
        )
        if doc is None:
            continue
        record = docs[doc]
        collapse = record["kind"] == "pdf"
        row = next(
            (
                r
                for r in rows
                if r["document_id"] == doc and needle_in(q.needle, r["content"], collapse)
            ),
            None,
        )
        if row is None:
            continue
        source = chunk_source(
            1,
            doc,
            row["content"],
            int(row["from"]),
            record["kind"],
            locators_from_json(record.get("locators_json")),
            row["page"],
            f"{doc.rsplit('/', 1)[-1]} {row['section']}",
        )
        out.append(NeedleCase(q.id, q.needle, source))
    return out


def index_detection(
    index: Any, questions: Sequence[Any], cases: Sequence[NeedleCase] | None = None
) -> dict[str, Any]:
    """:func:`verifier_detection` on ``index``'s needle chunks (or the ``cases`` given); a
    swapped term is drawn from the words of the documents other than the needle's."""
    cases = needle_cases(index, questions) if cases is None else cases
    docs = index.documents
    texts = {d: docs[d]["text"] for d in sorted({c.source.document_id for c in cases})}
    others: dict[str, list[str]] = {}

    def vocabulary_for(case: NeedleCase) -> Sequence[str]:
        did = case.source.document_id
        if did not in others:
            others[did] = vocabulary_of(t for d, t in texts.items() if d != did)
        return others[did]

    return verifier_detection(cases, vocabulary_for)


def answer_faithfulness(
    index: Any, questions: Sequence[Any], generate: Callable[[Any], str], limit: int = 0
) -> dict[str, Any]:
    """:func:`faithfulness` of the answers ``generate(context)`` writes for the first phrasing
    of each question (``limit`` > 0: at most that many questions) over the sources ``ask``
    cites; refused questions are counted, not answered."""
    answers: list[tuple[str, Sequence[Source], str]] = []
    refused = 0
    for q in list(questions)[: limit or None]:
        query = q.query_list()[0]
        ctx = index.ask(query.text)
        if ctx.no_answer:
            refused += 1
            continue
        answers.append((generate(ctx), index.sources(ctx), query.text))
    return faithfulness(answers) | {"refused": refused}


_PROSE_BAD = re.compile(r"[`*_\[\]<>$\\|{}~#]|https?://")


def sampled_cases(index: Any, n: int) -> list[NeedleCase]:
    """``n`` sentences of ``index``'s own chunks, each cited with its chunk: prose like a needle
    (40-220 characters, 7+ words, ending in a full stop, no markup), chosen by the SHA-256 of
    their text (the same ones every run, spread over every document): a set no one wrote."""
    from rag_assets.lib.index.store import scan
    from rag_assets.lib.query.verify import chunk_source
    from rag_assets.lib.types import locators_from_json

    docs = index.documents
    cols = ["chunk_id", "document_id", "section", "from", "page", "content"]
    found: dict[str, NeedleCase] = {}
    for row in sorted(scan(index.table, cols).to_pylist(), key=lambda r: r["chunk_id"]):
        record = docs[row["document_id"]]
        source = chunk_source(
            1,
            row["document_id"],
            row["content"],
            int(row["from"]),
            record["kind"],
            locators_from_json(record.get("locators_json")),
            row["page"],
            f"{row['document_id'].rsplit('/', 1)[-1]} {row['section']}",
        )
        for a, b in source.units:
            text = " ".join(source.unit_text(a, b).split())
            prose = 40 <= len(text) <= 220 and text.endswith(".") and len(text.split()) >= 7
            if prose and not _PROSE_BAD.search(text):
                key = hashlib.sha256(text.encode()).hexdigest()
                found.setdefault(key, NeedleCase(key[:8], text, source))
    return [found[k] for k in sorted(found)[:n]]
