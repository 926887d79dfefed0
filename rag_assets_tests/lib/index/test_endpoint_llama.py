"""A real model behind a real server (issue 35): nomic-embed-text-v1.5 (f16 GGUF, Apache-2.0,
768 dimensions) served by llama.cpp's server (``python -m llama_cpp.server --embedding true``,
the ``llama-cpp-python[server]`` wheel in ``../shared/wheels``). One test indexes a small folder
through ``rag-assets index`` and queries it with ``rag-assets search``; the other performs the
runbook (``python -m rag_assets.bench.endpoint walkthrough``): the served model swapped under the
same name and URL (CLS instead of mean pooling), the fingerprint changed, exactly
``chunk_embeddings`` stale, the old table refused, the upgrade published behind the gate, and
rollback. Skipped, saying how to get them, without the weights or the runtime. The corpus is a
few short documents: nomic f16 on these CPUs embeds ~30 tokens/s on one busy thread."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_assets.bench.endpoint import start_embedding_server, stop_server, walkthrough
from rag_assets.cli import main
from rag_assets.lib.index.store import IndexStore
from rag_assets_tests.llm_server import model_file

NOMIC = "nomic-embed-text-v1.5.f16.gguf"
ALIAS = "nomic-embed-text-v1.5"

pytestmark = pytest.mark.slow

DOCS = {
    "rollback.md": (
        "# Rolling back\n\n"
        "## The command\n\n"
        "Run rag-assets rollback to publish the previous table version again. "
        "The old table stays on disk until it is compacted.\n"
    ),
    "tea.md": (
        "# Brewing green tea\n\n"
        "## Water\n\n"
        "Green tea wants water at about eighty degrees, never boiling. "
        "Steep the leaves for two minutes.\n"
    ),
    "bikes.md": (
        "# Bicycle chains\n\n"
        "## Cleaning\n\n"
        "Wipe the chain with a dry rag, then add one drop of oil to every link. "
        "A dirty chain wears the cassette.\n"
    ),
}
NEEDLES = [
    ("e01", "rollback.md", "Run rag-assets rollback to publish the previous table version again.",
     "How do I publish the previous table version again?",
     "new index is worse, how do I go back to the old one?"),
    ("e02", "tea.md", "Green tea wants water at about eighty degrees, never boiling.",
     "What water temperature does green tea need?",
     "my green tea tastes bitter, is my kettle too hot?"),
    ("e03", "bikes.md", "Wipe the chain with a dry rag, then add one drop of oil to every link.",
     "How should a bicycle chain be cleaned and oiled?",
     "chain squeaks after rain, what do I put on it?"),
]  # fmt: skip
OUT_OF_DOMAIN = [
    "What is the capital of Australia?", "How many moons does Jupiter have?",
    "Who wrote the novel Middlemarch?", "What is the boiling point of tungsten?",
    "How do I file my taxes online?", "Which vaccine do cats need yearly?",
    "How tall is Mount Kilimanjaro?", "What year did the Berlin wall fall?",
    "How do I bake sourdough bread?", "What is a good beginner chess opening?",
    "How do I change a car tyre?", "Which planet has the longest day?",
    "How do I knit a scarf?", "What does a notary public do?",
    "How deep is the Mariana trench?", "When was the printing press invented?",
    "How do I repot an orchid?", "Which language has the most speakers?",
    "How do I descale an espresso machine?", "What causes the northern lights?",
]  # fmt: skip


def write_corpus(root: Path) -> tuple[Path, Path]:
    """The small folder and its needle-format question set (3 questions, 20 out-of-domain)."""
    docs, qs = root / "documents", root / "questions"
    docs.mkdir(parents=True)
    qs.mkdir(parents=True)
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    lines = [
        json.dumps({"id": i, "document": d, "needle": n, "queries": {"course": c, "ticket": t}})
        for i, d, n, c, t in NEEDLES
    ]
    (qs / "questions.jsonl").write_text("\n".join(lines) + "\n")
    ood = [
        json.dumps({"id": f"eo{i:02d}", "kind": "unrelated", "query": q})
        for i, q in enumerate(OUT_OF_DOMAIN, 1)
    ]
    (qs / "out_of_domain.jsonl").write_text("\n".join(ood) + "\n")
    return docs, qs


@pytest.fixture
def nomic_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(base URL …/v1, API key) of llama.cpp's server with nomic, named ALIAS."""
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python[server] (../shared/wheels)")
    gguf = model_file(NOMIC)
    key = "sk-nomic-test-0123456789"
    url, proc = start_embedding_server(gguf, alias=ALIAS, api_key=key, log=tmp_path / "ll.log")
    try:
        yield url, key
    finally:
        stop_server(proc)


