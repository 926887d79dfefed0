"""Sources (issue 41), the Dagster-free layer: a Git repository, a website, an S3 prefix and a
folder listed and extracted; a change re-reads exactly the changed items; a deletion goes; a
source that does not answer keeps its documents and says why; limits name themselves."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rag_assets.lib.ingest.sources import SourceError
from rag_assets.lib.ingest.sources.config import (
    Limits,
    SourceSpec,
    documents_label,
    load_sources,
    single,
    source_specs,
)
from rag_assets.lib.ingest.sources.state import load_state, source_lines
from rag_assets.lib.ingest.sources.sync import extract_sources, list_source
from rag_assets_tests.source_servers import (
    Site,
    commit_files,
    git,
    s3_client,
    small_pdf,
    website,
)


def _run(specs, previous, work, **kw):
    out = extract_sources(specs, {d.document_id: d for d in previous}, work, **kw)
    return out, {r.name: r for r in out.sources}


def _ids(docs):
    return sorted(d.document_id for d in docs if d.ok)


def test_git_commits_add_edit_rename_delete_and_force_push(tmp_path: Path):
    repo = tmp_path / "repo"
    first = commit_files(repo, {"a.md": "# A\n\nalpha text\n", "b.md": "# B\n\nbeta\n",
                                "c.md": "# C\n\ngamma\n"}, "add")  # fmt: skip
    spec = SourceSpec("docs", f"git+file://{repo}@main", "git",
                      link="https://git.example/r/blob/{commit}/{path}#L{line}")  # fmt: skip
    out, rep = _run([spec], [], tmp_path / "work")
    assert _ids(out.documents) == ["docs/a.md", "docs/b.md", "docs/c.md"]
    assert rep["docs"].read == 3 and rep["docs"].state == first
    a = next(d for d in out.documents if d.document_id == "docs/a.md")
    assert a.metadata["commit"] == [first] and a.metadata["source"] == ["docs"]
    assert a.path == f"https://git.example/r/blob/{first}/a.md#L{{line}}"

    git(repo, "mv", "c.md", "renamed.md")
    (repo / "a.md").write_text("# A\n\nalpha text, edited\n")
    git(repo, "add", "a.md")
    second = commit_files(repo, {"b.md": None}, "edit, rename, delete")
    out2, rep = _run([spec], out.documents, tmp_path / "work", max_delete_share=1.0)
    assert _ids(out2.documents) == ["docs/a.md", "docs/renamed.md"]
    assert (rep["docs"].read, rep["docs"].reused, rep["docs"].deleted) == (2, 0, 2)
    assert "1 deleted" in rep["docs"].notes[0] and "1 renamed" in rep["docs"].notes[0]
    assert rep["docs"].state == second

    # a force-push: main rewritten from the first commit; the old tip is not in its history
    git(repo, "reset", "-q", "--hard", first)
    third = commit_files(repo, {"d.md": "# D\n\ndelta\n"}, "rewritten")
    out3, rep = _run([spec], out2.documents, tmp_path / "work", max_delete_share=1.0)
    assert "force-push" in rep["docs"].notes[0]
    assert _ids(out3.documents) == ["docs/a.md", "docs/b.md", "docs/c.md", "docs/d.md"]
    assert rep["docs"].state == third and rep["docs"].read == 4  # a.md is the old text again

    # the branch deleted: the source fails alone, its documents kept, stale since now
    git(repo, "checkout", "-q", "-b", "other")
    git(repo, "branch", "-q", "-D", "main")
    out4, rep = _run([spec], out3.documents, tmp_path / "work")
    assert not rep["docs"].ok and "'main' not found" in rep["docs"].error
    assert _ids(out4.documents) == _ids(out3.documents)
    assert "STALE since" in source_lines(tmp_path / "work")[0]


def test_website_crawl_robots_sitemap_conditional_refetch_and_outage(tmp_path: Path):
    site = Site()
    with website(site):
        site.pages["/robots.txt"] = ("text/plain", b"User-agent: *\nDisallow: /private\n")
        links = ("/guide", "/private/x", "/old", "/missing", "/slow", "/manual.pdf")
        site.html("/", "Home", "welcome home", (*links, "http://other.example/"))
        site.html("/guide", "Guide", "how to roll back a release")
        site.html("/private/x", "Secret", "never crawled")
        site.redirects["/old"] = "/guide"
        site.html("/slow", "Slow", "too slow")
        site.slow["/slow"] = 2.5
        site.pages["/manual.pdf"] = ("application/pdf", small_pdf("The manual says restart it."))
        spec = SourceSpec("site", site.url + "/", "web", limits=Limits(timeout=1.0, rate=100.0))
        out, rep = _run([spec], [], tmp_path / "work")
        assert _ids(out.documents) == ["site/guide", "site/index", "site/manual.pdf"]
        assert not any(p.startswith("/private") for p, _ in site.requests)
        assert any("timeout=1s" in n for n in rep["site"].notes)
        pdf = next(d for d in out.documents if d.document_id == "site/manual.pdf")
        assert pdf.kind == "pdf" and "restart" in pdf.text and pdf.path.endswith("/manual.pdf")

        site.slow.clear()
        del site.pages["/slow"]
        site.requests.clear()
        out2, rep = _run([spec], out.documents, tmp_path / "work")
        assert rep["site"].read == 0 and rep["site"].reused == 3  # every page answered 304
        assert {c for _, c in site.requests if _ != "/robots.txt"} <= {304, 301, 404}

        site.html("/guide", "Guide", "how to roll back a release, edited")
        out3, rep = _run([spec], out2.documents, tmp_path / "work")
        assert rep["site"].read == 1 and rep["site"].read_bytes > 0

        sitemap = f"<urlset><url><loc>{site.url}/guide</loc></url></urlset>".encode()
        site.pages["/sitemap.xml"] = ("application/xml", sitemap)
        via_map = SourceSpec("map", site.url + "/sitemap.xml", "web", limits=Limits(depth=0))
        out_map, _ = _run([via_map], [], tmp_path / "work")
        assert _ids(out_map.documents) == ["map/guide"]
        # the page budget: robots.txt and the start page only; the rest is kept as it was
        small = SourceSpec("site", site.url + "/", "web", limits=Limits(pages=2, rate=100.0))
        out_small, rep = _run([small], out3.documents, tmp_path / "work")
        assert any("page budget pages=2" in n for n in rep["site"].notes)
        assert _ids(out_small.documents) == _ids(out3.documents) and rep["site"].deleted == 0
    # the server gone: the source fails alone and keeps its documents
    out4, rep = _run([spec], out3.documents, tmp_path / "work")
    assert not rep["site"].ok and "site" in rep["site"].line()
    assert _ids(out4.documents) == _ids(out3.documents)


def test_s3_prefix_listed_in_place_unchanged_never_read(tmp_path: Path, s3_env):
    s3 = s3_client(s3_env)
    prefix = f"src-{tmp_path.name}"
    s3.put_object(Bucket="rag", Key=f"{prefix}/a.md", Body=b"# A\n\nobject alpha\n")
    s3.put_object(Bucket="rag", Key=f"{prefix}/sub/b.txt", Body=b"object beta")
    spec = SourceSpec("bucket", f"s3://rag/{prefix}", "objects", metadata={"access": ["hr"]})
    out, rep = _run([spec], [], tmp_path / "work")
    assert _ids(out.documents) == ["bucket/a.md", "bucket/sub/b.txt"]
    a = out.documents[0]
    assert a.metadata["access"] == ["hr"] and a.metadata["etag"]
    assert a.path == f"view:s3://rag/{prefix}/a.md"  # issue 49: a private object's URL is 403
    out2, rep = _run([spec], out.documents, tmp_path / "work")
    assert (rep["bucket"].read, rep["bucket"].read_bytes, rep["bucket"].reused) == (0, 0, 2)
    s3.delete_object(Bucket="rag", Key=f"{prefix}/sub/b.txt")
    s3.put_object(Bucket="rag", Key=f"{prefix}/c.md", Body=b"# C\n\nobject gamma\n")
    out3, rep = _run([spec], out2.documents, tmp_path / "work")
    assert _ids(out3.documents) == ["bucket/a.md", "bucket/c.md"]
    assert (rep["bucket"].read, rep["bucket"].deleted) == (1, 1)
    missing = SourceSpec("bucket", "s3://no-such-bucket/x", "objects")
    out4, rep = _run([missing], out3.documents, tmp_path / "work")
    assert not rep["bucket"].ok and "bucket does not exist" in rep["bucket"].error
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in rep["bucket"].line()
    assert _ids(out4.documents) == _ids(out3.documents)


def test_an_object_rewritten_at_the_same_size_and_second_is_read_again(tmp_path: Path, s3_env):
    """The identity is the ETag: a rewrite with other bytes, the same size and the same
    last-modified second (what the listing's size and time cannot tell apart) is read again;
    the unchanged object beside it is not, and an unchanged re-run reads 0 bytes."""
    s3 = s3_client(s3_env)
    prefix = f"etag-{tmp_path.name}"
    spec = SourceSpec("bucket", f"s3://rag/{prefix}", "objects")
    s3.put_object(Bucket="rag", Key=f"{prefix}/keep.md", Body=b"# Keep\n\nnever changes\n")
    old, new = b"# A\n\nthe first text\n", b"# A\n\nthe fresh text\n"
    assert len(old) == len(new)
    for attempt in range(4):  # the rewrite must land in the same second as the first write
        work = tmp_path / f"work{attempt}"
        while time.time() % 1 > 0.2:  # start just after a second begins
            time.sleep(0.02)
        s3.put_object(Bucket="rag", Key=f"{prefix}/a.md", Body=old)
        out, _ = _run([spec], [], work)
        before = s3.head_object(Bucket="rag", Key=f"{prefix}/a.md")
        s3.put_object(Bucket="rag", Key=f"{prefix}/a.md", Body=new)
        after = s3.head_object(Bucket="rag", Key=f"{prefix}/a.md")
        if (before["ContentLength"], before["LastModified"]) == (
            after["ContentLength"],
            after["LastModified"],
        ):
            break
    else:
        pytest.fail("the rewrite never landed in the first write's second")
    out2, rep = _run([spec], out.documents, work)
    assert (rep["bucket"].read, rep["bucket"].reused) == (1, 1)
    assert rep["bucket"].read_bytes == len(new)
    a = next(d for d in out2.documents if d.document_id == "bucket/a.md")
    assert "fresh" in a.text and a.metadata["etag"] == [after["ETag"].strip('"')]
    out3, rep = _run([spec], out2.documents, work)
    assert (rep["bucket"].read, rep["bucket"].read_bytes, rep["bucket"].reused) == (0, 0, 2)


def test_a_run_lists_each_source_once(tmp_path: Path):
    """The observation's listing is kept for its run: the extraction that follows in the same
    run sends no request; the next run crawls again (conditional requests)."""
    site = Site()
    with website(site):
        site.html("/", "Home", "welcome home", ("/guide",))
        site.html("/guide", "Guide", "how to roll back a release")
        spec = SourceSpec("site", site.url + "/", "web", limits=Limits(rate=100.0))
        work = tmp_path / "work"
        list_source(spec, work, run_id="run-1")  # what the observation does
        crawl = list(site.requests)
        assert [p for p, _ in crawl] == ["/robots.txt", "/", "/guide"]
        out, rep = _run([spec], [], work, run_id="run-1")  # the extraction of that run
        assert site.requests == crawl  # not one request more
        assert _ids(out.documents) == ["site/guide", "site/index"] and rep["site"].read == 2
        out2, rep = _run([spec], out.documents, work, run_id="run-2")  # no observation kept
        assert [c for _, c in site.requests[len(crawl) :]] == [404, 304, 304]
        assert (rep["site"].read, rep["site"].reused) == (0, 2)


def test_a_listing_that_would_delete_most_documents_is_withheld_until_confirmed(tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for n in range(4):
        (folder / f"{n}.md").write_text(f"# Doc {n}\n\ntext {n}\n")
    spec = single(str(folder))
    spec = SourceSpec("docs", str(folder), "folder")
    out, _ = _run([spec], [], tmp_path / "work")
    for n in range(3):
        (folder / f"{n}.md").unlink()
    out2, rep = _run([spec], out.documents, tmp_path / "work")
    assert rep["docs"].withheld == 3 and "RAG_SOURCE_CONFIRM_DELETE=docs" in rep["docs"].line()
    confirm = "confirm with RAG_SOURCE_CONFIRM_DELETE=docs rag-assets index"  # issue 49
    assert any(confirm in ln for ln in source_lines(tmp_path / "work"))
    assert len(_ids(out2.documents)) == 4
    out3, rep = _run([spec], out2.documents, tmp_path / "work", confirm_delete=["docs"])
    assert rep["docs"].deleted == 3 and _ids(out3.documents) == ["docs/3.md"]
    (folder / "3.md").unlink()
    folder.rmdir()  # unmounted: the source did not answer, nothing is deleted
    out4, rep = _run([spec], out3.documents, tmp_path / "work")
    assert not rep["docs"].ok and _ids(out4.documents) == ["docs/3.md"]
    assert load_state(tmp_path / "work")["docs"]["stale_since"]


def test_limits_name_themselves(tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for n in range(3):
        (folder / f"{n}.md").write_text(f"# Doc {n}\n\n" + "x" * 200 * (n + 1))
    spec = SourceSpec("docs", str(folder), "folder", limits=Limits(max_items=2, max_file_size=300))
    out, rep = _run([spec], [], tmp_path / "work")
    assert any("max_items=2" in n for n in rep["docs"].notes)
    failed = [d for d in out.documents if d.status == "failed"]
    assert [d.document_id for d in failed] == ["docs/1.md"]
    assert "max_file_size=300" in (failed[0].reason or "")


def test_a_sources_file(tmp_path: Path):
    (tmp_path / "local").mkdir()
    path = tmp_path / "sources.toml"
    path.write_text(
        '[[source]]\nname = "local"\nlocation = "local"\ninclude = ["*.md"]\n'
        'metadata = { access = "hr" }\nmax_items = 10\n\n'
        '[[source]]\nname = "repo"\nlocation = "git+https://git.example/r.git@v1"\n'
    )
    local, repo = load_sources(path)
    assert local.kind == "folder" and local.location == str(tmp_path / "local")
    assert local.metadata == {"access": ["hr"]} and local.limits.max_items == 10
    assert repo.kind == "git"
    one = source_specs("git+https://git.example/team/runbooks.git@main")
    assert one is not None and (one[0].name, one[0].kind) == ("runbooks", "git")
    assert (  # issue 49: such a location is refused, and its label never shows the token
        documents_label("git+https://bot:tok@git.example/r.git")
        == "git+https://***@git.example/r.git"
    )
    assert source_specs(str(tmp_path / "local")) is None  # a folder: read as always
    path.write_text('[[source]]\nname = "x"\nlocation = "ftp://h/p"\n')
    with pytest.raises(SourceError, match="unknown source location"):
        load_sources(path)
    path.write_text('[[source]]\nname = "x"\nlocation = "/a"\nmax_itmes = 3\n')
    with pytest.raises(SourceError, match="unknown keys max_itmes"):
        load_sources(path)


def test_bench_reports_each_source_and_nothing_reread_when_unchanged(tmp_path: Path):
    from rag_assets_tests.helpers import cli_here

    repo = tmp_path / "repo"
    commit_files(repo, {"a.md": "# A\n\nalpha\n", "b/c.md": "# C\n\ngamma\n"}, "add")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("# X\n\nex\n")
    sources = tmp_path / "sources.toml"
    sources.write_text(
        f'[[source]]\nname = "repo"\nlocation = "git+file://{repo}"\n\n'
        '[[source]]\nname = "docs"\nlocation = "docs"\n'
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RAG_SOURCES": str(sources),
           "RAG_INDEX_URI": str(tmp_path / "index")}  # fmt: skip
    out = json.loads(cli_here(env, "bench", "--sources", "--json").stdout)["sources"]
    assert [(r["source"], r["kind"], r["items"]) for r in out] == [
        ("repo", "git", 2),
        ("docs", "folder", 1),
    ]
    assert all(r["first_read_bytes"] > 0 and r["rerun_read_bytes"] == 0 for r in out)


def test_a_token_in_a_location_never_appears(tmp_path: Path):
    """Issue 49: refused before anything is fetched or stored (test_source_links.py checks
    every kind); its line and the state never show it."""
    spec = SourceSpec("r", "git+https://bot:tok-s3cret@127.0.0.1:9/team/r.git@main", "git",
                      limits=Limits(timeout=10))  # fmt: skip
    out, rep = _run([spec], [], tmp_path / "work")
    assert not rep["r"].ok and "may not hold a user or password" in rep["r"].error
    assert not (tmp_path / "work" / "sources" / "r").exists()  # no Git cache, no config
    shown = rep["r"].line() + "\n".join(source_lines(tmp_path / "work"))
    assert "tok-s3cret" not in shown and "bot" not in shown
