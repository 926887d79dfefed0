"""BM25 index: hand-computed scores, a reference implementation, persistence, stamps."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import bm25s
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_assets.lib.index import lexical
from rag_assets.lib.index.lexical import BM25_B, BM25_K1, BM25Index, tokenize

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared"
COURSE = SHARED / "corpus" / "course"
QUESTIONS = SHARED / "eval" / "course-dev" / "questions.jsonl"


def reference_scores(texts: list[str], query: str, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """The design's BM25 written out directly (Lucene idf, (k1+1) in the tf part)."""
    docs = [Counter(re.findall(r"[a-z0-9]+", t.lower())) for t in texts]
    dl = [sum(d.values()) for d in docs]
    n_docs, avgdl = len(docs), sum(dl) / len(docs)
    df = Counter(term for d in docs for term in d)
    scores = []
    for d, length in zip(docs, dl, strict=True):
        s = 0.0
        for term in re.findall(r"[a-z0-9]+", query.lower()):
            if term in d:
                idf = math.log(1 + (n_docs - df[term] + 0.5) / (df[term] + 0.5))
                tf = d[term]
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avgdl))
        scores.append(s)
    return scores


def reference_ranking(ids: list[str], texts: list[str], query: str) -> list[tuple[str, float]]:
    ref = reference_scores(texts, query)
    return sorted(
        ((i, s) for i, s in zip(ids, ref, strict=True) if s > 0), key=lambda x: (-x[1], x[0])
    )


SMALL = [
    "The cat sat on the mat.",
    "A dog chased the cat around the garden; the cat escaped.",
    "Tokenizers split text into tokens: BPE merges frequent pairs.",
    "Attention masks tell the model which tokens are padding.",
    "Padding tokens are added so every sequence in a batch has the same length.",
    "The learning rate warms up linearly, then decays.",
    "GPT-2 uses byte-level BPE; BERT uses WordPiece.",
    "Gradient accumulation simulates a larger batch size.",
    "",
    "!!! ??? ...",
]
SMALL_IDS = [f"s{i:02d}" for i in range(len(SMALL))]


def test_constants_are_lucene_defaults() -> None:
    assert (BM25_K1, BM25_B) == (1.2, 0.75)


def test_tokenize_lowercase_ascii_alnum_runs() -> None:
    assert tokenize("Hello, World! GPT-2's 3.5x") == ["hello", "world", "gpt", "2", "s", "3", "5x"]
    assert tokenize("attention_mask") == ["attention", "mask"]
    # only ASCII letters/digits are word characters: "é" and "β" split or vanish
    assert tokenize("Café β-VAE") == ["caf", "vae"]
    assert tokenize("") == [] and tokenize("  ,;  ") == []


def test_hand_computed_scores() -> None:
    # N=3, dl = 2, 3, 1, avgdl = 2; "cat" in 2 docs: idf = ln(1 + 1.5/2.5) = ln 1.6
    # d1: tf=1, K = 1.2*(0.25+0.75*2/2) = 1.2    -> 1*2.2/(1+1.2)  = 1       -> ln 1.6
    # d2: tf=2, K = 1.2*(0.25+0.75*3/2) = 1.65   -> 2*2.2/(2+1.65) = 4.4/3.65
    idx = BM25Index.build(["d1", "d2", "d3"], ["cat dog", "Cat CAT mouse", "bird"])
    got = idx.search("cat")
    assert [i for i, _ in got] == ["d2", "d1"]  # d3 scores zero: excluded
    assert got[0][1] == pytest.approx(math.log(1.6) * 4.4 / 3.65, rel=1e-12)
    assert got[1][1] == pytest.approx(math.log(1.6), rel=1e-12)
    # a repeated query token counts twice (sum over the query's tokens, as Lucene does)
    assert idx.search("cat cat")[0][1] == pytest.approx(2 * got[0][1], rel=1e-12)


def test_matches_reference_on_small_corpus() -> None:
    idx = BM25Index.build(SMALL_IDS, SMALL)
    for q in ["cat", "the cat", "padding tokens batch", "BPE", "gpt 2 bert", "the", "zebra"]:
        got = idx.search(q, k=100)
        want = reference_ranking(SMALL_IDS, SMALL, q)
        assert [i for i, _ in got] == [i for i, _ in want], q
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-12), q


