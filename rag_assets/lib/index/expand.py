"""Document expansion (doc2query): the model writes questions a user might ask that a chunk answers.

The questions become extra *views* of their chunk: extra BM25 documents and extra vectors that
point back to the chunk's id. A hit on a view returns the chunk (quoted from ``content`` as
always); the generated text is never shown or quoted.

Cost control: every chunk's questions are cached on disk, keyed by the sha256 of the chunk's
``text`` under one *expansion stamp* (model, prompt hash, n). The cache is an append-only JSON
Lines file per stamp, flushed after every chunk, so a killed run resumes where it stopped and
an edited document only costs the chunks whose text changed. A change of model, prompt or n is a
new stamp: a new cache file, a new ``chunk_questions`` code version, and new embedding tables.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_assets.lib.models.llm import LLMClient, LLMError
from rag_assets.lib.types import Chunk, sha256_text

PROMPT_VERSION = "d2q-1"
"""Bump together with :data:`SYSTEM_PROMPT` / :data:`USER_TEMPLATE` (both are hashed anyway)."""

SYSTEM_PROMPT = (
    "You write the questions that users of a software library type into a support ticket or a "
    "search box. Write each question on its own line, with no numbering and no answer."
)
"""Design: the gap to close is between the documentation's vocabulary and the user's, so the
model is asked for one question in the passage's own terms and the rest as a user who has the
problem the passage solves and does not know its terms (symptom first, everyday words)."""

USER_TEMPLATE = (
    "Passage:\n{text}\n\n"
    "Write {n} different questions that this passage answers.\n"
    "- Question 1 uses the passage's own terms.\n"
    "- The other questions are written by a user who has the problem this passage solves but "
    "does not know its terms: describe the symptom or goal in everyday words, quoting an exact "
    "error message, parameter or name only if the passage has one.\n"
    "Output only the {n} questions, one per line."
)

MAX_PASSAGE_CHARS = 1500
"""Longer chunk texts are cut before prompting (chunks target 512 characters; headers add ~60)."""

MAX_TOKENS_PER_QUESTION = 48
"""Generation budget per requested question (a ticket question is ~25 words ≈ 35 tokens)."""

MAX_QUESTION_CHARS = 300
"""A generated line longer than this is cut at a word boundary."""

SEED = 0
"""Fixed sampling seed, with temperature 0: the same model writes the same questions."""


def prompt_hash() -> str:
    """Short hash of everything that shapes the model's output besides the model itself."""
    blob = json.dumps(
        [PROMPT_VERSION, SYSTEM_PROMPT, USER_TEMPLATE, MAX_PASSAGE_CHARS, MAX_TOKENS_PER_QUESTION],
        separators=(",", ":"),
    )
    return sha256_text(blob)[:12]


@dataclass(frozen=True)
class ExpansionStamp:
    """What a set of generated questions depends on, besides the chunk text."""

    model: str  # model id as configured / as the server reports it (basename of a path)
    prompt: str  # :func:`prompt_hash`
    n: int

    @property
    def key(self) -> str:
        return sha256_text(f"{self.model}|{self.prompt}|{self.n}")[:16]

    def as_dict(self) -> dict[str, Any]:
        return {"expand_model": self.model, "expand_prompt": self.prompt, "expand_n": self.n}

    @property
    def label(self) -> str:
        return f"d2q:{self.model}:{self.prompt}:n{self.n}"


def model_label(client: LLMClient, configured: str | None = None) -> str:
    """The configured model name, else the id the server reports (basename of a path)."""
    name = (configured or "").strip() or client.model_id()
    return Path(name).name if "/" in name else name


def build_messages(text: str, n: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": USER_TEMPLATE.format(text=text[:MAX_PASSAGE_CHARS], n=n)},
    ]


_LEAD = re.compile(r"^\s*(?:[-*•]+|\(?\d{1,2}[.):]|q\d{1,2}[.):]|question\s*\d{1,2}[.):])\s*", re.I)


def _shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


_PROMPT_SHINGLES = _shingles(SYSTEM_PROMPT + "\n" + USER_TEMPLATE)


