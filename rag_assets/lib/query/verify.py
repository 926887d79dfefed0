"""Answer verification (issue 50): every sentence of an answer checked against the source it cites.

:func:`verify_answer` splits an answer into sentences with their ``[n]`` markers
(:func:`split_sentences`) and gives each a verdict:

* ``supported``: a cited source states it; the evidence is the span of that source (one to
  :data:`MAX_WINDOW` consecutive sentences, rows or cues of the cited chunk) that states it, with
  its quote, canonical ``from``/``to`` and locator;
* ``unsupported``: no cited source states it, with the reason naming what differs: a changed
  number, a negation, a swapped name or term, or a statement from elsewhere (the cited source
  says nothing like it; when another source of the same answer does, the reason names it);
* ``uncited``: a claim with no marker (or whose markers name no source of this question).

The checks need no model and no network: the sentence is aligned to the cited chunk's own
sentences by the words they share (content words, stemmed, :func:`content_stems`); the aligned
span must hold the sentence's content words (:data:`MIN_COVERAGE`), every number it states
(digits or number words), the same negations, and no content word that the source does not
have where the sentence replaced one of the span's (:func:`_check`). A model at ``RAG_LLM_URL``
may be asked as a second opinion (:class:`SecondOpinion`, ``RAG_VERIFY_LLM``).

Pure functions over the sources given: what decides which sources a caller may see is the
retrieval that numbered them (a marker that names none of them is no citation).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rag_assets.lib.query.cite import Citation, Context
    from rag_assets.lib.query.generate import Answer
    from rag_assets.lib.types import Locator

VERDICTS = ("supported", "unsupported", "uncited")
KINDS = ("number", "negation", "term", "elsewhere")
"""What an ``unsupported`` verdict names: a changed number, a negation, a swapped name or term,
a statement from elsewhere."""
KIND_WORDS = {
    "number": "changed number",
    "negation": "negation",
    "term": "swapped name or term",
    "elsewhere": "statement from elsewhere",
}

POLICIES = ("flag", "drop", "refuse")
"""``RAG_ANSWER_VERIFY``: flag unsupported sentences, drop them, or refuse an answer none of
whose sentences is supported."""
DEFAULT_POLICY = "flag"
REFUSAL_REASON = "the answer is not supported by its sources"
"""The refusal of ``RAG_ANSWER_VERIFY=refuse`` (``refused_by`` "verification")."""

MAX_ANSWER_CHARS = 10_000
"""Longest answer accepted for verification (characters): a generated answer is at most
``ANSWER_MAX_TOKENS`` = 1,024 tokens, about 4,000 characters; 10,000 is a long answer, a
100 KB one is a paste."""

MAX_WINDOW = 2
"""Consecutive source sentences one answer sentence may be aligned to (a model often joins
two sentences of its source into one)."""

MIN_COVERAGE = 0.6
"""Share of a sentence's content words the aligned span must hold (stemmed; numbers apart)."""

MIN_OWN_WORDS = 3
"""Content words of a claim beyond the question's it needs before the question's are left out
of its coverage (a claim that only restates the question is counted whole)."""

SECOND_OPINION_MIN = 0.35
"""A sentence whose coverage is at least this, but below :data:`MIN_COVERAGE`, is the one a
second opinion (``RAG_VERIFY_LLM=on``) is asked about; below it the statement is from
elsewhere whatever a model says."""

_STOPWORDS_TEXT = """
a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is
it its itself just let me more most my myself of off on once only or other our ours
ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself
yourselves may might must shall us via per thus hence therefore however instead rather
whether within without upon onto etc eg ie one ones s t d ll m re ve y also like well
using use used uses
"""
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
"""Function words (and the ubiquitous "use"), left out of the content words compared."""

_NEGATIONS_TEXT = """
not no never none nor neither nobody nothing nowhere cannot without unless n't
"""
NEGATIONS = frozenset(_NEGATIONS_TEXT.split())
_NEG_WORD = re.compile(
    r"\b(?:not|no|never|none|nor|neither|nobody|nothing|nowhere|cannot|without)\b|n[’']t\b",
    re.I,
)

_NUMBERS_TEXT = "one two three four five six seven eight nine"
NUMBER_WORDS = {
    "zero": "0", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
    "eighteen": "18", "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40",
    "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
    "twice": "2", "double": "2", "half": "0.5", "dozen": "12",
}  # fmt: skip
"""Number words read as numbers ("one" is left out: it is a pronoun as often as a number; a
source's "one" still matches an answer's "1")."""

