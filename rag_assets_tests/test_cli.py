"""``rag-assets`` end to end on the sample corpus: the same entry point users run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_assets_tests.conftest import REPO, SAMPLE_DOCS, SAMPLE_EVAL


def _run(args: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "rag_assets.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"rag-assets {args} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """The sample corpus indexed through Dagster by ``rag-assets index``."""
    import shutil

    root = tmp_path_factory.mktemp("cli")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    env = {
        **os.environ,
        "RAG_DOCUMENTS_DIR": str(docs),
        "RAG_INDEX_URI": str(root / "index"),
        "RAG_WORK_DIR": str(root / "work"),
        "RAG_EVAL_DIR": str(SAMPLE_EVAL),
    }
    for var in ("RAG_RERANK_MODEL", "RAG_DISTANCE_CUT", "RAG_LLM_URL", "DAGSTER_HOME"):
        env.pop(var, None)
    proc = _run(["index", "--quiet"], env)
    return root, env, proc


def test_chunk_jsonl_offsets_are_exact_and_failures_go_to_stderr():
    proc = _run(["chunk", str(SAMPLE_DOCS), "--strategy", "E", "--jsonl"], dict(os.environ))
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows and {"document", "section", "from", "to", "content", "text", "chunk_id"} <= set(
        rows[0]
    )
    from rag_assets.lib.extract import extract_folder

    texts = {d.document_id: d.text for d in extract_folder(SAMPLE_DOCS).documents}
    for r in rows:
        assert texts[r["document"]][r["from"] : r["to"]] == r["content"]
        assert r["text"].endswith(r["content"]) and r["text"].startswith("[")
    pdf_rows = [r for r in rows if r["document"].endswith(".pdf")]
    assert pdf_rows and all(r["page"] >= 1 for r in pdf_rows)
    assert "broken-scan.pdf" in proc.stderr and "corrupt PDF" in proc.stderr


def test_chunk_table_output_for_one_file():
    proc = _run(
        ["chunk", str(SAMPLE_DOCS / "02-chunking-strategies.md"), "--strategy", "A"],
        dict(os.environ),
    )
    assert "02-chunking-strategies.md" in proc.stdout
    assert "chunk1:A:t512" in proc.stderr


def test_index_prints_the_summary_and_evaluation(indexed):
    _, _, proc = indexed
    out = proc.stdout
    assert "FAILED broken-scan.pdf" in out
    assert "| dense |" in out and "| hybrid |" in out and "refusal cut:" in out
    assert "published: chunks_all-minilm-l6-v2" in out


def test_status_json(indexed):
    _, env, _ = indexed
    st = json.loads(_run(["status", "--json"], env).stdout)
    pub = st["published"]
    assert set(pub["stamps"]) == {"model", "revision", "dims", "pipeline", "extractor"}
    assert pub["stamps"]["dims"] == 384 and pub["rows"] > 0
    assert st["documents"]["failed"][0]["document"] == "broken-scan.pdf"
    assert st["tables"][0]["published"] is True
    assert st["chunks_over_window"] == 0
    assert st["rerank"] == "rerank: no model configured"


def test_ask_json_and_table_and_refusal(indexed):
    root, env, _ = indexed
    q = json.loads((SAMPLE_EVAL / "questions.jsonl").read_text().splitlines()[0])
    out = json.loads(_run(["ask", q["queries"]["course"], "--json"], env).stdout)
    assert set(out) == {"question", "no_answer", "threshold", "citations", "prompt", "answer"}
    assert out["no_answer"] is False and out["answer"] is None
    from rag_assets.lib.extract import extract_folder

    texts = {d.document_id: d for d in extract_folder(root / "documents").documents}
    for c in out["citations"]:
        doc = texts[c["document_id"]]
        assert doc.text[c["from"] : c["to"]] == c["quote"]
        if doc.kind == "pdf":
            assert c["fragment"] == f"#page={doc.page_at(c['from'])}" == f"#page={c['page']}"
        else:  # the file itself is the canonical text: the fragment selects the quote in it
            raw = (root / "documents" / c["document_id"]).read_text(encoding="utf-8")
            assert raw[c["from"] : c["to"]] == c["quote"]
            assert c["fragment"] == f"#char={c['from']},{c['to']}"
        assert c["cosine_distance"] < out["threshold"]
    assert any(q["needle"] in c["quote"] for c in out["citations"])
    table = _run(["ask", q["queries"]["course"]], env).stdout
    assert table.startswith("[1] ") and "#char=" in table and "d=0." in table
    refused = _run(["ask", "Which wine goes best with grilled salmon?"], env).stdout
    assert refused.startswith("NO ANSWER: nothing under cosine distance")


def test_distance_cut_override(indexed):
    _, env, _ = indexed
    out = json.loads(
        _run(
            ["ask", "how are documents chunked?", "--json"], {**env, "RAG_DISTANCE_CUT": "0.01"}
        ).stdout
    )
    assert out["no_answer"] is True and out["threshold"] == 0.01


@pytest.mark.parametrize("retriever", ["dense", "bm25", "hybrid"])
def test_search_json(indexed, retriever):
    _, env, _ = indexed
    hits = json.loads(
        _run(
            ["search", "encoder window", "--retriever", retriever, "-k", "5", "--json"], env
        ).stdout
    )
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1)) and hits
    assert all(h["retriever"] == retriever and h["stamps"]["dims"] == 384 for h in hits)


def test_rerank_without_model_is_a_clear_error(indexed):
    _, env, _ = indexed
    proc = _run(["search", "x", "--retriever", "rerank"], env, check=False)
    assert proc.returncode == 1 and "rerank: no model configured" in proc.stderr


def test_eval_json_on_the_sample_set(indexed, tmp_path):
    root, env, _ = indexed
    out = json.loads(
        _run(
            [
                "eval",
                "--documents",
                str(root / "documents"),
                "--questions",
                str(SAMPLE_EVAL),
                "--retrievers",
                "dense,bm25,hybrid",
                "--cache",
                str(tmp_path / "cache"),
                "--json",
            ],
            env,
        ).stdout
    )
    assert out["strategy"] == "E" and out["needles"] == 12 and out["destroyed"] == 0
    assert set(out["retrievers"]) == {"dense", "bm25", "hybrid"}
    assert set(out["refusal"]) >= {
        "threshold",
        "answered",
        "refused_answerable",
        "bluffs",
        "out_of_domain",
    }
    assert out["paired"][0]["k"] == 4


def test_missing_model_setting_is_named(indexed):
    _, env, _ = indexed
    proc = _run(["ask", "x"], {**env, "RAG_EMBEDDING_MODEL": "org/not-downloaded"}, check=False)
    assert proc.returncode == 1 and "RAG_EMBEDDING_MODEL" in proc.stderr


def test_readme_python_example_runs(indexed):
    root, env, _ = indexed
    readme = (REPO / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace('Index.open("data/index")', f"Index.open({str(root / 'index')!r})")
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "file://" in proc.stdout
    assert Path(root / "index" / "published.json").exists()


def test_ask_with_a_local_openai_compatible_server(indexed):
    """The answer's markers map to the server's citations; invalid ones are removed."""
    import threading

    from rag_assets_tests.lib.test_generate import ChatServer

    _, env, _ = indexed
    srv = ChatServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        port = srv.server_address[1]
        env = {**env, "RAG_LLM_URL": f"http://127.0.0.1:{port}/ok", "no_proxy": "127.0.0.1"}
        env = {k: v for k, v in env.items() if k.lower() not in ("http_proxy", "https_proxy")}
        q = "How do I roll back to the previous embedding model?"
        out = json.loads(_run(["ask", q, "--json"], env).stdout)
        refused = json.loads(_run(["ask", "Best wine for salmon?", "--json"], env).stdout)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)
    assert out["answer"]["used"] and all(
        1 <= n <= len(out["citations"]) for n in out["answer"]["used"]
    )
    assert "[9]" in out["answer"]["invalid_markers"] and "[9]" not in out["answer"]["text"]
    sent = srv.requests[0]["body"]["messages"][1]["content"]
    assert out["citations"][0]["quote"] in sent
    assert refused["no_answer"] and refused["answer"] is None
    assert len(srv.requests) == 1  # the refused question never reached the model


def test_eval_beir_on_a_tiny_dataset(tmp_path):
    beir = tmp_path / "tiny-beir"
    (beir / "qrels").mkdir(parents=True)
    corpus = [
        ("d1", "Vitamin D", "Vitamin D deficiency is linked to weaker bones in older adults."),
        ("d2", "Sleep", "Short sleep duration raises the risk of obesity in children."),
        ("d3", "Coffee", "Coffee consumption was not associated with heart disease."),
        ("d4", "Exercise", "Regular aerobic exercise lowers resting blood pressure."),
    ]
    (beir / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"_id": i, "title": t, "text": x}) for i, t, x in corpus)
    )
    queries = {"q1": "does lack of vitamin D harm bone health", "q2": "exercise and blood pressure"}
    (beir / "queries.jsonl").write_text(
        "\n".join(json.dumps({"_id": k, "text": v}) for k, v in queries.items())
    )
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td4\t2\n")
    out = json.loads(
        _run(
            [
                "eval",
                "--beir",
                str(beir),
                "--retrievers",
                "dense,bm25,hybrid",
                "--cache",
                str(tmp_path / "c"),
                "--json",
            ],
            dict(os.environ),
        ).stdout
    )
    assert out["documents"] == 4 and out["queries"] == 2 and out["pipeline"] == "whole1"
    for name in ("dense", "bm25", "hybrid"):
        assert out["retrievers"][name]["ndcg@10"] == pytest.approx(1.0)
        assert out["retrievers"][name]["recall@100"] == pytest.approx(1.0)
