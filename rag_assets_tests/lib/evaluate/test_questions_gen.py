"""``rag-assets questions``: needle selection rules, copy rejection, near-miss checks, the
shipped unrelated list, provenance, the loader reading the result; and the real 0.5B model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rag_assets.lib.evaluate import questions_gen as G
from rag_assets.lib.evaluate.questions import check_needles, load_needle_set
from rag_assets.lib.query.judge import make_client
from rag_assets_tests.lib.fake_llm import fake_llm, user_text

DOC_A = """# Rollbacks

The published pointer moves only after evaluation passes on the new table.

## Going back

```bash
rag-assets rollback  # This line is code and must never become a needle.
```

To return to the earlier model, run the rollback command and restart the service.
| a | table | row that is long enough to look like a sentence but is a table. |
Short one.
A sentence with `markup` in it is long enough but contains backticks here.

The history file keeps every earlier pointer so that any version can be restored.
"""
DOC_B = """# Chunking

Chunks are cut at paragraph boundaries whenever the paragraph fits the target size.

The published pointer moves only after evaluation passes on the new table.

Overlap repeats the last sixty-four characters of a chunk at the start of the next one.
"""


def _docs(tmp_path: Path) -> dict[str, dict]:
    from rag_assets.lib.ingest.extract import extract_folder

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(DOC_A)
    (tmp_path / "docs" / "b.md").write_text(DOC_B)
    return {
        d.document_id: {"text": d.text, "title": d.title, "headings": d.headings}
        for d in extract_folder(tmp_path / "docs").documents
    }


def test_needles_follow_the_rules(tmp_path):
    docs = _docs(tmp_path)
    texts = [c.text for c in G.candidate_needles(docs)]
    assert (
        "To return to the earlier model, run the rollback command and restart the service." in texts
    )
    assert (
        "Overlap repeats the last sixty-four characters of a chunk at the start of the next one."
        in texts
    )
    joined = "\n".join(d["text"] for d in docs.values())
    for t in texts:
        assert joined.count(t) == 1 and 40 <= len(t) <= 220 and not re.search(r"[`|#]", t)
    assert not any("published pointer" in t for t in texts)  # in both documents: not unique
    assert not any("code" in t or "table" in t or "backticks" in t for t in texts)


def test_shared_run_counts_consecutive_words():
    assert (
        G.shared_run("How do I run the rollback command now?", "run the rollback command and") == 4
    )
    assert G.shared_run("a b c d e f", "x a b c d e y") == 5
    assert G.shared_run("nothing here", "else entirely") == 0


def _writer(body):
    text = user_text(body)
    if "Sentence:" in text:
        needle = text.split("Sentence:")[-1].strip()
        if "history file" in needle:  # a lazy copy: must be rejected (twice, so dropped)
            return f"COURSE: {needle}\nTICKET: {needle}", None
        return "COURSE: What does this step do?\nTICKET: help, it does not work", None
    if "Sections:" in text:  # one term the corpus never names, one it does (rejected)
        return (
            "TERM: Liquibase | QUESTION: How do I roll back a Liquibase changeset?\n"
            "TERM: history file | QUESTION: Where is the history file kept?\n"
            "not a term line at all"
        ), None
    return "No", {"Yes": 0.1, "No": 0.9}


def test_generate_writes_a_loadable_set_with_provenance(tmp_path):
    docs = _docs(tmp_path)
    with fake_llm(_writer) as (url, _):
        llm = make_client(url, cache_dir=tmp_path / "cache")
        out = G.generate(docs, llm, n=10, n_near=3, n_unrelated=4, seed=7)
    paths = G.write(out, tmp_path / "set")
    qset = load_needle_set(tmp_path / "set")
    assert 1 <= len(qset.questions) < 10  # fewer candidates than asked; the copy rejected
    assert not any("history file" in q.needle for q in qset.questions)
    assert any("consecutive words" in r["why"] for r in out.rejected)
    assert check_needles(qset.questions, {d: r["text"] for d, r in docs.items()}) == []
    kinds = [o.kind for o in qset.out_of_domain]
    assert kinds.count("unrelated") == 4
    near = [o.query for o in qset.out_of_domain if o.kind == "near"]
    assert near == ["How do I roll back a Liquibase changeset?"]  # the named term: rejected
    assert any(r.get("term") == "history file" for r in out.rejected)
    for path in paths[:2]:
        for line in path.read_text().splitlines():
            gen = json.loads(line)["generated"]
            assert {"model", "prompt", "seed"} <= set(gen)
    prov = json.loads(paths[2].read_text())
    assert (
        prov["seed"] == 7
        and prov["model"] == "fake-model"
        and prov["prompt"].startswith("questions-3")
    )


def test_generated_sets_take_13_of_the_shipped_unrelated_questions(tmp_path):
    with fake_llm(_writer) as (url, _):
        out = G.generate(_docs(tmp_path), make_client(url, cache_dir=tmp_path / "c"), n=2, seed=3)
    unrelated = [o["query"] for o in out.out_of_domain if o["kind"] == "unrelated"]
    assert len(unrelated) == G.N_UNRELATED and set(unrelated) <= set(G.unrelated_questions())


def test_cli_needs_an_endpoint(tmp_path, monkeypatch):
    from rag_assets.cli import main

    monkeypatch.delenv("RAG_LLM_URL", raising=False)
    (tmp_path / "d").mkdir()
    assert (
        main(["questions", "--documents", str(tmp_path / "d"), "--out", str(tmp_path / "o")]) == 1
    )


@pytest.mark.slow
def test_real_model_writes_questions(tmp_path, llama_server_small):
    docs = _docs(tmp_path)
    llm = make_client(llama_server_small, cache_dir=tmp_path / "cache")
    out = G.generate(docs, llm, n=2, n_near=1, n_unrelated=2, seed=0)
    G.write(out, tmp_path / "set")
    qset = load_needle_set(tmp_path / "set")
    assert qset.questions, out.rejected
    for q in qset.questions:
        assert q.queries["course"].strip() and q.queries["ticket"].strip()
        assert max(G.shared_run(t, q.needle) for t in q.queries.values()) < G.MAX_SHARED_RUN


def test_near_miss_lines_and_the_absent_term_rule():
    pairs = G.parse_near(
        "1. TERM: Pinecone | QUESTION: Can I use Pinecone as the store?\n"
        "**TERM:** dbt **|** **QUESTION:** Does it run dbt models?\nnoise"
    )
    assert pairs == [
        ("Pinecone", "Can I use Pinecone as the store?"),
        ("dbt", "Does it run dbt models?"),
    ]
    corpus = "chunks are stored in lancedb tables with a vector column"
    assert G.absent_from("Pinecone", corpus)
    assert not G.absent_from("LanceDB", corpus)  # named by the corpus
    assert not G.absent_from("vector search engine", corpus)  # its longest word is there
    assert not G.absent_from("ab", corpus)  # too short to mean anything