_NUMBER = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?)")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:['’][a-z]+)?|\d+(?:[.,]\d+)*")
_MARKER = re.compile(r"\[\s*(\d+(?:\s*[,;]\s*\d+)*)\s*\]")
_SENT_END = re.compile(
    r"[.!?…][)\]\"'”’*_`]*\s+|\n+|(?<=\])[ \t]+(?=[\"“(]?[A-Z])"  # "… [1] Next sentence"
)


def _abbreviation_end(text: str) -> bool:
    """Whether ``text`` ends with an abbreviation's period ("e.g. ", "Sec. ", an initial "J. "):
    the abbreviations the pinpoint spans know (``locate.ABBREVIATIONS``)."""
    from rag_assets.lib.ingest.formats.locate import ABBREVIATIONS

    word = text.rstrip().rsplit(None, 1)[-1] if text.strip() else ""
    if not word.endswith("."):
        return False
    bare = word[:-1].lstrip("(\"'*_`")
    return (
        bare.lower() in ABBREVIATIONS
        or (len(bare) == 1 and bare.isupper())
        or (
            bool(re.fullmatch(r"(?:[A-Z]\.)+[A-Z]", bare))  # "U.S."
        )
    )


_MARKER_END = re.compile(r"\[\s*\d+(?:\s*[,;]\s*\d+)*\s*\]$")
_BULLET = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)


class VerifyInputError(ValueError):
    """An answer that cannot be verified (one line naming the cause and what to send)."""


# -- sentences ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sentence:
    """One sentence of an answer: ``text`` as written (markers included), its place in the
    answer (``start``/``end``), the source numbers it cites, and the markers that name none."""

    text: str
    start: int
    end: int
    cites: tuple[int, ...] = ()
    invalid: tuple[str, ...] = ()
    inherited: bool = False  # no marker of its own: cites the marker ending its paragraph

    @property
    def claim(self) -> str:
        """The words of the sentence: markers and list bullets removed, white space collapsed."""
        return " ".join(_BULLET.sub("", _MARKER.sub(" ", self.text)).split())


def split_sentences(answer: str, n_sources: int | None = None) -> list[Sentence]:
    """The sentences of ``answer`` with their markers, in order.

    A sentence ends at ``.``/``!``/``?`` followed by white space (not after "e.g." or an
    initial) or at a line break; a fenced code block is one sentence. A marker right after a
    sentence end (``… end. [2]``) belongs to the sentence before it; a piece that is only
    markers is joined to the sentence before. A sentence with no marker of its own cites the
    next marker of its paragraph (``S1. S2 [2].``: both cite [2], S1 ``inherited``; a model
    often cites once per paragraph); after the paragraph's last marker it cites nothing. With
    ``n_sources``, a number outside ``1..n_sources`` is no citation (kept in ``invalid`` as
    written, e.g. ``"[7]"``).
    """
    pieces: list[tuple[int, int]] = []
    pos = 0
    fences = [(m.start(), m.end()) for m in _FENCE.finditer(answer)]
    cuts: list[int] = []
    for m in _SENT_END.finditer(answer):
        end = m.end()
        if any(a < m.start() < b for a, b in fences):
            continue
        if m.group().strip() and _abbreviation_end(answer[pos:end]):
            continue
        after_bracket = not m.group().strip() and "\n" not in m.group()
        if after_bracket and not _MARKER_END.search(answer, pos, m.start()):
            continue  # "… ] Next": a cut only after a marker
        rest = answer[end:]
        trailing = re.match(r"(?:\s*\[\s*\d+(?:\s*[,;]\s*\d+)*\s*\])+[.!?]?", rest)
        if trailing and "\n" not in trailing.group():
            end += trailing.end()  # "... end. [2]": the marker is this sentence's
        cuts.append(end)
        pos = end
    pos = 0
    for cut in [*sorted(set(cuts)), len(answer)]:
        if cut > pos:
            pieces.append((pos, cut))
            pos = cut
    out: list[Sentence] = []
    for a, b in pieces:
        text = answer[a:b]
        lead = len(text) - len(text.lstrip())
        a, text = a + lead, text.strip()
        if not text:
            continue
        numbers: list[int] = []
        bad: list[str] = []
        for m in _MARKER.finditer(text):
            for item in re.split(r"\s*[,;]\s*", m.group(1).strip()):
                n = int(item)
                if n_sources is not None and not 1 <= n <= n_sources:
                    bad.append(f"[{n}]")
                elif n not in numbers:
                    numbers.append(n)
        s = Sentence(text, a, a + len(text), tuple(numbers), tuple(bad))
        if not _has_words(s.claim) and out:  # markers (or punctuation) alone: the last one's
            last = out[-1]
            out[-1] = Sentence(
                answer[last.start : s.end],
                last.start,
                s.end,
                tuple(dict.fromkeys((*last.cites, *s.cites))),
                (*last.invalid, *s.invalid),
            )
            continue
        if _has_words(s.claim):
            out.append(s)
    carry: tuple[int, ...] = ()
    for i in range(len(out) - 1, -1, -1):  # markers carried back within a paragraph
        s = out[i]
        if i + 1 < len(out) and "\n" in answer[s.end : out[i + 1].start]:
            carry = ()
        if s.cites or s.invalid:
            carry = s.cites
        elif carry:
            out[i] = replace(s, cites=carry, inherited=True)
    return out


