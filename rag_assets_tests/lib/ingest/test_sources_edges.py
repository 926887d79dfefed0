"""Issue 49, the fetching edges of sources, each on the real part (a threading HTTP server, a Git
repository made with the ``git`` binary, the S3 server of ``s3_server.py``): odd links are
resolved as a browser resolves them and a page that still fails fails alone; no item name
becomes a file name; a non-UTF-8 Git name gets an escaped id; the timeout bounds a whole fetch;
robots.txt as RFC 9309 reads it; S3 folder markers; Git's whole error; website boilerplate."""

from __future__ import annotations

import json
import os
import urllib.robotparser
from pathlib import Path

import pytest

from rag_assets.lib.ingest.sources import Item, boilerplate
from rag_assets.lib.ingest.sources.config import Limits, SourceSpec, built_from
from rag_assets.lib.ingest.sources.fetch import resolve
from rag_assets.lib.ingest.sources.sync import extract_sources, temp_name
from rag_assets_tests.source_servers import Site, commit_files, s3_client, website

FAST = Limits(rate=1000.0, timeout=5.0)

# what a browser opens for each link on http://127.0.0.1:8000/docs/index.html: the outputs of
# ada-url 4.0.0 (the WHATWG URL parser of Node.js), recorded (None: not an http(s) link)
BROWSER = {
    "/my page.html": "http://127.0.0.1:8000/my%20page.html",
    "/café.html": "http://127.0.0.1:8000/caf%C3%A9.html",
    "  /lead.html\t": "http://127.0.0.1:8000/lead.html",
    "/a\nb.html": "http://127.0.0.1:8000/ab.html",
    "sub\\x.html": "http://127.0.0.1:8000/docs/sub/x.html",
    "../up.html?q=a b#frag": "http://127.0.0.1:8000/up.html?q=a%20b",
    "/x.html?q=é&r=1": "http://127.0.0.1:8000/x.html?q=%C3%A9&r=1",
    "/%7Euser/a%20b.html": "http://127.0.0.1:8000/%7Euser/a%20b.html",
    "//127.0.0.1:8000/./a/../b.html": "http://127.0.0.1:8000/b.html",
    "HTTP://127.0.0.1:8000/C.html": "http://127.0.0.1:8000/C.html",
    '/p?x="y"': "http://127.0.0.1:8000/p?x=%22y%22",
    "/q?a='b'": "http://127.0.0.1:8000/q?a=%27b%27",
    "/q?a=b\\c": "http://127.0.0.1:8000/q?a=b\\c",
    "/emoji-😀.html": "http://127.0.0.1:8000/emoji-%F0%9F%98%80.html",
    "http://bücher.example/x": "http://xn--bcher-kva.example/x",
    "mailto:a@b.example": None,
    " javascript:void(0)": None,
    "http://[::1": None,
}


@pytest.mark.parametrize("href", list(BROWSER))
def test_links_are_resolved_as_a_browser_resolves_them(href: str):
    assert resolve("http://127.0.0.1:8000/docs/index.html", href) == BROWSER[href]


def _run(specs, previous, work, **kw):
    out = extract_sources(specs, {d.document_id: d for d in previous}, work, **kw)
    return out, {r.name: r for r in out.sources}


def _docs(out):
    return {d.document_id: d for d in out.documents}


def test_odd_links_long_queries_and_a_failing_page_on_a_real_site(tmp_path: Path):
    """Item 1 and 2: a space, a non-ASCII letter, a tab, a backslash and a 300-character query
    in links are fetched as a browser would; a page that answers 500 and one that drips past
    the timeout fail alone with their reasons; the source and the others index."""
    site = Site()
    query = "q=" + "x" * 300
    with website(site):
        links = ("/my page.html", "/café.html", " /tab.html\t", "sub\\x.html", f"/search?{query}",
                 "/broken.html", "/drip.html", "http://[::1")  # fmt: skip
        site.html("/", "Home", "welcome home", links)
        site.html("/my%20page.html", "Spaced", "a page with a space in its name")
        site.html("/caf%C3%A9.html", "Café", "the café opens at eight")
        site.html("/tab.html", "Tab", "a link with a tab around it")
        site.html("/sub/x.html", "Backslash", "a link written with a backslash")
        site.html(f"/search?{query}", "Search", "results of a long query")
        site.status["/broken.html"] = 500
        site.drip["/drip.html"] = (b"<html><body><p>" + b"d" * 40 + b"</p></body></html>", 0.2)
        spec = SourceSpec("site", site.url + "/", "web", limits=Limits(rate=1000.0, timeout=1.0))
        out, rep = _run([spec], [], tmp_path / "work")
    docs = _docs(out)
    assert rep["site"].ok, rep["site"].error
    for key in ("index", "my page.html", "café.html", "tab.html", "sub/x.html", f"search?{query}"):
        assert docs[f"site/{key}"].status == "ok", (key, docs[f"site/{key}"].reason)
    assert docs["site/café.html"].path == f"{site.url}/caf%C3%A9.html"
    notes = " | ".join(rep["site"].notes)
    assert "/broken.html: HTTP 500" in notes
    # item 4: the whole fetch is bounded: the drip was cut off long before its 57 bytes
    assert "/drip.html: no complete answer within timeout=1s" in notes
    assert site.dripped["/drip.html"] < 20
    assert "site/drip.html" not in docs and "site/broken.html" not in docs