def test_index_and_query_through_nomic_served_by_llama_cpp(
    tmp_path, nomic_server, monkeypatch, capsys
):
    url, key = nomic_server
    docs, qs = write_corpus(tmp_path)
    env = {
        "RAG_DOCUMENTS_DIR": str(docs),
        "RAG_EVAL_DIR": str(qs),
        "RAG_INDEX_URI": str(tmp_path / "index"),
        "RAG_WORK_DIR": str(tmp_path / "work"),
        "RAG_EMBED_URL": url,
        "RAG_EMBED_MODEL": ALIAS,
        "RAG_EMBED_API_KEY": key,
        "RAG_EMBED_WINDOW": "512",  # llama-cpp-python cuts inputs at --n_batch (512) tokens
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # issue 51: RAG_ADAPT=on with a model server: refused in one line before anything runs
    monkeypatch.setenv("RAG_ADAPT", "on")
    assert main(["index", "--quiet"]) == 1
    _, err = capsys.readouterr()
    assert err.startswith("rag-assets: error: RAG_ADAPT=on: the encoder is a model server")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "index").exists()
    # and with no RAG_ADAPT at all (auto, the default): published, exit 0, nothing trained
    monkeypatch.delenv("RAG_ADAPT")
    assert main(["index", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "adapted encoder:" not in out and "you can ask now" not in err  # no training
    assert "adaptation: auto, set at the first build on " in out
    assert "it does not apply: the encoder is a model server (RAG_EMBED_URL=" in out
    assert "check chunks_within_encoder_window: passed" in out
    assert "check recall_at_20_above_floor: passed" in out
    assert main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["adaptation"]["mode"] == "auto" and report["adaptation"]["applies"] is False
    assert report["declaration"]["notes"]["RAG_ADAPT"].startswith("it does not apply")
    assert not (tmp_path / "work" / "adapt-cache").exists()
    pub = IndexStore(tmp_path / "index").published()
    assert pub is not None and pub.stamps.model == ALIAS and pub.stamps.dims == 768
    assert pub.stamps.revision.startswith("fp-")
    assert (pub.stamps.query_prompt, pub.stamps.document_prompt) == (
        "search_query: ",
        "search_document: ",
    )
    for question, doc in [
        ("what temperature for green tea water", "tea.md"),
        ("oil the chain of my bike", "bikes.md"),
        ("go back to the previous index version", "rollback.md"),
    ]:
        assert main(["search", question, "--retriever", "dense", "-k", "1", "--json"]) == 0
        (hit,) = json.loads(capsys.readouterr().out)
        assert hit["document_id"] == doc and hit["stamps"]["revision"] == pub.stamps.revision
    assert key not in capsys.readouterr().err


def test_throughput_beside_the_same_model_in_process(tmp_path, nomic_server, monkeypatch):
    """Issue 40: ``bench.endpoint throughput --local gguf:PATH`` builds the same documents
    through the server and through the server's model in this process: the same chunks, every
    one embedded both ways, and the in-process vectors are the server's (cosine 1)."""
    import numpy as np

    from rag_assets.bench.endpoint import throughput
    from rag_assets.lib.index.endpoint import connect
    from rag_assets.settings import Settings

    url, key = nomic_server
    docs, _ = write_corpus(tmp_path)
    env = {"RAG_EMBED_URL": url, "RAG_EMBED_MODEL": ALIAS, "RAG_EMBED_API_KEY": key}
    env |= {"RAG_EMBED_WINDOW": "512", "RAG_WORK_DIR": str(tmp_path / "work")}
    settings = Settings.from_env(env)
    gguf = model_file(NOMIC)
    out, text = throughput(settings, docs, concurrency=(1,), local=f"gguf:{gguf}")
    server, local = out["rows"]
    assert server["in_flight"] == 1 and local["in_flight"] is None
    assert server["chunks"] == local["chunks"] == server["embedded"] == local["embedded"] > 0
    assert "local llama.cpp" in local["encoder"] and "local llama.cpp" in text
    # the same vectors: what the bench compares is the protocol, not another model
    from llama_cpp import Llama

    from rag_assets.lib.index.endpoint import EndpointConfig

    config = EndpointConfig.from_settings(settings)
    assert config is not None
    served = connect(config, max_age=0).encode(["Green tea wants water at eighty degrees."])
    llm = Llama(model_path=str(gguf), embedding=True, n_ctx=512, n_threads=2, verbose=False)
    raw = np.asarray(llm.embed(["search_document: Green tea wants water at eighty degrees."]))
    mine = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    assert float(served[0] @ mine[0]) > 0.999


def test_a_swapped_model_behind_the_same_name_is_stale_refused_upgraded_and_rolled_back(
    tmp_path, monkeypatch
):
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python[server] (../shared/wheels)")
    gguf = model_file(NOMIC)
    docs, qs = write_corpus(tmp_path)
    monkeypatch.delenv("RAG_EMBEDDING_MODEL", raising=False)
    out = walkthrough(docs, qs, gguf, tmp_path / "walk", query="green tea water temperature")
    steps = {s["step"].split(".")[0]: s for s in out["steps"]}
    assert "error" not in out, out
    first = steps["1"]
    assert first["success"] and first["fingerprint"].startswith("fp-")
    assert steps["2"]["top"] == "tea.md" and steps["2"]["fingerprint"] == first["fingerprint"]
    swap = steps["3"]
    assert swap["fingerprint_now"] != swap["fingerprint_before"]
    assert swap["min_probe_cosine_to_the_table"] < 0.9999  # measured ≈ 0.96
    assert steps["4"]["stale"] == ["chunk_embeddings"]
    assert steps["4"]["requested"][0] == "chunk_embeddings"
    assert "refused rather than mixed" in steps["5"]["refused"]
    upgrade = steps["6"]
    assert upgrade["success"] and upgrade["table"] != first["table"]
    assert upgrade["fingerprint"] == swap["fingerprint_now"]
    assert steps["7"]["top"] == "tea.md" and steps["7"]["fingerprint"] == upgrade["fingerprint"]
    assert steps["8"]["published"] == first["table"] and "refused" in steps["8"]
    assert steps["9"]["fingerprint"] == first["fingerprint"]  # the old model answers again