def _has_words(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def markers_in(answer: str) -> list[int]:
    """Every number of every ``[n]`` marker of ``answer``, in order."""
    return [int(x) for m in _MARKER.finditer(answer) for x in re.split(r"\s*[,;]\s*", m.group(1))]


def check_answer(answer: Any, n_sources: int | None = None, what: str = "answer") -> str:
    """The answer to verify, or :class:`VerifyInputError` with one line: not a string, blank,
    longer than :data:`MAX_ANSWER_CHARS`, a lone surrogate or control character, no ``[n]``
    marker, or (given ``n_sources``) no marker naming one of the sources."""
    if not isinstance(answer, str) or not answer.strip():
        raise VerifyInputError(f"{what} is empty: send the answer's text with its [n] markers")
    if len(answer) > MAX_ANSWER_CHARS:
        raise VerifyInputError(
            f"{what} is {len(answer)} characters; at most {MAX_ANSWER_CHARS} are verified "
            "(send the answer, not the documents)"
        )
    from rag_assets.lib.ingest.validate import text_problem

    problem = text_problem(answer, what)
    if problem:
        raise VerifyInputError(problem)
    numbers = markers_in(answer)
    if not numbers:
        raise VerifyInputError(
            f"{what} has no [n] marker: end each sentence with the number of the source it "
            "comes from ([1], [2], … as `ask` numbers this question's sources)"
        )
    if n_sources is None:
        return answer
    if n_sources == 0:
        raise VerifyInputError(
            f"{what} cites [{numbers[0]}], but this question has no sources (NO ANSWER): "
            "there is nothing to verify it against"
        )
    if not any(1 <= n <= n_sources for n in numbers):
        shown = ", ".join(f"[{n}]" for n in dict.fromkeys(numbers))
        raise VerifyInputError(
            f"{what} cites {shown}, but this question has {n_sources} source(s): use "
            f"[1]..[{n_sources}] as `ask` numbers them"
        )
    return answer


# -- words ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The English Snowball (Porter 2) stem of ``word``, lower-cased, possessive dropped:
    "decryption" and "decrypting", "generation" and "generated" meet. Kept (a sentence's words
    recur in its sources and across answers)."""
    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    return str(_snowball().stemWord(w))


@functools.lru_cache(maxsize=1)
def _snowball() -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer("english")


def words(text: str) -> list[str]:
    """Word tokens of ``text`` (letters/digits; hyphenated and dotted names split)."""
    return _WORD.findall(text)


def content_stems(text: str) -> list[str]:
    """The stems of ``text``'s content words (no function words, no negations, no numbers)."""
    out = []
    for w in words(text):
        lw = w.lower()
        if lw in STOPWORDS or lw in NEGATIONS or lw[0].isdigit() or lw in NUMBER_WORDS:
            continue
        if len(lw) < 2:
            continue
        out.append(stem(lw))
    return out


@functools.lru_cache(maxsize=16384)
def _stem_set(text: str) -> frozenset[str]:
    """:func:`content_stems` of ``text`` as a set, kept: a source's units are aligned with every
    sentence of an answer (and of the next answers that cite them)."""
    return frozenset(content_stems(text))


def numbers_in(text: str, words_too: bool = True) -> set[str]:
    """The numbers ``text`` states, normalised ("1,000" and "1000" alike; "5e-5" kept whole;
    number words as digits)."""
    out = set()
    for m in _NUMBER.finditer(text):
        raw = m.group(1)
        out.add(_norm_number(raw))
    if words_too:
        for m in _COMPOUND.finditer(text):  # "twenty-four": 24, not 20 and 4
            out.add(str(int(NUMBER_WORDS[m.group(1).lower()]) + _UNITS[m.group(2).lower()]))
        for w in words(_COMPOUND.sub(" ", text)):
            lw = w.lower()
            if lw in NUMBER_WORDS:
                out.add(NUMBER_WORDS[lw])
    return out


_UNITS = {w: i for i, w in enumerate(_NUMBERS_TEXT.split(), 1)}
_COMPOUND = re.compile(
    r"\b(twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)[- ]"
    r"(one|two|three|four|five|six|seven|eight|nine)\b",
    re.I,
)


def _norm_number(raw: str) -> str:
    text = raw.replace(",", "") if re.fullmatch(r"\d{1,3}(?:,\d{3})+", raw) else raw
    try:
        value = float(text)
    except ValueError:
        return text.lower()
    return f"{value:g}" if "e" not in text.lower() else text.lower()


NEGATION_SCOPE = 4
"""Content words after a negation that it covers (up to the end of its clause)."""

_CLAUSE_END = re.compile(r"[;:.!?]|,\s*(?:but|while|whereas|and|so)\b|\bbut\b")


def negation_scopes(text: str) -> list[set[str]]:
    """For each negation of ``text``, the stems of the content words it covers: up to
    :data:`NEGATION_SCOPE` of them after it, within its clause."""
    out = []
    for m in _NEG_WORD.finditer(text):
        rest = text[m.end() :]
        stop = _CLAUSE_END.search(rest)
        out.append(set(content_stems(rest[: stop.start() if stop else len(rest)])[:NEGATION_SCOPE]))
    return out


def negation_at_odds(claim: str, span: str) -> str | None:
    """``"claim"`` when the claim negates what the span states without negation, ``"span"``
    when the span negates what the claim states without it, else None. A negation counts only
    where the other side speaks of what it covers (a claim that restates only the positive half
    of "it does not re-embed; it only moves the pointer" keeps its meaning)."""
    claim_stems, span_stems = set(content_stems(claim)), set(content_stems(span))
    claim_scopes, span_scopes = negation_scopes(claim), negation_scopes(span)
    for scope in claim_scopes:
        if scope & span_stems and not any(scope & other for other in span_scopes):
            return "claim"
    for scope in span_scopes:
        if scope & claim_stems and not any(scope & other for other in claim_scopes):
            return "span"
    return None


# -- sources ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """A cited chunk as the verifier reads it: its number, document, text (the citation's
    quote) at canonical ``start``, the candidate spans inside it (canonical ``[a, b)``), and a
    ``locate(a, b)`` giving a span's ``(fragment, label, page)``."""

    number: int
    document_id: str
    text: str
    start: int
    units: tuple[tuple[int, int], ...]
    context: str = ""  # the document's name and section path: what the chunk's header says
    locate: Callable[[int, int], tuple[str, str, int | None]] | None = None

    def unit_text(self, a: int, b: int) -> str:
        return self.text[a - self.start : b - self.start]