def test_no_item_name_becomes_a_file_name(tmp_path: Path, s3_env):
    """Item 2 and 3: a 300-character S3 key and Git path, a Git name that is not UTF-8: each
    indexes under an id every store can write (the Git name with its bytes escaped)."""
    s3 = s3_client(s3_env)
    prefix = f"long-{tmp_path.name}"
    long_key = "k" * 300 + ".md"
    s3.put_object(Bucket="rag", Key=f"{prefix}/{long_key}", Body=b"# Long\n\na long key\n")
    s3.put_object(Bucket="rag", Key=f"{prefix}/folder/", Body=b"")  # a console's folder marker
    s3.put_object(Bucket="rag", Key=f"{prefix}/folder/in.md", Body=b"# In\n\ninside\n")
    repo = tmp_path / "repo"
    long_path = "/".join(["d" * 100, "e" * 100, "f" * 97 + ".md"])  # 300 characters
    odd = os.fsdecode(b"caf\xe9.md")  # Latin-1 bytes: not UTF-8
    commit_files(repo, {long_path: "# Deep\n\na long path\n", odd: "# Cafe\n\nlatin name\n"}, "a")
    specs = [
        SourceSpec("bucket", f"s3://rag/{prefix}", "objects"),
        SourceSpec("repo", f"git+file://{repo}@main", "git"),
    ]
    out, rep = _run(specs, [], tmp_path / "work")
    docs = _docs(out)
    assert rep["bucket"].ok and rep["repo"].ok, (rep["bucket"].error, rep["repo"].error)
    # the folder marker is no document (it failed on every run before)
    assert sorted(d for d in docs if d.startswith("bucket/")) == sorted(
        [f"bucket/{long_key}", "bucket/folder/in.md"]
    )
    long_doc = docs[f"bucket/{long_key}"]
    assert long_doc.status == "ok" and "long key" in long_doc.text
    assert docs[f"repo/{long_path}"].status == "ok"
    cafe = docs["repo/caf\\xe9.md"]
    assert cafe.status == "ok" and "latin name" in cafe.text
    for doc in out.documents:  # storable: no surrogates left anywhere
        json.dumps(doc.to_dict(), ensure_ascii=False).encode("utf-8")
    # the file an item is extracted from has a short name of its own, its extension kept
    name = temp_name(Item(long_path, "blob:x"))
    assert name.endswith(".md") and len(name.encode()) <= 110


def test_a_key_object_store_cannot_hold_fails_alone(tmp_path: Path, s3_env):
    """Item 8: keys with a ``..``, ``.`` or empty segment made object_store refuse the whole
    listing; each now fails alone (named with the segment escaped), the rest indexes."""
    s3 = s3_client(s3_env)
    prefix = f"bad-{tmp_path.name}"
    for key in ("ok.md", "a/../b.md", "./c.md", "/d.md", "sub/"):
        body = b"" if key.endswith("/") else b"# T\n\nreadable text\n"
        s3.put_object(Bucket="rag", Key=f"{prefix}/{key}", Body=body)
    spec = SourceSpec("bucket", f"s3://rag/{prefix}", "objects")
    out, rep = _run([spec], [], tmp_path / "work")
    assert rep["bucket"].ok, rep["bucket"].error
    docs = _docs(out)
    assert docs["bucket/ok.md"].status == "ok"
    assert sorted(d for d, doc in docs.items() if doc.status == "failed") == [
        "bucket/%2E/c.md",
        "bucket/%2F/d.md",
        "bucket/a/%2E%2E/b.md",
    ]
    reason = docs["bucket/a/%2E%2E/b.md"].reason or ""
    assert "'a/../b.md' has an empty, '.' or '..' segment" in reason and "rename" in reason
    assert "bucket/sub" not in docs and len(docs) == 4  # the folder marker is no document
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in json.dumps([d.to_dict() for d in docs.values()])


