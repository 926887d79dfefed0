"""Issue 41 end to end on the real graph: one sources file with an S3 prefix, a Git repository
and a website indexed into one index; one edit in each is all the next run re-embeds; the
citation of each opens the original; a website gone fails alone and loses no document."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rag_assets.serve.access import FAILED_REASON
from rag_assets_tests.helpers import (
    bearer,
    cli_here,
    index_env,
    line_starting,
    start_server,
    stop_process,
)
from rag_assets_tests.source_servers import Site, commit_files, s3_client, website

PAGE = "The {} page explains how the {} service is restarted after a failed deploy."


def test_a_bucket_a_repository_and_a_website_in_one_index(tmp_path: Path, s3_env):
    s3 = s3_client(s3_env)
    prefix = f"graph-{tmp_path.name}"
    billing = b"# Billing\n\nInvoices are issued on the first working day of the month.\n"
    s3.put_object(Bucket="rag", Key=f"{prefix}/billing.md", Body=billing)
    refunds = "# Refunds\n\nA refund takes {} working days to reach the card.\n"
    s3.put_object(Bucket="rag", Key=f"{prefix}/refunds.md", Body=refunds.format("five").encode())
    # issue 49: a 300-character key, a folder marker (no document), an object that fails alone
    long_key = "archive/" + "k" * 292 + ".md"
    s3.put_object(Bucket="rag", Key=f"{prefix}/{long_key}", Body=b"# Old\n\nArchived notes.\n")
    s3.put_object(Bucket="rag", Key=f"{prefix}/archive/", Body=b"")
    s3.put_object(Bucket="rag", Key=f"{prefix}/broken.pdf", Body=b"%PDF-1.4 not a real PDF")
    repo = tmp_path / "repo"
    rollback = "# Rollback\n\nRun deploy --previous to roll back.\n\nThen watch the error rate.\n"
    adr = "# ADR 1\n\nWe keep one index per {}.\n"
    deep = "/".join(["d" * 99, "e" * 99, "f" * 99]) + ".md"  # 300 characters
    latin = os.fsdecode(b"caf\xe9.md")  # not UTF-8
    files = {"runbooks/rollback.md": rollback, "adr/0001.md": adr.format("team")}
    files |= {deep: "# Deep\n\nA deep file.\n", latin: "# Cafe\n\nA Latin-1 name.\n"}
    commit_files(repo, files, "go")
    site = Site()
    with website(site):
        site.pages["/robots.txt"] = ("text/plain", b"User-agent: *\nDisallow: /admin\n")
        links = ("/status", "/admin", "/my notes.html")  # issue 49: a space in a link
        site.html("/", "Home", PAGE.format("home", "gateway"), links)
        site.html("/status", "Status", PAGE.format("status", "queue"))
        site.html("/my%20notes.html", "Notes", PAGE.format("notes", "billing"))
        sources = tmp_path / "sources.toml"
        sources.write_text(
            f'[[source]]\nname = "bucket"\nlocation = "s3://rag/{prefix}"\n'
            'metadata = { access = "finance" }\n\n'
            f'[[source]]\nname = "repo"\nlocation = "git+file://{repo}@main"\n'
            'link = "https://git.example/team/repo/blob/{commit}/{path}#L{line}"\n\n'
            f'[[source]]\nname = "site"\nlocation = "{site.url}/"\nrate = 100\n'
        )
        env = index_env(tmp_path, tmp_path / "no-folder", RAG_SOURCES=str(sources), **s3_env)
        first = cli_here(env, "index").stdout  # exit 0: a failed document is not a failed source
        assert f"sources file: {sources} (strategy" in first  # issue 49: not `folder:`
        assert "source bucket: 4 listed, 4 read" in first
        assert "source repo: 4 listed, 4 read" in first
        assert "source site: 3 listed, 3 read" in first
        assert "note: 1 page disallowed by robots.txt" in first  # issue 49: notes in the summary
        assert "FAILED bucket/broken.pdf" in first and "FAILED repo/" not in first
        # one crawl a run: the extraction takes the listing its run's observation kept
        assert sorted(p for p, _ in site.requests) == [
            "/",
            "/my%20notes.html",
            "/robots.txt",
            "/status",
        ]

        s3.put_object(Bucket="rag", Key=f"{prefix}/refunds.md", Body=refunds.format("3").encode())
        commit_files(repo, {"adr/0001.md": adr.format("company")}, "edit")
        site.html("/status", "Status", PAGE.format("status", "scheduler"))
        site.requests.clear()
        second = cli_here(env, "index").stdout
        assert sorted(site.requests) == [
            ("/", 304),
            ("/my%20notes.html", 304),
            ("/robots.txt", 200),
            ("/status", 200),
        ]
        # the failed object is read again on each run
        assert "source bucket: 4 listed, 2 read, 2 unchanged, 0 deleted" in second
        assert "source repo: 4 listed, 1 read, 3 unchanged, 0 deleted" in second
        assert "source site: 3 listed, 1 read, 2 unchanged, 0 deleted" in second
        chunks = line_starting(second, "chunks:")
        assert "3 documents changed: 3 chunks re-embedded" in chunks, second

        hits = json.loads(cli_here(env, "search", "roll back with deploy --previous",
                                   "--json").stdout)  # fmt: skip
        top = hits[0] if isinstance(hits, list) else hits["hits"][0]
        assert top["document_id"] == "repo/runbooks/rollback.md"
        assert top["url"].startswith("https://git.example/team/repo/blob/")
        assert top["url"].endswith("/runbooks/rollback.md#L3")

        found = json.loads(cli_here(env, "search", "deep file Latin-1 archived notes billing",
                                    "--json", "-k", "20").stdout)  # fmt: skip
        rows = found if isinstance(found, list) else found["hits"]
        ids = {r["document_id"] for r in rows}
        for doc in ("repo/caf\\xe9.md", f"repo/{deep}", f"bucket/{long_key}", "site/my notes.html"):
            assert doc in ids, doc

    # the website gone: that source fails alone, its documents stay published, and the command
    # exits 3 (issue 49: cron and CI notice)
    ran = cli_here(env, "index", check=False)
    third = ran.stdout
    assert ran.returncode == 3 and "1 source(s) FAILED" in ran.stderr, ran.stderr
    assert "source site: FAILED" in third and "its documents are kept" in third
    assert "source repo: 4 listed, 0 read, 4 unchanged" in third
    status = cli_here(env, "status").stdout
    assert "source site (web " in status and "STALE since" in status
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in third + status
    found = json.loads(cli_here(env, "search", "scheduler restarted", "--json").stdout)
    rows = found if isinstance(found, list) else found["hits"]
    assert rows[0]["document_id"] == "site/status" and rows[0]["url"].startswith(site.url)
    # issue 49: a failed document's reason is the administrator's: the bucket's group sees the
    # document failed, not why (the object store's words, the bucket's name)
    report = json.loads(cli_here(env, "status", "--json").stdout)
    reasons = {r["document"]: r["reason"] for r in report["documents"]["failed"]}
    assert "PDF" in reasons["bucket/broken.pdf"] or "pdf" in reasons["bucket/broken.pdf"]
    # over HTTP, from the real service: a token of the bucket's group, and the administrator
    fin = cli_here(env, "token", "add", "fin", "--groups", "finance").stdout.strip()
    url, proc = start_server(Path(env["RAG_INDEX_URI"]), env | {"RAG_API_TOKEN": ADMIN},
                             tmp_path / "serve.log")  # fmt: skip
    try:
        got = bearer(url, fin, "GET", "/status")
        admin = bearer(url, ADMIN, "GET", "/status").json()
        doc = bearer(url, fin, "GET", "/documents/bucket/broken.pdf")
    finally:
        stop_process(proc)
    assert got.status_code == 200, got.text
    shown = got.json()
    assert shown["documents"]["failed"] == [{"document": "bucket/broken.pdf",
                                             "reason": FAILED_REASON}]  # fmt: skip
    listed = {r["document"]: r for r in shown["documents"]["list"]}
    assert listed["bucket/broken.pdf"]["reason"] == FAILED_REASON
    assert prefix not in got.text
    assert reasons["bucket/broken.pdf"] not in got.text + doc.text  # nor on the document route
    admin_reasons = {r["document"]: r["reason"] for r in admin["documents"]["failed"]}
    assert admin_reasons["bucket/broken.pdf"] == reasons["bucket/broken.pdf"]


ADMIN = "admin-token-49"


@pytest.mark.slow  # two real models, a batch run in its own process
def test_a_model_upgrade_backfill_over_sources_cites_them(tmp_path: Path, second_model_dir):
    """An index built from a sources file (a Git repository and a folder) upgraded to another
    model by `rag-assets backfill` (plan, one batch run, index_job): the sources are read
    as in an index run (nothing re-read: unchanged), the new model's table is published, and
    its citations open the originals (the Git file at its commit and line, the file)."""
    repo = tmp_path / "repo"
    rollback = "# Rollback\n\nRun deploy --previous to roll back.\n\nThen watch the error rate.\n"
    commit = commit_files(repo, {"runbooks/rollback.md": rollback}, "go")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "billing.md").write_text("# Billing\n\nInvoices go out monthly.\n")
    sources = tmp_path / "sources.toml"
    sources.write_text(
        f'[[source]]\nname = "repo"\nlocation = "git+file://{repo}@main"\n'
        'link = "https://git.example/team/repo/blob/{commit}/{path}#L{line}"\n\n'
        '[[source]]\nname = "notes"\nlocation = "notes"\n'
    )
    env = index_env(tmp_path, tmp_path / "no-folder", RAG_SOURCES=str(sources))
    first = cli_here(env, "index").stdout
    assert "source repo: 1 listed, 1 read" in first and "source notes: 1 listed, 1 read" in first
    before = json.loads(cli_here(env, "status", "--json").stdout)

    upgraded = env | {"RAG_EMBEDDING_MODEL": str(second_model_dir)}
    # the batch runs launched at once, each in a process of its own (no queue, no daemon)
    (Path(env["DAGSTER_HOME"]) / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n"
        "telemetry:\n  enabled: false\n"
    )
    out = cli_here(upgraded, "backfill").stdout
    assert "1 batches" in out and "1 to embed" in out, out
    assert "source repo: 1 listed, 0 read, 1 unchanged, 0 deleted" in out, out
    assert "source notes: 1 listed, 0 read, 1 unchanged, 0 deleted" in out, out
    after = json.loads(cli_here(upgraded, "status", "--json").stdout)
    assert after["published"]["table"] != before["published"]["table"]

    found = json.loads(cli_here(upgraded, "search", "roll back with deploy --previous",
                                "--json").stdout)  # fmt: skip
    rows = found if isinstance(found, list) else found["hits"]
    assert rows[0]["document_id"] == "repo/runbooks/rollback.md"
    assert rows[0]["url"] == f"https://git.example/team/repo/blob/{commit}/runbooks/rollback.md#L3"
    billing = json.loads(cli_here(upgraded, "search", "when do invoices go out", "--json").stdout)
    rows = billing if isinstance(billing, list) else billing["hits"]
    assert rows[0]["document_id"] == "notes/billing.md"
    assert rows[0]["url"].startswith(f"file://{tmp_path}/notes/billing.md#char=")
