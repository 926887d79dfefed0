"""Write a needle-format question set for any corpus (``rag-assets questions``).

The format is ``shared/eval/README.md``'s: ``questions.jsonl`` (needle, course and ticket
phrasings) and ``out_of_domain.jsonl`` (near-miss and unrelated queries), so that ``index`` /
``eval`` can evaluate and calibrate any folder.

* **Needles** are sentences copied verbatim from the extracted text: plain prose of 40-220
  characters ending like a sentence, no markup characters or URLs, not on a heading, table or
  HTML line and not inside a code or math block, occurring exactly once in the concatenation of
  all documents. The set takes the candidates with the smallest seeded content hash
  (:func:`sample_needles`), so an edit changes only the needles of the edited document, and
  its size follows the corpus (:func:`set_size`).
* **Questions**: the model writes one question in the document's terms and one as a support
  ticket for each needle. A question sharing :data:`MAX_SHARED_RUN` or more consecutive words
  with its needle is rejected (one retry with the next seed), so retrieval cannot win by
  string matching alone.
* **Near-miss out-of-domain** questions: for each document the model sees its title and section
  headings only (so it cannot copy the text's own terms) and names tools, products, methods or
  concepts of the same field that they do not cover, with a question about each
  (``TERM: … | QUESTION: …``). A question is kept only if its term is absent from the whole
  corpus (case-insensitive, and so is the term's longest word): the corpus cannot answer what it
  never names. (Asking the model for questions "the text does not cover" and having the judge
  check them kept 2 of 39 candidates on the course corpus with Qwen2.5-Coder 1.5B: the model
  writes answerable questions and the judge says yes to most; shown the excerpt, it named the
  excerpt's own terms: 0 of 22 kept on the PDF corpus.)
* **Unrelated** questions come from the shipped list ``rag_assets/data/unrelated_questions.txt``.

Every row carries ``generated`` = {model, prompt (version and SHA-256 of the templates), seed},
and ``provenance.json`` repeats it with the counts and the rejections.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

PROMPT_VERSION = "questions-3"
MIN_NEEDLE, MAX_NEEDLE = 40, 220  # characters, as in shared/eval/README.md
MAX_SHARED_RUN = 5
"""A question sharing this many consecutive words with its needle is rejected."""
NEAR_PER_DOCUMENT = 6
"""Near-miss candidates asked per document and round (before the absent-term check)."""
MIN_TERM = 3
"""Shortest term a near-miss question may be about (characters)."""
MIN_NEEDLES, MAX_NEEDLES = 32, 100
"""Bounds of a generated set's needle count (32: the size of the hand-written dev sets, the
smallest with which a paired sign test can see a 6-question difference at p < 0.05)."""
CHUNKS_PER_NEEDLE = 25
"""One needle per this many chunks between the bounds (a 2,500-chunk corpus gets 100)."""
NEAR_EXTRA = 5
"""Near-miss questions asked beyond the needle count (32 needles: 37 near, as course-dev)."""
N_UNRELATED = 13
"""Unrelated questions each generated set takes from the shipped list (as course-dev)."""

_MARKUP = re.compile(r"[`*_\[\]<>$\\|{}~#]|https?://|www\.")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_WORD = re.compile(r"[a-z0-9]+")

QUESTION_SYSTEM = (
    "You write evaluation questions for a documentation search engine. Given a sentence from "
    "the documentation, write two questions that the sentence answers: first as a reader of "
    "the documentation would ask it, then as a user would write a short support ticket "
    "(casual, symptom first). Use your own words: do not copy phrases from the sentence. "
    "Reply with exactly two lines:\nCOURSE: <question>\nTICKET: <ticket>"
)
QUESTION_USER = "Document: {title}\nSection: {section}\nSentence: {needle}"
NEAR_SYSTEM = (
    "You write search questions that a documentation site CANNOT answer, to test that its "
    "search refuses them. You see only a page's title and section headings. Name {n} tools, "
    "products, methods or concepts from the same field that are NOT among them (neighbouring "
    "topics a reader might expect to find, but which this page does not cover), and for each "
    "write one short question a reader might ask about it. Reply with exactly {n} lines:\n"
    "TERM: <name> | QUESTION: <question>"
)
NEAR_USER = "Title: {title}\nSections: {sections}"


def prompt_hash() -> str:
    blob = json.dumps([QUESTION_SYSTEM, QUESTION_USER, NEAR_SYSTEM, NEAR_USER, PROMPT_VERSION])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Needle:
    document: str
    text: str
    start: int
    section: str
    title: str


@dataclass
class Generated:
    questions: list[dict[str, Any]] = field(default_factory=list)
    out_of_domain: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)


def prose_lines(text: str) -> list[tuple[int, str]]:
    """``(offset, line)`` of the lines that may hold a needle: outside code fences and math
    blocks, not headings, tables, list-free HTML/MDX tag lines or block quotes of code."""
    out: list[tuple[int, str]] = []
    fence = math = False
    pos = 0
    for line in text.split("\n"):
        s = line.strip()
        start, pos = pos, pos + len(line) + 1
        if s.startswith("```") or s.startswith("~~~"):
            fence = not fence
            continue
        if s.startswith("$$"):
            math = not math if s.count("$$") == 1 else math
            continue
        if fence or math or not s:
            continue
        if s.startswith(("#", "|", "<", ">", "import ", "export ")) or s.endswith(">"):
            continue
        out.append((start, line))
    return out


def sentences(line: str) -> list[tuple[int, str]]:
    """``(offset in line, sentence)``: the line split after ``.!?`` before a capital."""
    out, pos = [], 0
    for part in _SENTENCE_END.split(line):
        idx = line.index(part, pos)
        out.append((idx, part))
        pos = idx + len(part)
    return out


def is_needle_text(s: str) -> bool:
    return (
        MIN_NEEDLE <= len(s) <= MAX_NEEDLE
        and s == s.strip()
        and s[-1] in ".!?"
        and s[0].isalpha()
        and s[0].isupper()
        and not _MARKUP.search(s)
        and "\n" not in s
    )


def candidate_needles(documents: dict[str, dict[str, Any]]) -> list[Needle]:
    """Every sentence of every document that passes the needle rules, unique in the corpus."""
    joined = "\n".join(d["text"] for _, d in sorted(documents.items()))
    out: list[Needle] = []
    for doc_id, d in sorted(documents.items()):
        text = d["text"]
        heads = sorted((h.start, h.title) for h in d.get("headings", []))
        for off, line in prose_lines(text):
            for soff, s in sentences(line):
                s = s.strip()
                if not is_needle_text(s) or joined.count(s) != 1:
                    continue
                start = off + line.index(s, soff)
                section = next((p for hs, p in reversed(heads) if hs <= start), "")
                out.append(Needle(doc_id, s, start, section, d.get("title", "")))
    return out


def set_size(n_chunks: int, n_candidates: int) -> int:
    """Needles asked for a corpus: ``ceil(chunks / CHUNKS_PER_NEEDLE)`` clamped to
    [:data:`MIN_NEEDLES`, :data:`MAX_NEEDLES`], never more than there are candidates."""
    want = max(MIN_NEEDLES, min(MAX_NEEDLES, math.ceil(n_chunks / CHUNKS_PER_NEEDLE)))
    return min(n_candidates, want)


def _rank(seed: int, *parts: str) -> str:
    """A content-derived sort key: the same item keeps its place when others change."""
    return hashlib.sha256("\x00".join([str(seed), *parts]).encode("utf-8")).hexdigest()


def sample_needles(candidates: Sequence[Needle], n: int, seed: int) -> list[Needle]:
    """The ``n`` candidates with the smallest content hash (seeded): a uniform sample that is
    stable under edits. Editing or deleting a document changes only its own candidates, so
    only the needles of that document change (plus, at most, the one at the boundary)."""
    ranked = sorted(candidates, key=lambda c: _rank(seed, c.document, c.text))
    return ranked[:n]


def shared_run(a: str, b: str) -> int:
    """Longest run of consecutive words (lowercase ``[a-z0-9]+``) that ``a`` and ``b`` share."""
    x, y = _WORD.findall(a.lower()), _WORD.findall(b.lower())
    best = 0
    prev = [0] * (len(y) + 1)
    for i in range(1, len(x) + 1):
        cur = [0] * (len(y) + 1)
        for j in range(1, len(y) + 1):
            if x[i - 1] == y[j - 1]:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def parse_pair(text: str) -> tuple[str, str] | None:
    """``(course, ticket)`` from the model's two labelled lines, else None."""
    got: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*\**\s*(COURSE|TICKET)\s*\**\s*[:\-]\s*(.+)$", line, re.I)
        if m and m.group(2).strip():
            got.setdefault(m.group(1).lower(), m.group(2).strip().strip('"'))
    if "course" in got and "ticket" in got:
        return got["course"], got["ticket"]
    return None