def test_bm25s_lucene_is_the_definition_times_constant() -> None:
    """bm25s' Lucene tf part omits (k1+1): its scores are the definition / (k1+1) exactly."""
    engine = bm25s.BM25(k1=1.2, b=0.75, method="lucene", dtype="float64")
    engine.index([tokenize(t) for t in SMALL], show_progress=False)
    for q in ["the cat", "padding tokens batch", "bpe"]:
        raw = engine.get_scores(tokenize(q))
        for r, s in zip(raw, reference_scores(SMALL, q), strict=True):
            assert r * 2.2 == pytest.approx(s, rel=1e-12, abs=1e-15)


def test_ties_broken_by_id_and_k_cuts_inside_ties() -> None:
    idx = BM25Index.build(["c", "a", "b", "z"], ["same text", "same text", "same text", "other"])
    got = idx.search("same", k=10)
    assert [i for i, _ in got] == ["a", "b", "c"]
    assert got[0][1] == got[1][1] == got[2][1] > 0
    assert [i for i, _ in idx.search("same", k=2)] == ["a", "b"]


def test_empty_and_unknown_queries_and_corpora() -> None:
    idx = BM25Index.build(SMALL_IDS, SMALL)
    assert idx.search("") == [] and idx.search("?!") == [] and idx.search("zebra") == []
    assert idx.search("cat", k=0) == []
    empty = BM25Index.build([], [])
    assert empty.size == 0 and empty.search("cat") == []
    no_tokens = BM25Index.build(["a", "b"], ["", "?!"])
    assert no_tokens.size == 2 and no_tokens.search("cat") == []


def test_save_load_empty_indexes(tmp_path: Path) -> None:
    for n, (ids, texts) in enumerate([([], []), (["a", "b"], ["", "..."])]):
        BM25Index.build(ids, texts, stamps={"n": n}).save(tmp_path / str(n))
        loaded = BM25Index.load(tmp_path / str(n), expect_stamps={"n": n})
        assert loaded.ids == ids and loaded.search("a b") == []


def test_build_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unique"):
        BM25Index.build(["a", "a"], ["x", "y"])
    with pytest.raises(ValueError, match="2 ids but 1 texts"):
        BM25Index.build(["a", "b"], ["x"])


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(
        st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "x1", "Y2"]), max_size=12),
        min_size=1,
        max_size=25,
    ),
    query=st.lists(st.sampled_from(["alpha", "beta", "gamma", "y2", "omega"]), max_size=4),
    k=st.integers(min_value=1, max_value=30),
)
def test_property_agrees_with_reference(docs: list[list[str]], query: list[str], k: int) -> None:
    texts = [" ".join(d) for d in docs]
    ids = [f"id{i:03d}" for i in range(len(texts))]
    q = " ".join(query)
    got = BM25Index.build(ids, texts).search(q, k=k)
    ref = dict(zip(ids, reference_scores(texts, q), strict=True))
    positive = sorted((s for s in ref.values() if s > 0), reverse=True)
    assert len(got) == min(k, len(positive))
    assert [s for _, s in got] == pytest.approx(positive[: len(got)], rel=1e-9)
    for i, s in got:
        assert s == pytest.approx(ref[i], rel=1e-9)
    assert got == sorted(got, key=lambda x: (-x[1], x[0]))


def test_save_load_roundtrip_with_stamps(tmp_path: Path) -> None:
    stamps = {"chunks_hash": "abc", "chunker": "v1"}
    idx = BM25Index.build(SMALL_IDS, SMALL, stamps=stamps)
    target = tmp_path / "index" / "bm25"
    idx.save(target)
    meta = json.loads((target / "bm25_meta.json").read_text())
    assert meta["ids"] == SMALL_IDS and meta["stamps"] == stamps
    loaded = BM25Index.load(target, expect_stamps={"chunker": "v1", "chunks_hash": "abc"})
    assert loaded.ids == SMALL_IDS and loaded.size == len(SMALL) and loaded.stamps == stamps
    for q in ["the cat", "padding tokens batch", "bpe merges"]:
        assert loaded.search(q) == idx.search(q)
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == ["bm25"]  # no temp dirs


def test_load_refuses_other_stamps_naming_both(tmp_path: Path) -> None:
    BM25Index.build(SMALL_IDS, SMALL, stamps={"chunks_hash": "old"}).save(tmp_path / "bm25")
    with pytest.raises(ValueError, match="stale") as err:
        BM25Index.load(tmp_path / "bm25", expect_stamps={"chunks_hash": "new"})
    assert '"old"' in str(err.value) and '"new"' in str(err.value)