def sources_of(
    citations: Sequence[Citation],
    document_locators: Callable[[str], tuple[str, list[Locator]]] | None = None,
) -> list[Source]:
    """:class:`Source` objects for an answer's citations (the numbered sources of ``ask``): the
    spans are the sentences, rows or cues of each chunk (as the pinpoint spans' candidates)."""
    out = []
    for c in citations:
        kind, locs = document_locators(c.document_id) if document_locators else ("", [])
        context = " ".join(x for x in (c.document_name, c.section) if x)
        out.append(
            chunk_source(c.index, c.document_id, c.quote, c.start, kind, locs, c.page, context)
        )
    return out


def chunk_source(
    number: int,
    document_id: str,
    content: str,
    start: int,
    kind: str = "",
    locators: Sequence[Locator] = (),
    page: int | None = None,
    context: str = "",
) -> Source:
    """The :class:`Source` of one chunk (``content`` at canonical ``start`` of a document of
    ``kind`` with its locator map; ``page``: the chunk's first page, for a PDF)."""
    from rag_assets.lib.ingest.formats.locate import span_location, span_units

    locs = list(locators)
    end = start + len(content)
    units = span_units(kind, locs, start, end, content) or [(start, end)]

    def locate(a: int, b: int) -> tuple[str, str, int | None]:
        at_page = None if page is None else page + content[: a - start].count("\f")
        at = span_location(kind, locs, a, b, content[a - start : b - start], at_page)
        return at.fragment or f"#char={a},{b}", at.label or f"chars {a}–{b}", at_page

    return Source(number, document_id, content, start, tuple(units), context, locate)


# -- verdicts ---------------------------------------------------------------------------------
@dataclass
class Finding:
    """The checks' result for one sentence against one set of sources."""

    supported: bool
    kind: str | None  # one of KINDS when not supported
    detail: str  # what differs, in words
    coverage: float
    source: Source | None = None
    span: tuple[int, int] | None = None