def unrelated_questions() -> list[str]:
    """The shipped everyday questions (package data), one per line."""
    text = resources.files("rag_assets").joinpath("data/unrelated_questions.txt").read_text("utf-8")
    return [s.strip() for s in text.splitlines() if s.strip() and not s.startswith("#")]


def generate(
    documents: dict[str, dict[str, Any]],
    llm: Any,
    *,
    n: int = MIN_NEEDLES,
    n_near: int | None = None,
    n_unrelated: int = N_UNRELATED,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Generated:
    """Write ``n`` needle questions, up to ``n_near`` near-miss (default ``n`` + 5) and
    ``n_unrelated`` unrelated out-of-domain queries for ``documents`` (id → {text, title,
    headings}) with the chat model ``llm`` (a
    :class:`~rag_assets.lib.models.llm_cache.CachedClient`).

    ``deadline`` (a ``clock()`` value): no new question is started after it; the set comes back
    with ``provenance["complete"] = False`` and a later call with the same cache resumes where
    this one stopped (every request is cached, so finished questions cost nothing again)."""
    say = progress or (lambda s: None)
    n_near = n + NEAR_EXTRA if n_near is None else n_near
    started = clock()
    hits0, misses0 = getattr(llm, "hits", 0), getattr(llm, "misses", 0)

    def out_of_time() -> bool:
        return deadline is not None and clock() >= deadline

    cands = candidate_needles(documents)
    if not cands:
        raise ValueError(
            "no sentence in these documents passes the needle rules (plain prose, "
            "40-220 characters, unique in the corpus): nothing to ask about"
        )
    out = Generated()
    prov = {"model": llm.model_name, "prompt": f"{PROMPT_VERSION}:{prompt_hash()}", "seed": seed}
    pool = sample_needles(cands, min(len(cands), n * 2), seed)
    used = 0
    stopped = False
    for needle in pool:
        if len(out.questions) >= n:
            break
        if out_of_time():
            stopped = True
            break
        pair, why = None, ""
        for attempt in range(2):
            reply = llm.chat(
                [
                    {"role": "system", "content": QUESTION_SYSTEM},
                    {
                        "role": "user",
                        "content": QUESTION_USER.format(
                            title=needle.title, section=needle.section, needle=needle.text
                        ),
                    },
                ],
                max_tokens=120,
                seed=seed + attempt,
                temperature=0.0 if attempt == 0 else 0.7,
            )
            pair = parse_pair(reply.text)
            if pair is None:
                why = f"unparseable reply {reply.text[:80]!r}"
            elif max(shared_run(p, needle.text) for p in pair) >= MAX_SHARED_RUN:
                why = f"shares >= {MAX_SHARED_RUN} consecutive words with the needle"
                pair = None
            if pair is not None:
                break
        used += 1
        if pair is None:
            out.rejected.append({"needle": needle.text, "document": needle.document, "why": why})
            continue
        out.questions.append(
            {
                "id": f"g{len(out.questions) + 1:02d}",
                "document": needle.document,
                "needle": needle.text,
                "queries": {"course": pair[0], "ticket": pair[1]},
                "generated": prov | {"kind": "needle"},
            }
        )
        say(f"question {len(out.questions)}/{n}")
    if not stopped:
        near, stopped = _near_misses(
            documents, llm, n_near, seed, prov, out.rejected, say, out_of_time
        )
        out.out_of_domain += near
    shipped = sorted(unrelated_questions(), key=lambda q: _rank(seed, q))
    for i, q in enumerate(shipped[:n_unrelated], start=1):
        out.out_of_domain.append(
            {
                "id": f"u{i:02d}",
                "kind": "unrelated",
                "query": q,
                "generated": {
                    "model": "shipped list",
                    "prompt": "unrelated_questions.txt",
                    "seed": None,
                },
            }
        )
    prov["model"] = llm.model_name  # known once the server has answered
    for row in [*out.questions, *out.out_of_domain]:
        if row["generated"]["model"] != "shipped list":
            row["generated"]["model"] = prov["model"]
    out.provenance = prov | {
        "prompt_version": PROMPT_VERSION,
        "needle_candidates": len(cands),
        "needles_tried": used,
        "questions": len(out.questions),
        "near": sum(1 for o in out.out_of_domain if o["kind"] == "near"),
        "unrelated": sum(1 for o in out.out_of_domain if o["kind"] == "unrelated"),
        "rejected": out.rejected,
        "complete": not stopped,
        "llm_calls": getattr(llm, "misses", 0) - misses0,
        "cached_calls": getattr(llm, "hits", 0) - hits0,
        "seconds": round(clock() - started, 1),
        "rules": {
            "needles": f"ceil(chunks / {CHUNKS_PER_NEEDLE}) in [{MIN_NEEDLES}, {MAX_NEEDLES}]",
            "sample": "smallest sha256(seed, document, sentence) first",
            "needle_chars": [MIN_NEEDLE, MAX_NEEDLE],
            "max_shared_run": MAX_SHARED_RUN,
            "near_check": "its term (and the term's longest word) absent from the corpus",
        },
    }
    return out


def parse_near(text: str) -> list[tuple[str, str]]:
    """``(term, question)`` pairs from the model's ``TERM: … | QUESTION: …`` lines (numbering and
    Markdown emphasis around them are ignored)."""
    line_re = re.compile(r"^[^A-Za-z]*TERM\s*:\s*(.+?)\s*\|\s*QUESTION\s*:\s*(.+?)\s*$", re.I)
    out = []
    for line in text.splitlines():
        m = line_re.match(line.replace("*", ""))
        if m:
            out.append((m.group(1).strip("\"'` "), m.group(2).strip("\"'` ")))
    return out


def absent_from(term: str, corpus_lower: str) -> bool:
    """True when neither the term nor its longest word occurs in the (lowercased) corpus."""
    words = sorted(_WORD.findall(term.lower()), key=len, reverse=True)
    if len(term) < MIN_TERM or not words:
        return False
    return term.lower() not in corpus_lower and words[0] not in corpus_lower


def _near_misses(
    documents: dict[str, dict[str, Any]],
    llm: Any,
    n_near: int,
    seed: int,
    prov: dict[str, Any],
    rejected: list[dict[str, Any]],
    say: Callable[[str], None],
    out_of_time: Callable[[], bool] = lambda: False,
) -> tuple[list[dict[str, Any]], bool]:
    """Near-miss questions and whether the deadline stopped them early."""
    corpus = "\n".join(d["text"] for _, d in sorted(documents.items())).lower()
    docs = sorted(documents, key=lambda d: _rank(seed, d))  # stable when others change
    kept: list[dict[str, Any]] = []
    for turn, doc_id in enumerate(docs * 2):  # a second, sampled round if the first is short
        if len(kept) >= n_near:
            break
        if out_of_time():
            return kept, True
        again = turn >= len(docs)
        d = documents[doc_id]
        sections = ", ".join([h.title for h in d.get("headings", [])][:12])
        reply = llm.chat(
            [
                {"role": "system", "content": NEAR_SYSTEM.format(n=NEAR_PER_DOCUMENT)},
                {
                    "role": "user",
                    "content": NEAR_USER.format(
                        title=d.get("title", doc_id), sections=sections or "(none)"
                    ),
                },
            ],
            max_tokens=240,
            seed=seed + int(again),
            temperature=0.7 if again else 0.0,
        )
        for term, q in parse_near(reply.text):
            if len(kept) >= n_near:
                break
            if not q.endswith("?") or len(q) < 15 or any(q == k["query"] for k in kept):
                continue
            if term.lower() not in q.lower() or not absent_from(term, corpus):
                rejected.append({"near": q, "term": term, "why": "its term is in the corpus"})
                continue
            kept.append(
                {
                    "id": f"n{len(kept) + 1:02d}",
                    "kind": "near",
                    "query": q,
                    "generated": prov | {"kind": "near", "document": doc_id, "term": term},
                }
            )
            say(f"near-miss {len(kept)}/{n_near}")
    return kept, False


def write(out: Generated, folder: Path) -> list[Path]:
    """``questions.jsonl``, ``out_of_domain.jsonl`` and ``provenance.json`` under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "questions.jsonl", folder / "out_of_domain.jsonl", folder / "provenance.json"]
    paths[0].write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in out.questions))
    paths[1].write_text(
        "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in out.out_of_domain)
    )
    paths[2].write_text(json.dumps(out.provenance, indent=2, ensure_ascii=False) + "\n")
    return paths