def parse_questions(reply: str, n: int) -> list[str]:
    """At most ``n`` distinct lines of ``reply`` that are questions: numbering, bullets and
    quotes stripped; dropped are short lines, echoed chunk headers (``Title > Section``) and
    echoed instructions (5 consecutive words from the prompt), as small models produce."""
    out: list[str] = []
    seen: set[str] = set()
    for line in reply.splitlines():
        q, prev = line.strip(), None
        while q != prev:
            prev, q = q, _LEAD.sub("", q).strip().strip('"“”').strip()
        if len(q) < 8 or q.lower().rstrip(":").endswith(("questions", "question")):
            continue
        if " > " in q or _shingles(q) & _PROMPT_SHINGLES:
            continue
        if len(q) > MAX_QUESTION_CHARS:
            q = q[:MAX_QUESTION_CHARS].rsplit(" ", 1)[0]
        if q.lower() in seen:
            continue
        seen.add(q.lower())
        out.append(q)
        if len(out) == n:
            break
    return out


class QuestionCache:
    """Append-only JSON Lines per stamp: ``{"text_hash": ..., "questions": [...]}`` per line.

    A truncated last line (a kill mid-write) is ignored on load and simply regenerated.
    """

    def __init__(self, directory: str | Path, stamp: ExpansionStamp):
        self.path = Path(directory) / f"questions-{stamp.key}.jsonl"
        self.stamp = stamp
        self.entries: dict[str, list[str]] = {}
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                    self.entries[str(row["text_hash"])] = [str(q) for q in row["questions"]]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        meta = self.path.with_suffix(".stamp.json")
        if not meta.exists():
            meta.write_text(json.dumps(stamp.as_dict(), indent=2))

    def get(self, text_hash: str) -> list[str] | None:
        """The cached questions, passed through :func:`parse_questions` again (so a better
        filter applies to what was written before it, without a model call)."""
        hit = self.entries.get(text_hash)
        return None if hit is None else parse_questions("\n".join(hit), self.stamp.n)

    def seed(self, entries: dict[str, list[str]]) -> int:
        """Add the ``entries`` (text hash -> questions) this cache does not have, as written by
        another machine (the last ``chunk_questions`` artefact, :func:`seed_entries`); returns
        how many were added. They are kept in the local file too."""
        new = {h: q for h, q in entries.items() if h not in self.entries}
        if new:
            self.entries.update(new)
            with self.path.open("a", encoding="utf-8") as f:
                for h, q in new.items():
                    f.write(json.dumps({"text_hash": h, "questions": q}) + "\n")
        return len(new)

    def put(self, text_hash: str, questions: list[str]) -> None:
        self.entries[text_hash] = questions
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"text_hash": text_hash, "questions": questions}) + "\n")
            f.flush()


@dataclass
class ExpansionReport:
    """Questions per chunk id, and what this run cost."""

    stamp: ExpansionStamp
    questions: dict[str, list[str]] = field(default_factory=dict)
    generated: int = 0  # chunks sent to the model in this run
    cached: int = 0  # chunks answered from the cache
    failed: list[str] = field(default_factory=list)  # chunk ids whose call failed (no views)
    seconds: float = 0.0  # wall time of the model calls

    @property
    def views(self) -> int:
        return sum(len(v) for v in self.questions.values())

    @property
    def seconds_per_chunk(self) -> float:
        return self.seconds / self.generated if self.generated else 0.0