@dataclass
class SentenceVerdict:
    """The verdict on one sentence (``to_dict``: the issue's wire shape)."""

    sentence: Sentence
    verdict: str
    reason: str = ""
    kind: str | None = None
    evidence: dict[str, Any] | None = None
    coverage: float | None = None
    second_opinion: str | None = None  # "yes" / "no" when a model was asked
    dropped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.sentence.text,
            "cites": list(self.sentence.cites),
            "cited_by": (
                None
                if not self.sentence.cites
                else "paragraph"
                if self.sentence.inherited
                else "sentence"
            ),
            "verdict": self.verdict,
            "evidence": self.evidence,
            "reason": self.reason,
            "kind": self.kind,
            "from": self.sentence.start,  # where the sentence is in the answer
            "to": self.sentence.end,
            "second_opinion": self.second_opinion,
            "dropped": self.dropped,
        }


@dataclass
class Verification:
    """Every sentence's verdict; ``supported`` of ``total`` sentences."""

    sentences: list[SentenceVerdict] = field(default_factory=list)
    policy: str = DEFAULT_POLICY
    second_opinion: str = "off"

    @property
    def supported(self) -> int:
        return sum(v.verdict == "supported" for v in self.sentences)

    @property
    def unsupported(self) -> int:
        return sum(v.verdict == "unsupported" for v in self.sentences)

    @property
    def total(self) -> int:
        return len(self.sentences)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sentences": [v.to_dict() for v in self.sentences],
            "supported": self.supported,
            "total": self.total,
        }

    def summary(self) -> dict[str, Any]:
        """What ``ask`` reports beside its ``sentences``."""
        return {
            "policy": self.policy,
            "supported": self.supported,
            "unsupported": self.unsupported,
            "uncited": sum(v.verdict == "uncited" for v in self.sentences),
            "total": self.total,
            "dropped": sum(v.dropped for v in self.sentences),
            "second_opinion": self.second_opinion,
        }


def verify_answer(
    answer: str,
    sources: Sequence[Source],
    *,
    question: str = "",
    second_opinion: SecondOpinion | None = None,
) -> Verification:
    """Verdicts for every sentence of ``answer`` against ``sources`` (numbered as its markers
    number them; a marker naming none of them is no citation). ``question``: what the answer
    answers (its words frame a sentence, :func:`check_claim`)."""
    framing = frozenset(content_stems(question))
    numbers = {s.number for s in sources}
    by_number = {s.number: s for s in sources}
    top = max(numbers, default=0)
    out = Verification(second_opinion="on" if second_opinion is not None else "off")
    for sentence in split_sentences(answer, top):
        cites = tuple(n for n in sentence.cites if n in numbers)
        invalid = (*sentence.invalid, *(f"[{n}]" for n in sentence.cites if n not in numbers))
        sentence = replace(sentence, cites=cites, invalid=invalid)
        out.sentences.append(_verdict(sentence, by_number, sources, second_opinion, framing))
    return out


def _verdict(
    sentence: Sentence,
    by_number: dict[int, Source],
    sources: Sequence[Source],
    second_opinion: SecondOpinion | None,
    framing: frozenset[str] = frozenset(),
) -> SentenceVerdict:
    claim = sentence.claim
    if not sentence.cites:
        why = "no source cited"
        if sentence.invalid:
            why += f" ({', '.join(sentence.invalid)} names no source of this question)"
        stated = check_claim(claim, sources, framing) if sources else None
        if stated is not None and stated.supported and stated.source is not None:
            why += f"; source [{stated.source.number}] states it"
        return SentenceVerdict(sentence, "uncited", why)
    cited = [by_number[n] for n in sentence.cites]
    found = check_claim(claim, cited, framing)
    wrong_citation = False
    if not found.supported:  # another source of the answer states it: a wrong citation
        others = [s for s in sources if s.number not in sentence.cites]
        elsewhere = check_claim(claim, others, framing) if others else None
        if elsewhere is not None and elsewhere.supported and elsewhere.source is not None:
            cites = ", ".join(f"[{n}]" for n in sentence.cites)
            found = replace(
                found,
                kind="elsewhere",
                detail=f"{cites} does not state it; source [{elsewhere.source.number}] does",
            )
            wrong_citation = True  # the words say where it comes from: no model is asked
    verdict = _from_finding(sentence, found)
    if second_opinion is not None and _ask_model(found) and not wrong_citation:
        source = found.source or cited[0]
        span = found.span or (source.units[0][0], source.units[-1][1])
        yes = second_opinion.states(source.unit_text(*span) or source.text, claim)
        verdict.second_opinion = "yes" if yes else "no"
        if found.supported and not yes:
            verdict.verdict, verdict.kind = "unsupported", "elsewhere"
            verdict.reason = (
                f"statement from elsewhere: the model at RAG_LLM_URL finds it is not stated "
                f"by source [{source.number}]"
            )
        elif not found.supported and yes and found.kind == "elsewhere":
            verdict.verdict, verdict.kind, verdict.reason = "supported", None, ""
            verdict.evidence = _evidence(source, span)
    return verdict