def test_load_accepts_a_newer_extractor_suite_for_the_same_table_version(tmp_path: Path) -> None:
    old = {"table": "t", "version": 5, "extractor": "pymupdf-2"}
    BM25Index.build(SMALL_IDS, SMALL, stamps=old).save(tmp_path / "bm25")
    loaded = BM25Index.load(tmp_path / "bm25", expect_stamps={**old, "extractor": "pymupdf-3"})
    assert loaded.ids == SMALL_IDS
    with pytest.raises(ValueError, match="stale"):
        BM25Index.load(tmp_path / "bm25", expect_stamps={**old, "version": 6})


def test_load_refuses_other_definition_and_missing_index(tmp_path: Path) -> None:
    BM25Index.build(SMALL_IDS, SMALL).save(tmp_path / "bm25")
    meta_path = tmp_path / "bm25" / "bm25_meta.json"
    meta = json.loads(meta_path.read_text())
    meta["definition"]["tokenizer"] = "porter-stemmed"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="porter-stemmed"):
        BM25Index.load(tmp_path / "bm25")
    with pytest.raises(FileNotFoundError, match="no index"):
        BM25Index.load(tmp_path / "absent")


def test_save_replaces_and_crash_keeps_previous_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "bm25"
    BM25Index.build(["a"], ["first cat"], stamps={"v": 1}).save(target)
    BM25Index.build(["b", "c"], ["second cat", "dog"], stamps={"v": 2}).save(target)
    assert BM25Index.load(target).ids == ["b", "c"]

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(lexical.bm25s.BM25, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        BM25Index.build(["d"], ["third cat"], stamps={"v": 3}).save(target)
    survived = BM25Index.load(target, expect_stamps={"v": 2})
    assert [i for i, _ in survived.search("cat")] == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["bm25"]


@pytest.mark.shared
@pytest.mark.skipif(not COURSE.is_dir(), reason="needs ../shared/corpus/course")
def test_matches_reference_on_course_paragraphs(tmp_path: Path) -> None:
    paras: list[str] = []
    for path in sorted(COURSE.glob("*.md")):
        paras += [p.strip() for p in re.split(r"\n\s*\n", path.read_text()) if p.strip()]
    assert len(paras) > 500
    ids = [f"p{i:05d}" for i in range(len(paras))]
    idx = BM25Index.build(ids, paras)
    idx.save(tmp_path / "bm25")
    idx = BM25Index.load(tmp_path / "bm25")
    queries = ["attention mask padding", "learning rate warmup schedule", "the the of"]
    if QUESTIONS.is_file():
        rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line]
        queries += [r["queries"]["course"] for r in rows[:10]]
    for q in queries:
        want = reference_ranking(ids, paras, q)[:20]
        got = idx.search(q, k=20)
        assert [i for i, _ in got] == [i for i, _ in want], q
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-12), q


def test_a_subset_search_scores_as_an_index_of_that_subset_alone(tmp_path):
    """Issue 34: with a mask, N, n_t and avgdl are the subset's; the hidden documents move no
    score and no rank (exact to float rounding), through a save and a load."""
    import random

    import numpy as np

    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) for _ in range(300)]
    ids = [f"id{i:03d}" for i in range(300)]
    BM25Index.build(ids, texts).save(tmp_path / "full")
    full = BM25Index.load(tmp_path / "full")
    assert full.doc_lengths is not None
    for _ in range(25):
        keep = np.array([rng.random() < 0.3 for _ in ids])
        alone = BM25Index.build(
            [i for i, k in zip(ids, keep, strict=True) if k],
            [t for t, k in zip(texts, keep, strict=True) if k],
        )
        q = " ".join(rng.choice(words) for _ in range(3))
        got, want = full.search(q, 20, mask=keep), alone.search(q, 20)
        assert [i for i, _ in got] == [i for i, _ in want]
        assert np.allclose([s for _, s in got], [s for _, s in want], rtol=1e-12, atol=0)
    assert full.search("w1", 5, mask=np.zeros(300, dtype=bool)) == []
    everything = full.search("w1 w2", 10, mask=np.ones(300, dtype=bool))
    assert everything == full.search("w1 w2", 10)
