"""``rag-assets`` end to end on the sample corpus: the same entry point users run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_assets_tests.helpers import (
    REPO,
    SAMPLE_DOCS,
    SAMPLE_EVAL,
    cli_here,
    declare,
    index_env,
    run_cli,
)


def _run(
    args: list[str], env: dict[str, str], check: bool = True, process: bool = False
) -> subprocess.CompletedProcess:
    """``rag-assets ARGS`` through its entry point in this process, or with ``process`` as the
    process users start: the sample index is built by one, and what must reach a real
    stderr as one line (the libraries' own output included) is checked on one."""
    if process:
        return run_cli(env, *args, check=check, timeout=600)
    return cli_here(env, *args, check=check)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """The sample corpus indexed through Dagster by ``rag-assets index``."""
    import shutil

    root = tmp_path_factory.mktemp("cli")
    docs = root / "documents"
    shutil.copytree(SAMPLE_DOCS, docs)
    env = index_env(root, docs, eval_dir=SAMPLE_EVAL, dagster=False)
    proc = _run(["index", "--quiet"], env, process=True)
    return root, env, proc


@pytest.mark.slow
def test_chunk_jsonl_offsets_are_exact_and_failures_go_to_stderr():
    proc = _run(["chunk", str(SAMPLE_DOCS), "--strategy", "E", "--jsonl"], dict(os.environ))
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows and {"document", "section", "from", "to", "content", "text", "chunk_id"} <= set(
        rows[0]
    )
    from rag_assets.lib.ingest.extract import extract_folder

    texts = {d.document_id: d.text for d in extract_folder(SAMPLE_DOCS).documents}
    for r in rows:
        assert texts[r["document"]][r["from"] : r["to"]] == r["content"]
        assert r["text"].endswith(r["content"]) and r["text"].startswith("[")
    pdf_rows = [r for r in rows if r["document"].endswith(".pdf")]
    assert pdf_rows and all(r["page"] >= 1 for r in pdf_rows)
    assert "broken-scan.pdf" in proc.stderr and "corrupt PDF" in proc.stderr


@pytest.mark.slow
def test_chunk_table_output_for_one_file():
    proc = _run(
        ["chunk", str(SAMPLE_DOCS / "02-chunking-strategies.md"), "--strategy", "A"],
        dict(os.environ),
    )
    assert "02-chunking-strategies.md" in proc.stdout
    assert "chunk1:A:t512" in proc.stderr


@pytest.mark.slow
def test_index_prints_the_summary_and_evaluation(indexed):
    _, _, proc = indexed
    out = proc.stdout
    assert "FAILED broken-scan.pdf" in out
    assert "| dense |" in out and "| hybrid |" in out and "refusal cut:" in out
    assert "published: chunks_all-minilm-l6-v2" in out
    # issue 39: a first index's table is version 1 (not LanceDB's count of its commits)
    published = next(ln for ln in out.splitlines() if ln.startswith("published: "))
    assert " version 1 (" in published and "a new table chunks_" in out
    assert "at version" not in out


@pytest.mark.slow
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
    # issue 39: the index's own version beside LanceDB's (the table version queries pin)
    assert pub["index_version"] == 1 and pub["version"] == st["rollback_stack"][0]["version"]
    text = _run(["status"], env).stdout
    assert f"published: {pub['table']} version 1  rows=" in text


@pytest.mark.slow
def test_ask_json_and_table_and_refusal(indexed):
    root, env, _ = indexed
    q = json.loads((SAMPLE_EVAL / "questions.jsonl").read_text().splitlines()[0])
    out = json.loads(_run(["ask", q["queries"]["course"], "--json"], env).stdout)
    # (other issues add fields: the published version, the refusal's reason)
    assert set(out) >= {"question", "no_answer", "threshold", "citations", "prompt", "answer"}
    assert out["no_answer"] is False and out["answer"] is None
    from rag_assets.lib.ingest.extract import extract_folder
    from rag_assets.lib.query.plain import VIEWER_FRAGMENTS

    texts = {d.document_id: d for d in extract_folder(root / "documents").documents}

    def doc_text(document_id: str) -> str:
        return texts[document_id].text

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
    assert table.startswith("[1] ") and "d=0." in table
    lines = table.splitlines()  # each source line is followed by its span, whole, on one line
    assert len(lines) == 2 * len(out["citations"])
    pairs = list(zip(lines[::2], lines[1::2], strict=True))
    for c, (head, quoted) in zip(out["citations"], pairs, strict=True):
        assert head.startswith(f"[{c['index']}] {c['document_name']}  ")
        # issue 31: where to open it: path:LINE of the span (text), path#page=N (issue 39: one
        # shape, relative to the working directory)
        path = os.path.relpath(root / "documents" / c["document_id"])
        kept = c["fragment"] if c["fragment"].startswith(VIEWER_FRAGMENTS) else ""
        where = f"{path}{kept}" if c["line"] is None else f"{path}:{c['line']}"
        assert f"  {where}  d=" in head
        span = c["span"]  # issue 21: the sentence(s) that answer, never cut mid-word
        assert quoted == f'    {span["label"]}  "{" ".join(span["text"].split())}"'
        assert c["from"] <= span["from"] < span["to"] <= c["to"]
        assert doc_text(c["document_id"])[span["from"] : span["to"]] == span["text"]
    refused = _run(["ask", "Which wine goes best with grilled salmon?"], env).stdout
    assert refused.startswith("NO ANSWER: nothing under cosine distance")


@pytest.mark.slow
def test_distance_cut_override(indexed):
    _, env, _ = indexed
    out = json.loads(
        _run(
            ["ask", "how are documents chunked?", "--json"], {**env, "RAG_DISTANCE_CUT": "0.01"}
        ).stdout
    )
    assert out["no_answer"] is True and out["threshold"] == 0.01


@pytest.mark.slow
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


@pytest.mark.slow
def test_rerank_without_model_is_a_clear_error(indexed):
    _, env, _ = indexed
    proc = _run(["search", "x", "--retriever", "rerank"], env, check=False)
    assert proc.returncode == 1 and "rerank: no model configured" in proc.stderr


@pytest.mark.slow
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


@pytest.mark.slow
def test_missing_model_setting_is_named(indexed, tmp_path):
    import shutil

    root, env, _ = indexed
    # issue 51: the index declares its model: another one in this environment is not taken
    proc = _run(["ask", "x"], {**env, "RAG_EMBEDDING_MODEL": "org/not-downloaded"}, check=False)
    assert proc.returncode == 0
    assert "rag-assets: note: not taken: RAG_EMBEDDING_MODEL='org/not-downloaded'" in proc.stderr
    copy = tmp_path / "index"  # an index that declares a model this machine does not have
    shutil.copytree(root / "index", copy)
    declare(copy, embedding_model="org/not-downloaded")
    proc = _run(["ask", "x", "--index", str(copy)], env, check=False)
    assert proc.returncode == 1 and "RAG_EMBEDDING_MODEL" in proc.stderr


@pytest.mark.slow
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


@pytest.mark.slow
def test_ask_with_a_local_openai_compatible_server(indexed):
    """The answer's markers map to the server's citations; invalid ones are removed."""
    import threading

    from rag_assets_tests.lib.query.test_generate import ChatServer

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
    # issue 21: the spans of the chunks the answer cites are chosen by its claims
    for c in out["citations"]:
        assert c["span"]["chosen_by"] == (
            "answer" if c["index"] in out["answer"]["used"] else "question"
        )
    sent = srv.requests[0]["body"]["messages"][1]["content"]
    assert out["citations"][0]["quote"] in sent
    assert refused["no_answer"] and refused["answer"] is None
    assert len(srv.requests) == 1  # the refused question never reached the model


@pytest.mark.slow
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


# -- usage checks and one-line errors (issue 11) ----------------------------------------------
def _main(argv: list[str], capsys) -> tuple[int, str, str]:
    from rag_assets.cli import main

    try:
        code = main(argv)
    except SystemExit as e:  # argparse usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["ask", "search"])
@pytest.mark.parametrize("question", ["", "   ", "\t\n "])
def test_blank_question_is_a_usage_error_before_opening_anything(
    command, question, tmp_path, capsys, monkeypatch
):
    # an index that does not exist and a model that does not exist: opening either would fail
    # with exit status 1, so status 2 and the message show nothing was opened or loaded
    monkeypatch.setenv("RAG_EMBEDDING_MODEL", str(tmp_path / "no-model"))
    code, out, err = _main([command, question, "--index", str(tmp_path / "none")], capsys)
    assert code == 2 and out == ""
    assert f"rag-assets {command}: error: argument" in err and "question is empty" in err
    assert "no-model" not in err and "published" not in err


@pytest.mark.parametrize("command", ["index", "eval", "bench"])
def test_missing_or_empty_documents_folder_is_one_line_naming_the_flag(command, tmp_path, capsys):
    missing, empty = tmp_path / "missing", tmp_path / "empty"
    (empty / ".git").mkdir(parents=True)  # hidden entries do not count as documents
    (empty / ".notes.md").write_text("hidden")
    extra = ["--index", str(tmp_path / "index")] if command == "index" else []
    for folder, cause in ((missing, "not found"), (empty, "is empty")):
        code, out, err = _main([command, "--documents", str(folder), *extra], capsys)
        assert code == 1 and out == ""
        assert err.count("\n") == 1 and err.startswith("rag-assets: error: documents folder")
        assert cause in err and str(folder) in err
        assert "--documents" in err and "RAG_DOCUMENTS_DIR" in err
    assert not (tmp_path / "index").exists()  # nothing was started


def test_documents_folder_setting_is_checked_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAG_DOCUMENTS_DIR", str(tmp_path / "gone"))
    code, _, err = _main(["index", "--index", str(tmp_path / "index")], capsys)
    assert code == 1 and "documents folder not found" in err and str(tmp_path / "gone") in err


@pytest.mark.parametrize("command", ["status", "ask", "search", "rollback", "index"])
def test_index_path_that_is_a_file_is_one_line_naming_the_flag(command, tmp_path, capsys):
    afile = tmp_path / "index"
    afile.write_text("not an index")
    words = ["a question"] if command in ("ask", "search") else []
    code, out, err = _main([command, *words, "--index", str(afile)], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "index directory is a file" in err and "--index" in err and "RAG_INDEX_URI" in err
    assert afile.read_text() == "not an index"


def test_chunk_missing_path_and_empty_folder(tmp_path, capsys):
    code, out, err = _main(["chunk", str(tmp_path / "missing")], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1 and "no such file or folder" in err
    (tmp_path / "empty").mkdir()
    code, out, err = _main(["chunk", str(tmp_path / "empty")], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1 and "no documents under" in err


def test_error_lines_name_the_cause_and_what_to_change():
    import argparse

    from rag_assets.cli import CliError, _error_line

    args = argparse.Namespace(index="/srv/idx")
    err = FileExistsError(17, "File exists", "/srv/idx/bm25")
    assert _error_line(err, args) == (
        "File exists: /srv/idx/bm25 (the index directory: check --index or RAG_INDEX_URI)"
    )
    named = RuntimeError("RAG_EMBEDDING_MODEL='x' is not a local\n  model directory")
    assert _error_line(named, args) == "RAG_EMBEDDING_MODEL='x' is not a local model directory"
    assert _error_line(CliError("no such file: a (check the paths)"), args).endswith("paths)")
    assert _error_line(KeyError("table"), args) == (
        "KeyError: 'table' (RAG_DEBUG=1 shows the traceback)"  # unexpected: the type is named
    )


def test_rag_debug_keeps_the_traceback(tmp_path, capsys, monkeypatch):
    from rag_assets.cli import CliError, main

    monkeypatch.setenv("RAG_DEBUG", "1")
    with pytest.raises(CliError, match="documents folder not found"):
        main(["index", "--documents", str(tmp_path / "missing")])


def test_warnings_print_as_one_line(capsys):
    import warnings

    from rag_assets.cli import _warning_line

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _warning_line
        warnings.warn("published.json is damaged\n  (not valid JSON)", RuntimeWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert err == "rag-assets: warning: published.json is damaged (not valid JSON)\n"


def test_readme_command_lines_name_real_subcommands_and_flags():
    """Every ``rag-assets …`` line of the README's bash blocks parses: the subcommand and each
    ``--flag`` on it exist (placeholders and ``[optional]`` brackets aside)."""
    import argparse
    import re

    from rag_assets.cli import _parser

    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    lines = [ln.split("#")[0] for b in blocks for ln in b.splitlines()]
    commands = [ln.split() for ln in lines if ln.strip().startswith("rag-assets ")]
    assert len(commands) >= 8
    for words in commands:
        sub = subs.choices.get(words[1])
        assert sub is not None, f"README: `rag-assets {words[1]}` is not a command"
        options = {o for a in sub._actions for o in a.option_strings}
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        if nested and len(words) > 2 and words[2] in nested[0].choices:  # `token add --groups`
            options |= {o for a in nested[0].choices[words[2]]._actions for o in a.option_strings}
        for flag in re.findall(r"(?<![\w-])--?[a-z][\w-]*", " ".join(words[2:])):
            assert flag in options, f"README: `rag-assets {words[1]} {flag}` is not an option"


@pytest.mark.slow
def test_chunk_into_a_closed_pipe_exits_quietly():
    """``rag-assets chunk … --jsonl | head -1``: no traceback, SIGPIPE's status (141)."""
    cmd = [sys.executable, "-m", "rag_assets.cli", "chunk", *[str(SAMPLE_DOCS)] * 3, "--jsonl"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ)
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line: > 64 KiB are still to come
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141
    assert json.loads(first)["chunk_id"]
    assert "Traceback" not in err and "BrokenPipe" not in err and "Broken pipe" not in err
    assert all(line.startswith("FAILED broken-scan.pdf") for line in err.splitlines())


@pytest.mark.slow
def test_index_of_a_missing_folder_prints_one_line(tmp_path):
    env = {**os.environ, "RAG_WORK_DIR": str(tmp_path / "work")}
    proc = _run(
        ["index", "--documents", str(tmp_path / "nope"), "--index", str(tmp_path / "i")],
        env,
        check=False,
        process=True,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        f"rag-assets: error: documents folder not found: {tmp_path / 'nope'} "
        "(pass --documents DIR or set RAG_DOCUMENTS_DIR)\n"
    )


@pytest.mark.slow
def test_search_table_keeps_whole_document_names(indexed):
    root, env, _ = indexed
    args = ["search", "reciprocal rank fusion", "--retriever", "bm25", "-k", "3"]
    rows = _run(args, env).stdout.splitlines()
    heads, quotes = rows[::2], rows[1::2]
    assert len(heads) == 3 and any("04-retrieval-refusal-citations.md " in r for r in heads)
    # issue 31: where to open each hit, and under it a line of its quote (the best sentence)
    from rag_assets.lib.query.plain import QUOTE_WIDTH, VIEWER_FRAGMENTS, shorten

    hits = json.loads(_run([*args, "--json"], env).stdout)
    for head, quote, hit in zip(heads, quotes, hits, strict=True):
        path = os.path.relpath(root / "documents" / hit["document_id"])  # issue 39: one shape
        kept = hit["fragment"] if hit["fragment"].startswith(VIEWER_FRAGMENTS) else ""
        where = f"{path}{kept}" if hit["line"] is None else f"{path}:{hit['line']}"
        assert head.endswith(f" {where}")
        assert quote == f'    "{shorten(hit["span"]["text"], QUOTE_WIDTH)}"'


@pytest.mark.slow
def test_damaged_pointer_and_wrong_model_print_one_line(indexed, tmp_path):
    import shutil

    root, env, _ = indexed
    damaged = tmp_path / "index"
    shutil.copytree(root / "index", damaged)
    (damaged / "published.json").write_text('{"table": "x", ')
    wrong = tmp_path / "wrong-model"  # issue 51: a declared model this machine does not have
    shutil.copytree(root / "index", wrong)
    declare(wrong, embedding_model=str(tmp_path / "nope"))
    for args, extra in (
        (["status", "--index", str(damaged)], {}),
        (["ask", "how are documents chunked?", "--index", str(damaged)], {}),
        (["ask", "how are documents chunked?", "--index", str(wrong)], {"model": "wrong"}),
    ):
        proc = _run(args, env, check=False, process=True)
        # the one `note:` that answers need RAG_LLM_URL (issue 20) is not a problem line
        lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("rag-assets: note:")]
        assert "Traceback" not in proc.stderr and len(lines) <= 1, proc.stderr
        assert all(ln.startswith("rag-assets: ") for ln in lines), proc.stderr
        if extra:
            assert proc.returncode == 1 and "RAG_EMBEDDING_MODEL" in proc.stderr
        else:  # recovered from the history with a warning, or refused naming the file
            assert "published.json" in proc.stderr


@pytest.mark.slow
def test_questions_check_and_the_index_checks_the_set_before_any_work(tmp_path):
    """Issue 31: ``questions --check`` names every problem; ``index`` runs the same check first
    and stops on a bad row before anything is written (no index, no work folder, no run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "DAGSTER_HOME"))}
    env["RAG_ADAPT"] = "off"  # the tests' default (conftest)
    ok = _run(["questions", "--check", str(SAMPLE_EVAL), "--documents", str(SAMPLE_DOCS)], env)
    assert (
        ok.stdout == f"{SAMPLE_EVAL}: 12 questions, 22 out-of-domain queries; every needle found\n"
    )
    bad = tmp_path / "eval"
    bad.mkdir()
    rows = [json.loads(x) for x in (SAMPLE_EVAL / "questions.jsonl").read_text().splitlines()]
    del rows[4]["queries"]["ticket"]
    rows[2]["needle"] = rows[2]["needle"].replace(" ever ", " ")
    (bad / "questions.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    checked = _run(["questions", "--check", str(bad), "--documents", str(SAMPLE_DOCS)], env, False)
    assert checked.returncode == 1
    out = checked.stdout.splitlines()
    missing = "needle not found byte for byte in 02-chunking-strategies.md"
    assert out[0] == f"{bad}/questions.jsonl:3: s03: {missing}"
    assert out[2].startswith(
        '    nearest: "Level-2 headings open sections, and no chunk ever crosses'
    )
    assert f"{bad}/questions.jsonl:5: s05: missing field 'queries.ticket'" in out
    assert out[-1] == f"{bad}: 1 bad row(s): the set cannot be used until they are fixed"
    run_env = {
        **env,
        "RAG_EVAL_DIR": str(bad),
        "RAG_INDEX_URI": str(tmp_path / "index"),
        "RAG_WORK_DIR": str(tmp_path / "work"),
    }
    proc = _run(["index", "--documents", str(SAMPLE_DOCS)], run_env, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        f"rag-assets: error: question set {bad} (RAG_EVAL_DIR): {bad}/questions.jsonl:5: s05: "
        "missing field 'queries.ticket': fix the rows (`rag-assets questions --check "
        f"{bad}` lists them all) or point RAG_EVAL_DIR elsewhere\n"
    )
    assert not (tmp_path / "index").exists() and not (tmp_path / "work").exists()


def test_the_index_pre_check_warns_for_each_dropped_question(tmp_path, capsys):
    """Issue 31: needles the evaluation will drop are named before the run starts, with their
    nearest text; a set for other documents is one note; a good set says nothing."""
    from dataclasses import replace

    from rag_assets.commands.index import _precheck_questions
    from rag_assets.settings import Settings

    folder = tmp_path / "eval"
    folder.mkdir()
    rows = [json.loads(x) for x in (SAMPLE_EVAL / "questions.jsonl").read_text().splitlines()]
    rows[6]["needle"] = rows[6]["needle"].replace("A cross-encoder", "A cross\u2011encoder")
    (folder / "questions.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    settings = replace(Settings(), eval_dir=str(folder), documents_dir=str(SAMPLE_DOCS))
    _precheck_questions(settings)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"rag-assets: warning: {folder}/questions.jsonl:7: s07: needle not found byte for byte "
        "in 04-retrieval-refusal-citations.md (dropped from the evaluation)"
    )
    assert err[2].startswith('      nearest: "A cross-encoder can reorder the fused top 25')
    assert err[3].endswith("needle has '\\u2011encoder can', the document '-encoder can'")
    _precheck_questions(replace(settings, eval_dir=str(SAMPLE_EVAL)))
    assert capsys.readouterr().err == ""
    other = tmp_path / "docs"
    other.mkdir()
    (other / "a.md").write_text("# A\n\nSomething else entirely.\n")
    _precheck_questions(replace(settings, eval_dir=str(SAMPLE_EVAL), documents_dir=str(other)))
    assert capsys.readouterr().err == (
        f"rag-assets: note: {SAMPLE_EVAL}: 12 of 12 needles are not in these documents: the set "
        "belongs to another corpus and is not used (RAG_EVAL_DIR)\n"
    )
