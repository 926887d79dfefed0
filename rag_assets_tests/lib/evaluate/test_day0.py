"""Issue 53: the day-0 cut's questions about other topics, their nearest-chunk distances and the
vector cache (a hash embedder and a small LanceDB index; the real model runs the whole path in
test_uniform_folder.py and rag_assets_tests/bench/test_day0_bench.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rag_assets.lib.evaluate import calibrate, day0
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.lib.index.fake_index import HashEmbedder, corpus


class _Counting(HashEmbedder):
    """A hash embedder with a query side that counts how many queries it embedded."""

    def __init__(self) -> None:
        super().__init__(dims=16)
        self.queries = 0

    def encode_queries(self, queries):  # type: ignore[no-untyped-def]
        self.queries += len(queries)
        return self.encode(list(queries))

    def encode_query(self, query):  # type: ignore[no-untyped-def]
        return self.encode([query])[0]


def test_the_shipped_questions_cover_many_domains_without_repeats():
    qs = day0.other_topics()
    assert len(qs) == 3082
    per = Counter(q.domain for q in qs)
    assert len(per) == 83 and min(per.values()) >= 30 and all(per)
    assert len({q.text.casefold() for q in qs}) == len(qs)  # no question twice
    assert {"c and c++", "deep learning", "cooking", "short queries"} <= set(per)
    assert len(day0.other_topics_digest()) == 64


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("day0")
    emb = _Counting()
    index_folder(corpus(root / "docs", n=4), root / "index", strategy("E", 300), emb)
    store = IndexStore(root / "index")
    return Index(store, store.published(), emb), root


def test_nearest_distances_are_the_dense_search_s_first_hit(small_index):
    """The oracle: the resident matrix product and a dense search per question agree, and so
    does the path a table too large to hold takes (one LanceDB search each)."""
    index, _ = small_index
    queries = ["topic 12", "Paragraph 3 of document 2", "boiling point of tungsten"]
    qvecs = np.stack([index.embedder.encode_query(q) for q in queries])
    fast = index.nearest_distances(qvecs, block=2)  # blocks of 2: the last one is short
    want = [index.search(q, "dense", k=1)[0].cosine_distance for q in queries]
    assert fast == pytest.approx(want, abs=1e-5)
    held, index._vectors = index._vectors, None  # the non-resident path
    try:
        assert index.nearest_distances(qvecs) == pytest.approx(want, abs=1e-5)
    finally:
        index._vectors = held


def test_the_questions_vectors_are_embedded_once_per_encoder(small_index):
    index, root = small_index
    cache = root / "cache"
    emb = index.embedder
    first = day0.other_topics_distances(index, cache)
    assert emb.queries == 3082 and len(first) == 3082
    assert first[0].query_id == "python/1" and first[0].kind == "unrelated"
    assert len(list(cache.glob("other-topics-*.npy"))) == 1
    again = day0.other_topics_distances(index, cache)
    assert emb.queries == 3082  # read from the cache
    assert [q.distances for q in again] == [q.distances for q in first]
    # a damaged file is embedded again and replaced, never an error
    (path,) = cache.glob("other-topics-*.npy")
    path.write_bytes(b"not a numpy file")
    third = day0.other_topics_distances(index, cache)
    assert emb.queries == 2 * 3082 and third[5].distances == first[5].distances
    # another encoder (its stamps differ) has its own file
    other = _Counting()
    other.spec = other.spec.__class__("test/other", other.spec.path, "rev-other", 16)
    assert day0.encoder_key(other) != day0.encoder_key(emb)


def test_the_day0_cut_on_an_index_bounds_the_share_it_promises(small_index):
    """What refusal_threshold does, on real distances: the chosen cut answers at most 1 % of the
    3,082 questions (30) and the next swept cut more; or, where even the smallest cut answers
    more (16-dimensional hash vectors sit close to everything), it fails closed at the floor."""
    index, root = small_index
    other = day0.other_topics_distances(index, root / "cache")
    c = calibrate.choose_day0_cut(other, 0.10)

    def answered(cut: float) -> int:
        return sum(1 for q in other if q.distances[0] < cut)

    above = [x for x in calibrate.DEFAULT_CUTS if x > c.cut]
    if c.satisfied:
        assert answered(c.cut) <= 30 and answered(c.cut) == c.row.bluffs_unrelated
        assert not above or answered(above[0]) > 30
    else:
        assert c.cut == min(calibrate.DEFAULT_CUTS) and answered(c.cut) > 30
        assert c.warning and c.warning == c.reason