def _ask_model(found: Finding) -> bool:
    """Whether the second opinion is asked: a sentence the word checks leave uncertain (its
    words only partly in the source, no number or negation at odds)."""
    if found.kind in ("number", "negation", "term"):
        return False
    if found.supported:
        return found.coverage < 0.8
    return found.coverage >= SECOND_OPINION_MIN


def _from_finding(sentence: Sentence, found: Finding) -> SentenceVerdict:
    if found.supported and found.source is not None and found.span is not None:
        return SentenceVerdict(
            sentence,
            "supported",
            "",
            evidence=_evidence(found.source, found.span),
            coverage=round(found.coverage, 3),
        )
    kind = found.kind or "elsewhere"
    return SentenceVerdict(
        sentence,
        "unsupported",
        f"{KIND_WORDS[kind]}: {found.detail}",
        kind=kind,
        coverage=round(found.coverage, 3),
    )


def _evidence(source: Source, span: tuple[int, int]) -> dict[str, Any]:
    a, b = span
    fragment, label, page = source.locate(a, b) if source.locate else (f"#char={a},{b}", "", None)
    return {
        "source": source.number,
        "document_id": source.document_id,
        "quote": source.unit_text(a, b),
        "from": a,
        "to": b,
        "fragment": fragment,
        "label": label,
        "page": page,
    }


# -- the checks -------------------------------------------------------------------------------
def _windows(source: Source) -> list[tuple[int, int]]:
    """Runs of 1..MAX_WINDOW consecutive units of ``source``, as canonical spans."""
    units = source.units
    out = []
    for i in range(len(units)):
        for w in range(1, MAX_WINDOW + 1):
            if i + w <= len(units):
                out.append((units[i][0], units[i + w - 1][1]))
    return out


def check_claim(
    claim: str, sources: Sequence[Source], framing: frozenset[str] = frozenset()
) -> Finding:
    """Whether ``sources`` (together) state ``claim``, and if not, what differs.

    The claim is aligned to the span (1..:data:`MAX_WINDOW` consecutive units of one source)
    that holds most of its content words; then, in that order: too few of its words there
    (``elsewhere``), a number the span does not state (``number``), a negation the span does
    not make or lacks (``negation``), a content word that the source does not have where the
    span has another (``term``). ``framing``: the question's content stems, which a claim that
    restates the question carries without its source stating them; they are left out of the
    words counted while :data:`MIN_OWN_WORDS` others remain (never out of the other checks: a
    word the question offers is no evidence for a swapped term)."""
    whole = set(content_stems(claim))
    wanted = whole - framing if len(whole - framing) >= MIN_OWN_WORDS else whole
    best: tuple[tuple[float, float, int], Source, tuple[int, int]] | None = None
    for source in sources:
        for a, b in _windows(source):
            have = _stem_set(source.unit_text(a, b))
            cov = len(wanted & have) / len(wanted) if wanted else 1.0
            full = len(whole & have) / len(whole) if whole else 1.0  # ties: the question's too
            key = (cov, full, -(b - a))
            if best is None or key > best[0]:
                best = (key, source, (a, b))
    if best is None:
        return Finding(False, "elsewhere", "the cited source has no text", 0.0)
    (coverage, _, _), source, span = best
    span_text = source.unit_text(*span)
    if coverage < MIN_COVERAGE:
        closest = " ".join(span_text.split())
        closest = closest if len(closest) <= 120 else closest[:119] + "…"
        return Finding(
            False,
            "elsewhere",
            f"source [{source.number}] does not state it (closest: “{closest}”)",
            coverage,
            source,
            span,
        )
    said = numbers_in(claim)
    stated = numbers_in(span_text) | {NUMBER_WORDS.get(w.lower(), "") for w in words(span_text)}
    stated |= {"1" for w in words(span_text) if w.lower() in ("one", "a", "an", "single")}
    changed = sorted(n for n in said if n not in stated)
    if changed:
        near = sorted(numbers_in(span_text) - said)
        where = f"; source [{source.number}] says {', '.join(near)}" if near else ""
        return Finding(
            False,
            "number",
            f"the answer says {', '.join(changed)}, not in source [{source.number}]{where}",
            coverage,
            source,
            span,
        )
    odd = negation_at_odds(claim, span_text)
    if odd is not None:
        what = "negates" if odd == "claim" else "drops the negation of"
        return Finding(
            False,
            "negation",
            f"the answer {what} what source [{source.number}] says",
            coverage,
            source,
            span,
        )
    chunk_stems = {x for s in sources for x in _stem_set(f"{s.text} {s.context}")}
    swapped = _swapped(claim, span_text, chunk_stems, framing)
    if swapped:
        new, old = swapped
        detail = (
            f"the answer says “{new}” where source [{source.number}] says “{old}”"
            if old
            else f"the answer names “{new}”, which source [{source.number}] does not"
        )
        return Finding(False, "term", detail, coverage, source, span)
    return Finding(True, None, "", coverage, source, span)


