"""The answer verifier (issue 50) on hand-built sources: sentences and markers, each verdict and
its reason, the evidence span, bad input, the policy, the second opinion's plumbing, and the
needle mutations of the evaluation (properties over any sentence of a source)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_assets.lib.evaluate.verify_eval import (
    NeedleCase,
    change_number,
    faithfulness,
    mutations,
    negate,
    swap_term,
    verifier_detection,
)
from rag_assets.lib.query.verify import (
    MAX_ANSWER_CHARS,
    SecondOpinion,
    VerifyInputError,
    apply_policy,
    check_answer,
    check_policy,
    chunk_source,
    numbers_in,
    split_sentences,
    verify_answer,
)

DOC = (
    "# Rollback\n\nThe previous table version stays on disk for 14 days after a publish. "
    "Rolling back does not re-embed any chunk; it only moves the publish pointer. "
    "The reranker reads the top 25 hits of the hybrid retriever.\n\n"
    "Caching\n\nThe embedding cache lives under the work folder and is keyed by the model "
    "revision. Queries are never sent to a remote server."
)
START = DOC.index("The previous")
CHUNK1 = DOC[START : DOC.index("Caching")].rstrip()
START2 = DOC.index("The embedding cache")
CHUNK2 = DOC[START2:]


def _sources():
    return [
        chunk_source(
            1, "ops/rollback.md", CHUNK1, START, "markdown", context="rollback.md Rollback"
        ),
        chunk_source(2, "ops/cache.md", CHUNK2, START2, "markdown", context="cache.md Caching"),
    ]


def _one(answer: str, sources=None):
    out = verify_answer(answer, sources if sources is not None else _sources())
    assert out.total == 1, [s.sentence.text for s in out.sentences]
    return out.sentences[0]


# -- sentences and markers --------------------------------------------------------------------
def test_sentences_keep_their_markers_and_places():
    answer = "It stays 14 days [1]. It moves a pointer. [1][2] Queries stay local [2, 3]."
    got = split_sentences(answer, 2)
    assert [s.text for s in got] == [
        "It stays 14 days [1].",
        "It moves a pointer. [1][2]",
        "Queries stay local [2, 3].",
    ]
    assert [s.cites for s in got] == [(1,), (1, 2), (2,)]
    assert got[2].invalid == ("[3]",)
    assert all(answer[s.start : s.end] == s.text for s in got)
    assert got[0].claim == "It stays 14 days ."


def test_a_paragraph_marker_covers_the_sentences_before_it_not_after_it():
    got = split_sentences("First one. Second one [2]. Third one.\n- Item one\n- Item two [1]", 2)
    assert [(s.cites, s.inherited) for s in got] == [
        ((2,), True),
        ((2,), False),
        ((), False),  # after the paragraph's last marker
        ((), False),  # a list item is its own paragraph
        ((1,), False),
    ]


def test_abbreviations_initials_and_code_do_not_end_a_sentence():
    got = split_sentences("Use e.g. the U.S. mirror. J. Smith wrote it [1].\n```\na. b. c.\n```", 1)
    assert [s.text for s in got] == [
        "Use e.g. the U.S. mirror.",
        "J. Smith wrote it [1].",
        "```\na. b. c.\n```",
    ]


def test_numbers_are_normalised():
    assert numbers_in("1,000 steps, 5e-5, 0.50 and twenty-four? no: twenty") == {
        "1000", "5e-5", "0.5", "24", "20"
    }  # fmt: skip
    assert numbers_in("GPT-2 runs 24x faster on 256-bit words") == {"2", "24", "256"}


# -- verdicts ---------------------------------------------------------------------------------
def test_a_stated_sentence_is_supported_with_its_span_as_evidence():
    v = _one("The previous table version stays on disk for 14 days after a publish [1].")
    assert v.verdict == "supported" and v.reason == "" and v.kind is None
    ev = v.evidence
    assert ev["source"] == 1 and ev["document_id"] == "ops/rollback.md"
    assert DOC[ev["from"] : ev["to"]] == ev["quote"]  # canonical offsets of the document
    assert ev["quote"] == "The previous table version stays on disk for 14 days after a publish."
    assert ev["fragment"] == f"#char={ev['from']},{ev['to']}"


def test_a_paraphrase_with_the_same_words_is_supported():
    v = _one("Rolling back only moves the publish pointer and does not re-embed chunks [1].")
    assert v.verdict == "supported"
    assert "Rolling back does not re-embed" in v.evidence["quote"]


@pytest.mark.parametrize(
    ("answer", "kind", "words"),
    [
        ("The previous table version stays on disk for 15 days after a publish [1].", "number",
         "15"),
        ("The previous table version stays on disk for fifteen days after a publish [1].",
         "number", "15"),
        ("Rolling back re-embeds every chunk; it only moves the publish pointer [1].", "negation",
         "drops the negation"),
        ("The previous table version does not stay on disk for 14 days after a publish [1].",
         "negation", "negates"),
        ("The reranker reads the top 25 hits of the dense retriever [1].", "term", "dense"),
        ("The embedding cache lives under the work folder [1].", "elsewhere", "source [2] does"),
        ("Bananas are rich in potassium and grow in tropical climates [1].", "elsewhere",
         "does not state it"),
    ],
)  # fmt: skip
def test_a_changed_sentence_is_unsupported_with_what_differs(answer, kind, words):
    v = _one(answer)
    assert v.verdict == "unsupported" and v.kind == kind and v.evidence is None
    assert v.reason.startswith({"number": "changed number", "negation": "negation",
                                "term": "swapped name or term",
                                "elsewhere": "statement from elsewhere"}[kind])  # fmt: skip
    assert words in v.reason


def test_fourteen_in_words_matches_14_in_digits():
    assert numbers_in("fourteen") == {"14"}
    v = _one("The previous table version stays on disk for 14 days after a publish [1].")
    assert v.verdict == "supported"


def test_uncited_claims_and_markers_naming_no_source():
    out = verify_answer("Queries are never sent to a remote server. Rolling back is fast [7].",
                        _sources())  # fmt: skip
    first, second = out.sentences
    assert first.verdict == "uncited" and "source [2] states it" in first.reason
    assert second.verdict == "uncited" and "[7] names no source" in second.reason
    assert (out.supported, out.total) == (0, 2)
    d = out.to_dict()
    assert set(d) == {"sentences", "supported", "total"}
    assert set(d["sentences"][0]) >= {"text", "cites", "verdict", "evidence", "reason"}


def test_several_cites_are_read_together():
    v = _one("The previous table version stays on disk for 14 days after a publish [2, 1].")
    assert v.verdict == "supported" and v.evidence["source"] == 1


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "n", "words"),
    [
        ("", 2, "is empty"),
        ("   \n", 2, "is empty"),
        (None, 2, "is empty"),
        ("x [1] " * 20_000, 2, f"at most {MAX_ANSWER_CHARS}"),
        ("It is \ud800 fine [1].", 2, "lone surrogate U+D800"),
        ("It has no marker at all.", 2, "has no [n] marker"),
        ("It cites [5] and [9].", 2, "has 2 source(s)"),
        ("It cites [1].", 0, "no sources (NO ANSWER)"),
    ],
)
def test_bad_answers_are_one_line(answer, n, words):
    with pytest.raises(VerifyInputError) as err:
        check_answer(answer, n)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_100_kb_answer_is_refused_before_anything_else():
    with pytest.raises(VerifyInputError, match="characters; at most"):
        check_answer("a" * 100_000 + " [1]")


# -- the policy -------------------------------------------------------------------------------
def test_policy_flag_drop_refuse():
    answer = "Rolling back only moves the publish pointer [1]. It keeps versions 99 days [1]."
    out = verify_answer(answer, _sources())
    assert [v.verdict for v in out.sentences] == ["supported", "unsupported"]
    assert apply_policy(answer, out, "flag") == (answer, False)
    text, refused = apply_policy(answer, out, "drop")
    assert text == "Rolling back only moves the publish pointer [1]." and not refused
    assert [v.dropped for v in out.sentences] == [False, True]
    bad = verify_answer("It keeps versions 99 days [1].", _sources())
    assert apply_policy("It keeps versions 99 days [1].", bad, "refuse")[1] is True
    assert apply_policy(answer, verify_answer(answer, _sources()), "refuse")[1] is False
    with pytest.raises(ValueError, match="RAG_ANSWER_VERIFY='maybe': use flag, drop or refuse"):
        check_policy("maybe")


def test_refusal_context_names_verification():
    from rag_assets.lib.query.cite import Context

    ctx = Context("How long?", "prompt", [], no_answer=False, threshold=0.6, nearest_distance=0.3)
    refused = ctx.refused_by_verification()
    assert refused.no_answer and refused.refused_by == "verification" and refused.prompt == ""
    assert refused.reason == "the answer is not supported by its sources"
    assert refused.message == 'NO ANSWER: the answer is not supported by its sources "How long?"'


# -- a second opinion (plumbing: a fake client; the real model in test_verify_cli.py) --------
class _Client:
    def __init__(self, reply: str):
        self.reply, self.calls = reply, []

    def chat(self, messages, **kw):
        from rag_assets.lib.models.llm import Completion

        self.calls.append(messages)
        return Completion(text=self.reply, raw={})


def test_the_second_opinion_is_asked_only_where_the_words_leave_doubt():
    sure = "The previous table version stays on disk for 14 days after a publish [1]."
    doubtful = "A rollback moves the publish pointer without touching any chunk vectors [1]."
    no = _Client("No")
    out = verify_answer(f"{sure} {doubtful}", _sources(), second_opinion=SecondOpinion(no))
    assert out.sentences[0].second_opinion is None  # every word in the source: not asked
    assert len(no.calls) == 1 and "without touching" in no.calls[0][-1]["content"]
    changed = verify_answer("It stays on disk for 15 days [1].", _sources(),
                            second_opinion=SecondOpinion(_Client("Yes")))  # fmt: skip
    assert changed.sentences[0].verdict == "unsupported"  # a number is never overruled


# -- the evaluation's mutations ---------------------------------------------------------------
def test_mutations_by_hand():
    assert change_number("It waits 14 days.") == "It waits 15 days."
    assert change_number("A rate of 5e-5.") == "A rate of 5e-6."
    assert change_number("No number here.") is None
    assert negate("It does not re-embed.") == "It does re-embed."
    assert negate("It cannot fail.") == "It can fail."
    assert negate("The pointer is moved.") == "The pointer is not moved."
    assert negate("Rollbacks move pointers.") == "It is not true that rollbacks move pointers."
    swapped = swap_term("The reranker reads hits.", "The reranker reads hits.", ["Kettle",
                        "tomatoes"], "k")  # fmt: skip
    assert swapped == "The tomatoes reads hits."
    m = mutations("It waits 14 days.", "It waits 14 days.", ["kettles"], ["Other words."], "k")
    assert set(m) == {"number", "negation", "term", "elsewhere"}


SENTENCES = [
    s.strip()
    for s in (
        "The previous table version stays on disk for 14 days after a publish.",
        "Rolling back does not re-embed any chunk; it only moves the publish pointer.",
        "The reranker reads the top 25 hits of the hybrid retriever.",
    )
]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(0, 2), key=st.text(min_size=1, max_size=8))
def test_every_source_sentence_is_supported_and_each_change_flagged(i, key):
    source = _sources()[0]
    case = NeedleCase("q", SENTENCES[i], source)
    vocabulary = ["kettle", "tomatoes", "walrus", "lighthouse", "Quokka", "Wombat"]
    other = NeedleCase("r", "Bananas grow in tropical climates near the sea.", _sources()[1])
    report = verifier_detection([case, other], lambda c: vocabulary)
    row = report["rows"][0]
    assert row["originals"]["verdict"] == "supported"
    for kind in ("number", "negation", "term", "elsewhere"):
        if kind in row:
            assert row[kind]["verdict"] == "unsupported", (kind, row[kind])


def test_faithfulness_counts_alce_recall_and_precision():
    sources = _sources()
    answers = [
        (
            "The previous table version stays on disk for 14 days after a publish [1, 2]. "
            "Queries are never sent to a remote server [2]. It is fast.",
            sources,
            "How long are versions kept?",
        )
    ]
    got = faithfulness(answers)
    # 3 sentences, 2 supported; recall 2/3; citations: [1] yes, [2] irrelevant to the first, [2]
    assert got["sentences"] == 3 and got["supported_share"] == pytest.approx(2 / 3)
    assert got["citation_recall"] == pytest.approx(2 / 3)
    assert got["citation_precision"] == pytest.approx(2 / 3)