def test_an_item_that_cannot_be_read_fails_alone(tmp_path: Path):
    """Item 2: whatever a read raises (not only SourceError), that item fails with its reason."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nalpha\n")
    (folder / "b.md").write_text("# B\n\nbeta\n")

    class Broken:
        def __init__(self, inner):
            self.inner = inner

        def list_items(self):
            return self.inner.list_items()

        def read(self, item):
            if item.key == "b.md":
                raise RuntimeError("disk on fire")
            return self.inner.read(item)

    from rag_assets.lib.ingest.sources import sync

    spec = SourceSpec("docs", str(folder), "folder")
    real = sync.open_source
    sync.open_source = lambda s, w: Broken(real(s, w))  # type: ignore[assignment]
    try:
        out, rep = _run([spec], [], tmp_path / "work")
    finally:
        sync.open_source = real  # type: ignore[assignment]
    docs = _docs(out)
    assert docs["docs/a.md"].status == "ok" and rep["docs"].ok
    assert docs["docs/b.md"].status == "failed"
    assert "RuntimeError: disk on fire" in (docs["docs/b.md"].reason or "")


ROBOTS_CASES = {
    # robots.txt's answer -> (the source's outcome, pages fetched besides robots.txt)
    "wildcards": ("ok", ["/", "/guide"]),
    "redirected": ("ok", ["/", "/guide"]),
    "unavailable": ("ok", ["/", "/guide", "/manual.pdf", "/private/x"]),
    "unreachable": ("failed", []),
    "other host": ("failed", []),
}


@pytest.mark.parametrize("case", list(ROBOTS_CASES))
def test_robots_txt_as_rfc_9309_reads_it(tmp_path: Path, case: str):
    """Item 8: protego's longest match and ``*``/``$`` patterns; a redirected robots.txt
    followed (three hops); a 4xx: no rules; a 5xx: the site disallowed, so the source fails and
    keeps its documents; a redirect to another host: not followed, the source fails."""
    site = Site()
    rules = b"User-agent: *\nDisallow: /*.pdf$\nDisallow: /private\nAllow: /private/open\n"
    with website(site):
        site.html("/", "Home", "home", ("/guide", "/manual.pdf", "/private/x"))
        site.html("/guide", "Guide", "the guide")
        site.html("/private/x", "Private", "private")
        site.pages["/manual.pdf"] = ("application/pdf", b"%PDF-1.4 not fetched")
        if case == "wildcards":
            site.pages["/robots.txt"] = ("text/plain", rules)
        elif case == "redirected":
            site.redirects |= {"/robots.txt": "/r1", "/r1": "/r2", "/r2": "/rules.txt"}
            site.pages["/rules.txt"] = ("text/plain", rules)
        elif case == "unavailable":
            site.status["/robots.txt"] = 404
        elif case == "unreachable":
            site.status["/robots.txt"] = 503
        else:
            site.redirects["/robots.txt"] = "http://other.example/robots.txt"
        spec = SourceSpec("site", site.url + "/", "web", limits=FAST)
        out, rep = _run([spec], [], tmp_path / "work")
    outcome, fetched = ROBOTS_CASES[case]
    assert ("ok" if rep["site"].ok else "failed") == outcome, rep["site"].error
    pages = [p for p, _ in site.requests if p not in ("/robots.txt", "/r1", "/r2", "/rules.txt")]
    assert sorted(pages) == fetched
    if case == "wildcards":  # what urllib.robotparser (used before) would have fetched
        old = urllib.robotparser.RobotFileParser()
        old.parse(rules.decode().splitlines())
        assert old.can_fetch("rag-assets", site.url + "/manual.pdf")  # no patterns in it
        assert any("2 pages disallowed by robots.txt" in n for n in rep["site"].notes)
    if case == "unreachable":
        assert "HTTP 503: robots.txt unreachable" in rep["site"].error
        assert "RFC 9309" in rep["site"].error
    if case == "other host":
        assert "another host" in rep["site"].error


def test_a_long_crawl_delay_is_capped_and_said(tmp_path: Path):
    site = Site()
    with website(site):
        site.pages["/robots.txt"] = ("text/plain", b"User-agent: *\nCrawl-delay: 3600\n")
        site.html("/", "Home", "home", ("/guide",))
        site.html("/guide", "Guide", "the guide")
        limits = Limits(rate=1000.0, max_crawl_delay=0.05)
        spec = SourceSpec("site", site.url + "/", "web", limits=limits)
        out, rep = _run([spec], [], tmp_path / "work")
    assert rep["site"].read == 2
    note = "robots.txt asks for Crawl-delay: 3600s, capped at max_crawl_delay=0.05s"
    assert note in rep["site"].notes
    assert any(note in line for line in rep["site"].lines())  # the run summary's lines


def test_a_git_failure_keeps_gits_whole_message(tmp_path: Path):
    spec = SourceSpec("r", f"git+file://{tmp_path}/no-such-repo.git", "git", limits=FAST)
    out, rep = _run([spec], [], tmp_path / "work")
    assert not rep["r"].ok
    assert "does not appear to be a git repository" in rep["r"].error
    assert "the repository exists" in rep["r"].error  # the last line, which was all before


def test_the_summary_names_each_kind_of_location(tmp_path: Path):
    """Item 14: `sources file:`, `website:`, `bucket:`, `git repository:`, `folder:`."""
    assert built_from(f"sources:{tmp_path}/s.toml") == ("sources file", f"{tmp_path}/s.toml")
    assert built_from("https://wiki.example/")[0] == "website"
    assert built_from("http://wiki.example/")[0] == "website"
    assert built_from("s3://b/p")[0] == "bucket"
    assert built_from("git+https://***@h/r.git")[0] == "git repository"
    assert built_from(str(tmp_path))[0] == "folder"


def _manual(site: Site, pages: int, extra: tuple[int, ...] = ()) -> None:
    """A small Texinfo-like manual: each page a header of Next/Previous/Up links, a content
    paragraph of its own, a footer line repeated on every page; one page has a <main>."""
    for n in range(pages):
        nav = (f'<div class="header"><p>Next: <a href="/p{n + 1}">Chapter {n + 1}</a>, '
               f'Previous: <a href="/p{n - 1}">Chapter {n - 1}</a>, Up: <a href="/">Top</a> '
               '[<a href="/ix">Index</a>]</p></div>')  # fmt: skip
        body = f"<h2>Chapter {n}</h2><p>Chapter {n} explains the walrus number {n * 7}.</p>"
        foot = "<div><p>Copyright the manual's authors; all rights reserved.</p></div>"
        if n in extra:
            foot = "<p>Old note: see the errata.</p>" + foot
        main = f"<main>{body}</main><div><p>Sidebar text of page {n}</p></div>" if n == 2 else body
        page = f"<html><head><title>Chapter {n}</title></head><body>{nav}{main}{foot}</body></html>"
        site.pages["/" if n == 0 else f"/p{n}"] = ("text/html", page.encode())


def test_website_boilerplate_is_dropped_and_main_content_kept(tmp_path: Path):
    """Item 12: the Next/Previous/Up line and the footer repeated on every page are dropped,
    `<main>` is taken where there is one; a site change that drops a block from a page reads
    that page again; ``main_content = false`` keeps whole pages."""
    site = Site()
    with website(site):
        _manual(site, 6)
        spec = SourceSpec("site", site.url + "/", "web", limits=FAST)
        out, rep = _run([spec], [], tmp_path / "work")
        whole = SourceSpec("whole", site.url + "/", "web", limits=FAST, main_content=False)
        out_whole, _ = _run([whole], [], tmp_path / "work")
    docs, full = _docs(out), _docs(out_whole)
    for n in range(6):
        key = "index" if n == 0 else f"p{n}"
        text, raw = docs[f"site/{key}"].text, full[f"whole/{key}"].text
        assert f"walrus number {n * 7}" in text and f"walrus number {n * 7}" in raw
        assert "Next:" not in text and "Copyright" not in text, text
        assert "Next:" in raw and "Copyright" in raw
        assert docs[f"site/{key}"].title == f"Chapter {n}"
    assert "Sidebar text" not in docs["site/p2"].text  # outside its <main>
    frame = boilerplate.repeated(boilerplate.page_signatures(p[1]) for p in site.pages.values())
    # the header's shape, the header as the links that open most pages, the footer's text
    assert len(frame) == 3 and "pfirst" in frame


def test_a_site_too_small_has_no_frame():
    page = b"<html><body><p>Same line</p><p>Own</p></body></html>"
    assert boilerplate.repeated([boilerplate.page_signatures(page)] * 3) == frozenset()
    assert boilerplate.repeated([boilerplate.page_signatures(page)] * 4)


def test_an_unchanged_re_crawl_reads_nothing_and_a_new_frame_reads_again(tmp_path: Path):
    """A page's identity includes what of the site's frame it loses: the errata note on two
    pages is content; once three more pages carry it, it is the frame, and the two unchanged
    pages (a 304 each) are read again without it."""
    site = Site()
    with website(site):
        _manual(site, 6, extra=(0, 5))
        spec = SourceSpec("site", site.url + "/", "web", limits=FAST)
        out, rep = _run([spec], [], tmp_path / "work")
        assert "Old note" in _docs(out)["site/p5"].text
        out2, rep = _run([spec], out.documents, tmp_path / "work")
        assert (rep["site"].read, rep["site"].reused) == (0, 6)  # every page a 304
        _manual(site, 6, extra=(0, 1, 2, 3, 5))
        site.requests.clear()
        out3, rep = _run([spec], out2.documents, tmp_path / "work")
    assert ("/p5", 304) in site.requests and ("/", 304) in site.requests
    assert (rep["site"].read, rep["site"].reused) == (5, 1)  # p1-p3 changed; / and p5: frame
    assert all("Old note" not in d.text for d in out3.documents)