def _swapped(
    claim: str, span_text: str, chunk_stems: set[str], framing: frozenset[str] = frozenset()
) -> tuple[str, str] | None:
    """(the claim's word, the span's word) where the claim puts a content word that its
    source does not have in the place of one of the span's content words. A word of the
    question (``framing``) counts only where the span's word is one of the question's too: the
    question offered both ("big- or little-endian?") and the source says the other."""
    from difflib import SequenceMatcher

    cw = [w for w in words(claim) if w.lower() not in STOPWORDS]
    sw = [w for w in words(span_text) if w.lower() not in STOPWORDS]
    cs, ss = [stem(w) for w in cw], [stem(w) for w in sw]
    claim_stems = set(cs)
    matcher = SequenceMatcher(a=ss, b=cs, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op != "replace":
            continue
        new = [cw[j] for j in range(j1, j2) if _is_content(cw[j]) and cs[j] not in chunk_stems]
        old = [sw[i] for i in range(i1, i2) if _is_content(sw[i])]
        offered = any(ss[i] in framing and ss[i] not in claim_stems for i in range(i1, i2))
        if not offered:  # a question's word, where the span's is not the question's other one
            new = [w for w in new if stem(w) not in framing]
        if new and old:
            return new[0], old[0]
    # in another order: a word the question offered where the span says its other one, or a
    # name (capitalised inside the sentence) that the source does not have
    other = [w for w, x in zip(sw, ss, strict=True) if x in framing and x not in claim_stems]
    first = next(iter(words(claim)), "")
    for j, (w, x) in enumerate(zip(cw, cs, strict=True)):
        if not _is_content(w) or x in chunk_stems:
            continue
        if x in framing and other:
            return w, other[0]
        named = (j > 0 or w != first) and w[:1].isupper() and x not in framing
        if named:
            names = [
                v for v, y in zip(sw, ss, strict=True) if v[:1].isupper() and y not in claim_stems
            ]
            return w, names[0] if names else ""
    return None


def _is_content(word: str) -> bool:
    """A content word as :func:`content_stems` counts them (2+ characters, no function word,
    negation or number)."""
    lw = word.lower()
    return len(lw) >= 2 and not (
        lw in STOPWORDS or lw in NEGATIONS or lw[0].isdigit() or lw in NUMBER_WORDS
    )


# -- a second opinion -------------------------------------------------------------------------
SECOND_OPINION_SYSTEM = (
    "You check whether a statement is stated by a passage. Reply with exactly one word: Yes if "
    "the passage says what the statement says, No otherwise."
)


@dataclass
class SecondOpinion:
    """Asks the chat model (``RAG_LLM_URL``, every reply cached by the served model) whether a
    passage states a sentence: one request of one output token per uncertain sentence."""

    llm: Any  # a CachedClient or LLMClient

    def states(self, passage: str, claim: str) -> bool:
        messages = [
            {"role": "system", "content": SECOND_OPINION_SYSTEM},
            {
                "role": "user",
                "content": f"Passage:\n{passage.strip()[:1500]}\n\nStatement: {claim}\n\n"
                "Does the passage state this? Reply Yes or No.",
            },
        ]
        reply = self.llm.chat(messages, max_tokens=2, temperature=0.0, seed=0)
        return reply.text.strip().lower().startswith("yes")


# -- the policy -------------------------------------------------------------------------------
def check_policy(value: str) -> str:
    """``RAG_ANSWER_VERIFY``'s value, or ValueError naming the setting."""
    v = (value or DEFAULT_POLICY).strip().lower()
    if v not in POLICIES:
        raise ValueError(f"RAG_ANSWER_VERIFY={value!r}: use flag, drop or refuse")
    return v


def apply_policy(answer: str, verification: Verification, policy: str) -> tuple[str, bool]:
    """(the answer text to show, whether to refuse) under ``policy``: ``flag`` keeps the text;
    ``drop`` removes the unsupported sentences; ``refuse`` refuses when no sentence is
    supported (else it flags)."""
    verification.policy = policy
    if policy == "refuse":
        return answer, verification.total > 0 and verification.supported == 0
    if policy != "drop":
        return answer, False
    pieces, pos = [], 0
    for v in verification.sentences:
        if v.verdict == "unsupported":
            v.dropped = True
            pieces.append(answer[pos : v.sentence.start])
            pos = v.sentence.end
    pieces.append(answer[pos:])
    return re.sub(r"[ \t]{2,}", " ", "".join(pieces)).strip(), False


def verify_generated(
    index: Any,
    ctx: Context,
    answer: Answer,
    policy: str = DEFAULT_POLICY,
    second_opinion: SecondOpinion | None = None,
    show_nearest: bool = False,
) -> tuple[Context, Answer | None, Verification]:
    """What ``ask`` does with the answer it generated (issue 50): verify it against its
    sources (``index.verify``) and apply ``policy`` (``RAG_ANSWER_VERIFY``): the context (a
    refusal by "verification" when ``refuse`` finds no sentence supported), the answer to show
    (None when refused; under ``drop`` without its unsupported sentences), and the verdicts."""
    verification = index.verify(ctx, answer.text, second_opinion)
    text, refuse = apply_policy(answer.text, verification, policy)
    if refuse:
        return ctx.refused_by_verification(show_nearest), None, verification
    return ctx, (answer if text == answer.text else replace(answer, text=text)), verification


def second_opinion_of(settings: Any) -> SecondOpinion | None:
    """The second opinion ``RAG_VERIFY_LLM=on`` asks for (the model at ``RAG_LLM_URL``, its
    replies cached under ``<RAG_WORK_DIR>/llm-cache``), or None."""
    if not settings.verify_second_opinion:
        return None
    from pathlib import Path

    from rag_assets.lib.query.judge import llm_cache_dir, make_client

    cache = llm_cache_dir(Path(settings.work_dir))
    return SecondOpinion(
        make_client(settings.llm_url, settings.llm_model, settings.llm_api_key, cache)
    )


NO_SOURCES = "this question has no sources (NO ANSWER): nothing in the index states it"
"""The reason of every cited sentence when the question is refused (nothing to verify against)."""


def verify_question(
    index: Any,
    question: str,
    answer: str,
    *,
    rerank: bool = True,
    scope: Any = None,
    base_url: str | None = None,
    second_opinion: SecondOpinion | None = None,
    what: str = "answer",
) -> dict[str, Any]:
    """``rag-assets verify``, ``POST /verify`` and the MCP ``verify_answer`` tool: the sources of
    ``question`` retrieved exactly as ``ask`` retrieves them (the same gate, the same numbering,
    within ``scope``: what the caller may see), then every sentence of ``answer`` checked
    against them. Raises :class:`VerifyInputError` (one line) for an answer that cannot be
    verified: see :func:`check_answer`; a marker naming no source makes its sentence uncited,
    and an answer whose markers name none of the sources is refused. A refused question leaves
    nothing to verify against: its cited sentences are unsupported (:data:`NO_SOURCES`).
    ``what``: the answer's name in those lines (``--answer`` for the command line)."""
    check_answer(answer, what=what)  # blank, long, bad characters, no marker: no search
    ctx = index.ask(question, rerank=rerank, base_url=base_url, scope=scope)
    if ctx.no_answer:
        sentences = []
        for s in split_sentences(answer):
            if s.cites:
                v = SentenceVerdict(
                    replace(s, cites=(), invalid=tuple(f"[{n}]" for n in s.cites)),
                    "unsupported",
                    f"{KIND_WORDS['elsewhere']}: {NO_SOURCES}",
                    kind="elsewhere",
                )
            else:
                v = SentenceVerdict(s, "uncited", "no source cited")
            sentences.append(v)
        result = Verification(sentences, second_opinion="off")
    else:
        check_answer(answer, len(ctx.citations), what)
        result = index.verify(ctx, answer, second_opinion)
    return {
        "question": question,
        "no_answer": ctx.no_answer,
        **result.to_dict(),
        "sources": [
            {
                "n": c.index,
                "document_id": c.document_id,
                "document_name": c.document_name,
                "locator_label": c.locator_label,
                "url": c.url,
            }
            for c in ctx.citations
        ],
    }