def expand_chunks(
    chunks: Sequence[Chunk],
    client: LLMClient,
    cache: QuestionCache,
    *,
    progress: Callable[[int, int], None] | None = None,
    max_failures: int = 3,
) -> ExpansionReport:
    """Questions for every chunk, from the cache where its text hash is there, else the model.

    Chunks are visited in a stable order (document, offset) so a resumed run continues where the
    last one stopped. After ``max_failures`` failed calls in a row the endpoint is taken to be
    down and :class:`LLMError` is raised (what was written so far stays cached).
    """
    n = cache.stamp.n
    report = ExpansionReport(stamp=cache.stamp)
    ordered = sorted(chunks, key=lambda c: (c.document_id, c.start, c.chunk_id))
    todo = sum(1 for c in ordered if cache.get(sha256_text(c.text)) is None)
    in_a_row = 0
    for c in ordered:
        h = sha256_text(c.text)
        hit = cache.get(h)
        if hit is not None:
            report.questions[c.chunk_id] = hit
            report.cached += 1
            continue
        t = time.perf_counter()
        try:
            reply = client.chat(
                build_messages(c.text, n), max_tokens=MAX_TOKENS_PER_QUESTION * n, seed=SEED
            )
        except LLMError:
            in_a_row += 1
            report.failed.append(c.chunk_id)
            if in_a_row >= max_failures:
                raise
            continue
        in_a_row = 0
        report.seconds += time.perf_counter() - t
        qs = parse_questions(reply.text, n)
        cache.put(h, qs)
        report.questions[c.chunk_id] = qs
        report.generated += 1
        if progress:
            progress(report.generated, todo)
    return report


def view_rows(chunks: Sequence[Chunk], questions: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(chunk_id, view text) pairs in chunk order: the chunk's header line (if any) + question.

    The header keeps a view's document/section context, the way the chunk's own ``text`` does.
    """
    rows: list[tuple[str, str]] = []
    for c in chunks:
        header = (
            c.text[: len(c.text) - len(c.content)].strip() if c.text.endswith(c.content) else ""
        )
        for q in questions.get(c.chunk_id, []):
            rows.append((c.chunk_id, f"{header}\n{q}" if header else q))
    return rows


EXPANDED_MARK = "+"
"""Separates the chunk pipeline from the expansion label in a table's ``pipeline`` stamp."""


def expanded_pipeline(chunk_pipeline: str, stamp: ExpansionStamp | None) -> str:
    """The ``pipeline`` stamp of an embedding table: the chunker's, plus the expansion's label
    when expansion is on, so expanded and plain rows never share a table or a code version."""
    return f"{chunk_pipeline}{EXPANDED_MARK}{stamp.label}" if stamp else chunk_pipeline


def chunk_pipeline_of(pipeline: str) -> str:
    """The chunker's pipeline version inside a table's ``pipeline`` stamp."""
    return pipeline.split(EXPANDED_MARK, 1)[0]


def questions_name(stamp: ExpansionStamp, chunk_pipeline: str) -> str:
    """The ``chunk_questions`` artefact's name (relative to the index's artefacts, issue 42):
    chunk id -> questions for one pipeline and stamp."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in chunk_pipeline)
    return f"questions/{safe}-{stamp.key}.json"


def questions_json(report: ExpansionReport, chunks: Sequence[Chunk] = ()) -> bytes:
    """The artefact's bytes: the stamp, the questions per chunk id and each chunk's text hash
    (so a run with an empty cache, on another machine, reuses them: :func:`seed_entries`)."""
    hashes = {c.chunk_id: sha256_text(c.text) for c in chunks if c.chunk_id in report.questions}
    data = {"stamp": report.stamp.as_dict(), "questions": report.questions, "text_hash": hashes}
    return json.dumps(data, indent=1, sort_keys=True).encode("utf-8")


def questions_from(data: bytes | None, where: str) -> dict[str, list[str]]:
    """Chunk id -> questions from the artefact's bytes (None: not written yet)."""
    if data is None:
        raise FileNotFoundError(f"no generated questions at {where}: materialise chunk_questions")
    loaded = json.loads(data.decode("utf-8"))
    return {str(k): [str(q) for q in v] for k, v in loaded["questions"].items()}


def seed_entries(data: bytes | None) -> dict[str, list[str]]:
    """Text hash -> questions from an artefact written by :func:`questions_json` ({} when it is
    absent, unreadable or from before the text hashes were kept)."""
    if data is None:
        return {}
    try:
        loaded = json.loads(data.decode("utf-8"))
        hashes = loaded.get("text_hash") or {}
        return {
            str(h): [str(q) for q in loaded["questions"][cid]]
            for cid, h in hashes.items()
            if cid in loaded["questions"]
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
