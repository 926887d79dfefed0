"""Filters and scopes (issue 34): parsing, the SQL they become, and the property that matters on
a real LanceDB index: for random filters and groups, every hit of every retriever satisfies both,
and a filtered dense search returns k hits whenever at least k chunks match: on the numpy scan,
LanceDB's prefiltered exact scan and its IVF index (falling back when the probed partitions
hold too few)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_assets.lib.index import ann
from rag_assets.lib.index.pipeline import index_folder
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.ingest.chunk import strategy
from rag_assets.lib.query.filters import DocumentFacts, Filter, FilterError, Scope
from rag_assets.lib.query.retrieve import Index
from rag_assets_tests.lib.index.fake_index import HashEmbedder

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
]
FOLDERS = ("hr", "hr/pay", "finance", "pub", "pub/blog")
TAGS = ("policy", "howto", "news", "legal")
GROUPS = ("hr", "finance", "legal")


class QueryHashEmbedder(HashEmbedder):
    def encode_query(self, query: str) -> np.ndarray:
        return self.encode([query])[0]


def test_parse_items_flags_and_json():
    f = Filter.parse(["tags=a", "tags=b", "format=pdf", "modified>=2025-01-31"], folder="/hr/")
    assert f.as_dict() == {
        "tags": ["a", "b"],
        "format": ["pdf"],
        "folder": ["hr"],
        "modified>=": ["2025-01-31T00:00:00Z"],
    }
    j = Filter.from_mapping({"tags": ["a", "b"], "size<": 100, "document": "x.md"})
    assert j.as_dict() == {"tags": ["a", "b"], "document": ["x.md"], "size<": ["100"]}
    assert not Filter.parse([], folder=".")  # the top folder: everything
    assert Filter.from_mapping(None) == Filter()


@pytest.mark.parametrize(
    ("items", "why"),
    [
        (["tags"], "is not key=value"),
        (["tags="], "give a value"),
        (["tags>=a"], "only size and modified take"),
        (["size>=ten"], "whole number of bytes"),
        (["modified<yesterday"], "ISO date or time"),
        (["Ta gs=x"], "is not key=value"),
    ],
)
def test_malformed_filters_are_one_line_errors(items, why):
    with pytest.raises(FilterError, match=why):
        Filter.parse(items)


def test_json_filters_refuse_other_shapes():
    for bad, why in [
        (["tags=a"], "must be an object"),
        ({"tags": []}, "give a value"),
        ({"tags": {"a": 1}}, "is not a string"),
        ({"tags": True}, "is not a string"),
    ]:
        with pytest.raises(FilterError, match=why):
            Filter.from_mapping(bad)


def test_scope_sql():
    scope = Scope(Filter.parse(["tags=a", "tags=it's", "size>10"]), frozenset({"hr", "b"}))
    assert scope.sql() == (
        "array_has_any(access, ['*', 'b', 'hr']) AND array_has_any(meta, ['tags=a', "
        "'tags=it''s']) AND size > 10"
    )
    assert Scope().sql() is None and Scope().unrestricted


def _facts() -> DocumentFacts:
    return DocumentFacts(
        [
            ("a.md", {"tags": ["x"], "modified": ["2025-01-01T00:00:00Z"], "size": ["10"]}, ["*"]),
            ("hr/b.md", {"tags": ["y"], "secret_key": ["1"], "size": ["99"]}, ["hr"]),
            ("c.md", {"colour": ["red"]}, None),  # access unknown: the administrator's
        ]
    )


def test_masks_groups_and_unknown_keys_say_nothing_of_hidden_documents():
    facts = _facts()
    assert facts.visible(None).tolist() == [True, True, True]
    assert facts.visible(frozenset()).tolist() == [True, False, False]
    assert facts.visible(frozenset({"hr"})).tolist() == [True, True, False]
    assert facts.mask(Scope(Filter.parse(["size>=50"]))).tolist() == [False, True, False]
    assert facts.mask(Scope(Filter.parse(["modified<2026-01-01"]))).tolist() == [True, False, False]
    # a key only hidden documents have is unknown to the caller, listed keys are visible ones
    with pytest.raises(FilterError) as err:
        facts.mask(Scope(Filter.parse(["secret_key=1"]), frozenset()))
    assert "secret_key" in str(err.value).split(":")[0] and "colour" not in str(err.value)
    assert "secret_key" not in str(err.value).split(":", 1)[1]
    assert facts.mask(Scope(Filter.parse(["secret_key=1"]), frozenset({"hr"}))).sum() == 1
    assert facts.facets(frozenset())["keys"]["tags"] == ["x"]
    assert facts.facets(frozenset({"hr"}))["keys"]["tags"] == ["x", "y"]


# -- the property, on a real LanceDB index ------------------------------------------------------
def _corpus(root: Path, n_docs: int = 24, seed: int = 7) -> dict[str, dict[str, list[str]]]:
    """Documents in folders, with random tags and access; returns the metadata written."""
    rng = random.Random(seed)
    written: dict[str, dict[str, list[str]]] = {}
    lines = []
    for i in range(n_docs):
        folder = rng.choice(FOLDERS)
        tags = sorted(set(rng.sample(TAGS, rng.randint(0, 2))))
        access = sorted(set(rng.sample(GROUPS, rng.randint(0, 2)))) if rng.random() < 0.6 else None
        paras = "\n\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "." for _ in range(6)
        )
        front = "---\n" + (f"tags: [{', '.join(tags)}]\n" if tags else "") + "---\n"
        path = root / folder / f"d{i:02d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{front}# Doc {i}\n\n{paras}\n")
        doc_id = f"{folder}/d{i:02d}.md"
        if access is not None:
            lines.append(f"{folder}/d{i:02d}.md access={','.join(access) if access else ''}")
        parts = folder.split("/")
        written[doc_id] = {
            "folder": ["/".join(parts[: j + 1]) for j in range(len(parts))],
            "tags": tags,
            "document": [doc_id],
            "format": ["markdown"],
            **({"access": access} if access is not None else {}),
        }
    (root / ".ragmeta").write_text("\n".join(lines) + "\n")
    return written


@pytest.fixture(scope="module")
def built_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("filters")
    written = _corpus(root / "docs")
    built = index_folder(
        root / "docs", IndexStore(root / "idx"), strategy("E", 120), HashEmbedder()
    )
    return root / "idx", built, written


@pytest.fixture(scope="module", params=["resident", "in-table"])
def scoped_index(request, built_corpus):
    """The index held in memory, and as a million-row one is served: rows, vectors and texts
    left in LanceDB (``RESIDENT_MAX_ROWS`` lowered to 0 for this small table)."""
    from rag_assets.lib.query import retrieve

    path, built, written = built_corpus
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "in-table":
            mp.setattr(retrieve, "RESIDENT_MAX_ROWS", 0)
        index = Index(IndexStore(path), built.entry, QueryHashEmbedder())
    assert index.resident == (request.param == "resident")
    chunks = {c.chunk_id: c for c in built.chunks}
    return index, written, chunks


def _oracle(written, clauses: dict[str, list[str]], groups: frozenset[str] | None) -> set[str]:
    """The documents a scope allows, from the metadata the corpus was written with."""
    out = set()
    for doc, md in written.items():
        if groups is not None and "access" in md and not set(md["access"]) & groups:
            continue
        if all(any(v in md.get(k, []) for v in vs) for k, vs in clauses.items()):
            out.add(doc)
    return out


clause_values = {
    "folder": st.sampled_from(FOLDERS),
    "tags": st.sampled_from(TAGS),
    "format": st.sampled_from(("markdown", "pdf")),
}


@st.composite
def scopes(draw):
    keys = draw(st.lists(st.sampled_from(sorted(clause_values)), max_size=2, unique=True))
    clauses = {
        k: draw(st.lists(clause_values[k], min_size=1, max_size=2, unique=True)) for k in keys
    }
    groups = draw(st.none() | st.frozensets(st.sampled_from(GROUPS), max_size=2))
    return clauses, groups


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    scope=scopes(),
    retriever=st.sampled_from(("dense", "bm25", "hybrid")),
    k=st.integers(1, 40),
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
)
def test_every_hit_satisfies_filter_and_groups_and_k_hits_when_k_match(
    scoped_index, scope, retriever, k, words
):
    index, written, chunks = scoped_index
    clauses, groups = scope
    flt = Filter.parse([f"{key}={v}" for key, vs in clauses.items() for v in vs])
    allowed = _oracle(written, clauses, groups)
    query = " ".join(words)
    hits = index.search(query, retriever, k=k, scope=Scope(flt, groups))
    assert {h.document_id for h in hits} <= allowed
    matching = [c for c in chunks.values() if c.document_id in allowed]
    if retriever == "bm25":  # BM25 returns no zero scores: chunks holding a query word
        worded = [c for c in matching if set(words) & set(c.text.lower().split())]
        assert len(hits) == min(k, len(worded)) or len(hits) <= min(k, len(matching))
    else:
        assert len(hits) == min(k, len(matching))  # k hits whenever k chunks match


def test_the_prefilter_paths_agree_with_the_numpy_scan(scoped_index, monkeypatch):
    index, written, chunks = scoped_index
    rng = random.Random(3)
    for trial in range(12):
        groups = frozenset(rng.sample(GROUPS, rng.randint(0, 2)))
        clauses = {"folder": [rng.choice(FOLDERS)]} if trial % 2 else {}
        scope = Scope(Filter.parse([f"{k}={v}" for k, vs in clauses.items() for v in vs]), groups)
        q = " ".join(rng.sample(WORDS, 2))
        index.exact_dense = True  # the service's numpy scan over the held vectors
        numpy_hits = index.search(q, "dense", k=15, scope=scope)
        index.exact_dense = False  # LanceDB's scan with the scope as a prefilter
        lance_hits = index.search(q, "dense", k=15, scope=scope)
        assert [h.chunk_id for h in numpy_hits] == [h.chunk_id for h in lance_hits]
        assert np.allclose(
            [h.cosine_distance for h in numpy_hits], [h.cosine_distance for h in lance_hits]
        )
        matching = sum(
            1 for c in chunks.values() if c.document_id in _oracle(written, clauses, groups)
        )
        assert len(lance_hits) == min(15, matching)


def test_the_ann_index_prefilters_and_falls_back_to_the_exact_scan(scoped_index, monkeypatch):
    from lancedb.index import IvfSq

    index, written, chunks = scoped_index
    pinned = index.table
    tbl = index.store.open_table(pinned.name)  # the latest version, to write the index
    assert tbl.count_rows() >= 150
    tbl.create_index("vector", config=IvfSq(distance_type="cosine", num_partitions=8))
    index.table = tbl
    try:
        index._ann_mode = (True, 8)
        monkeypatch.setattr(ann, "ANN_MIN_NPROBES", 1)  # probe 3 of 8 partitions
        scope = Scope(Filter.parse(["folder=pub/blog"]), frozenset())
        allowed = _oracle(written, {"folder": ["pub/blog"]}, frozenset())
        matching = sum(1 for c in chunks.values() if c.document_id in allowed)
        plan = index.plan(scope)
        assert plan is not None and plan.count == matching > 0
        short = 0
        for i in range(20):
            q = index.embedder.encode_query(f"probe {i}")
            raw = ann.dense_search(tbl, q, matching, ann=True, partitions=8, where=plan.sql)
            short += len(raw) < matching  # the probed partitions held too few of them
            hits = index._dense(q, matching, plan)
            assert len(hits) == matching and {c for c, _ in hits} <= {
                c for c, ch in chunks.items() if ch.document_id in allowed
            }
        assert short > 0  # the fallback was needed and taken
    finally:
        index._ann_mode, index.table = None, pinned
        tbl.drop_index("vector_idx")


def test_a_selective_filter_scans_and_a_wider_one_probes_more_partitions(scoped_index, monkeypatch):
    """Issue 40: under the ANN index, a filter matching at most FILTER_EXACT_MAX_ROWS rows is
    scanned exactly (1 M rows, 1 %: recall 0.57 through 41 of 123 partitions, 1.0 scanned), a
    wider one probes nprobes / sqrt(share) partitions."""
    from rag_assets.lib.query import retrieve

    index, written, chunks = scoped_index
    calls: list[dict[str, object]] = []
    real = retrieve.dense_search

    def spy(tbl, qvec, k, **kw):
        calls.append(kw)
        return real(tbl, qvec, k, **{**kw, "ann": False})  # no index on this small table

    monkeypatch.setattr(retrieve, "dense_search", spy)
    scope = Scope(Filter.parse(["folder=pub/blog"]), frozenset())
    plan = index.plan(scope)
    assert plan is not None and 0 < plan.count < index.published.rows
    index._ann_mode = (True, 123)
    try:
        q = index.embedder.encode_query("probe")
        index._dense(q, 5, plan)
        assert calls[-1]["ann"] is False  # a few rows match: the exact scan
        monkeypatch.setattr(retrieve, "FILTER_EXACT_MAX_ROWS", 0)
        index._dense(q, 5, plan)
        share = plan.count / index.published.rows
        assert calls[-1]["ann"] is True and calls[-1]["share"] == pytest.approx(share)
        index._dense(q, 5, None)
        assert calls[-1]["ann"] is True and calls[-1]["share"] == 1.0  # unfiltered: as before
    finally:
        index._ann_mode = None
    # the rule, by hand: 41 of 123 probed unfiltered; / sqrt(0.5) = 57.98 -> 58; at 10 %, all
    assert ann.filtered_nprobes(123, 1.0) == 41
    assert ann.filtered_nprobes(123, 0.5) == 58
    assert ann.filtered_nprobes(123, 0.1) == 123
    assert ann.filtered_nprobes(13, 0.25) == ann.nprobes_for(13)  # small: all already


def test_ask_and_documents_within_a_scope(scoped_index):
    """Citations are verified against the documents' texts (read from the table when they are
    not held) and come only from what the scope allows."""
    index, written, chunks = scoped_index
    groups = frozenset({"finance"})
    allowed = _oracle(written, {}, groups)
    ctx = index.ask("alpha bravo charlie", scope=Scope(groups=groups))
    assert ctx.citations or ctx.no_answer
    for c in ctx.citations:
        assert c.document_id in allowed
        assert index.documents[c.document_id]["text"][c.start : c.end] == c.quote
    hits = index.search("alpha bravo charlie", "hybrid", k=5, scope=Scope(groups=groups))
    for h in hits:
        assert index.documents[h.document_id]["text"][h.start : h.end] == h.content
    hidden = sorted(set(written) - allowed)
    assert hidden and not index.visible(hidden[0], groups) and index.visible(hidden[0], None)
    assert index.facets(groups)["documents"] == len(allowed)
