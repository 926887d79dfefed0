"""Issue 41 end to end on the real graph: one sources file with an S3 prefix, a Git repository
and a website indexed into one index; one edit in each is all the next run re-embeds; the
citation of each opens the original; a website gone fails alone and loses no document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_assets_tests.helpers import cli_here, index_env, line_starting
from rag_assets_tests.source_servers import Site, commit_files, s3_client, website

PAGE = "The {} page explains how the {} service is restarted after a failed deploy."


def test_a_bucket_a_repository_and_a_website_in_one_index(tmp_path: Path, s3_env):
    s3 = s3_client(s3_env)
    prefix = f"graph-{tmp_path.name}"
    billing = b"# Billing\n\nInvoices are issued on the first working day of the month.\n"
    s3.put_object(Bucket="rag", Key=f"{prefix}/billing.md", Body=billing)
    refunds = "# Refunds\n\nA refund takes {} working days to reach the card.\n"
    s3.put_object(Bucket="rag", Key=f"{prefix}/refunds.md", Body=refunds.format("five").encode())
    repo = tmp_path / "repo"
    rollback = "# Rollback\n\nRun deploy --previous to roll back.\n\nThen watch the error rate.\n"
    adr = "# ADR 1\n\nWe keep one index per {}.\n"
    commit_files(repo, {"runbooks/rollback.md": rollback, "adr/0001.md": adr.format("team")}, "go")
    site = Site()
    with website(site):
        site.pages["/robots.txt"] = ("text/plain", b"User-agent: *\nDisallow: /admin\n")
        site.html("/", "Home", PAGE.format("home", "gateway"), ("/status", "/admin"))
        site.html("/status", "Status", PAGE.format("status", "queue"))
        sources = tmp_path / "sources.toml"
        sources.write_text(
            f'[[source]]\nname = "bucket"\nlocation = "s3://rag/{prefix}"\n'
            'metadata = { access = "finance" }\n\n'
            f'[[source]]\nname = "repo"\nlocation = "git+file://{repo}@main"\n'
            'link = "https://git.example/team/repo/blob/{commit}/{path}#L{line}"\n\n'
            f'[[source]]\nname = "site"\nlocation = "{site.url}/"\nrate = 100\n'
        )
        env = index_env(tmp_path, tmp_path / "no-folder", RAG_SOURCES=str(sources), **s3_env)
        first = cli_here(env, "index").stdout
        assert "source bucket: 2 listed, 2 read" in first
        assert "source repo: 2 listed, 2 read" in first
        assert "source site: 2 listed, 2 read" in first
        # one crawl a run: the extraction takes the listing its run's observation kept
        assert sorted(p for p, _ in site.requests) == ["/", "/robots.txt", "/status"]

        s3.put_object(Bucket="rag", Key=f"{prefix}/refunds.md", Body=refunds.format("3").encode())
        commit_files(repo, {"adr/0001.md": adr.format("company")}, "edit")
        site.html("/status", "Status", PAGE.format("status", "scheduler"))
        site.requests.clear()
        second = cli_here(env, "index").stdout
        assert sorted(site.requests) == [("/", 304), ("/robots.txt", 200), ("/status", 200)]
        for name in ("bucket", "repo", "site"):
            assert f"source {name}: 2 listed, 1 read, 1 unchanged, 0 deleted" in second
        chunks = line_starting(second, "chunks:")
        assert "3 documents changed: 3 chunks re-embedded" in chunks, second

        hits = json.loads(cli_here(env, "search", "roll back with deploy --previous",
                                   "--json").stdout)  # fmt: skip
        top = hits[0] if isinstance(hits, list) else hits["hits"][0]
        assert top["document_id"] == "repo/runbooks/rollback.md"
        assert top["url"].startswith("https://git.example/team/repo/blob/")
        assert top["url"].endswith("/runbooks/rollback.md#L3")

    # the website gone: that source fails alone, its documents stay published
    third = cli_here(env, "index").stdout
    assert "source site: FAILED" in third and "its documents are kept" in third
    assert "source repo: 2 listed, 0 read, 2 unchanged" in third
    status = cli_here(env, "status").stdout
    assert "source site (web " in status and "STALE since" in status
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in third + status
    found = json.loads(cli_here(env, "search", "scheduler restarted", "--json").stdout)
    rows = found if isinstance(found, list) else found["hits"]
    assert rows[0]["document_id"] == "site/status" and rows[0]["url"].startswith(site.url)


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
