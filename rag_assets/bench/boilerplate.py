"""Website boilerplate, measured (issue 49): ``python -m rag_assets.bench.boilerplate DIR...``.

Each DIR (a local copy of a real multi-page HTML manual, e.g. ``/usr/share/doc/libffi8/html``)
is served by a real HTTP server on 127.0.0.1 and crawled by the website source from its
``index.html``, as a run crawls a site; every page is extracted and cut into strategy-E chunks
by the pipeline's own extractor and chunker, in these ways:

- ``before``: whole pages (``main_content = false``: what was indexed before issue 49);
- ``after``: main content less the site's repeated blocks (:mod:`rag_assets.lib.ingest.
  sources.boilerplate`, the default);
- with ``--compare``, and where importable (not dependencies: ``pip install trafilatura
  readability-lxml justext`` beside it), the main content of trafilatura, readability-lxml and
  jusText, each fed as HTML to the same extractor and chunker.

The oracle is hand-labelled and independent of every method: the frame of each generator's
pages (:data:`FRAME`: Texinfo's ``div.header``/``div.nav-panel``, DocBook's ``table.nav``/
``div.navheader``/``div.navfooter``, the Node.js manual's skip link, sidebar, page header and
table of contents) removed, what the extractor reads of the rest is the page's content. A chunk
is **boilerplate** when more than half of its characters are in lines not found in its page's
content (a line of 20 characters or more as a substring, a shorter one only whole). Printed per
site and method: pages read, chunks, the share of chunks that are boilerplate, and the share of
the page content's lines (20 characters or more) found in some chunk (content kept). Counts, not
times: they do not depend on the machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FRAME = ", ".join(
    [
        "div.header",  # Texinfo <= 6: "Next: …, Previous: …, Up: … [Contents][Index]"
        "div.nav-panel",  # Texinfo 7
        "table.nav",  # DocBook (valgrind): navigation header and footer tables
        "div.navheader",
        "div.navfooter",
        "a.skip-to-content",  # the Node.js manual
        "#column2",
        "header.header",
        "details#toc",
    ]
)
LONG_LINE = 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rag_assets.bench.boilerplate")
    parser.add_argument("sites", nargs="+", type=Path, help="folders of HTML pages (index.html)")
    parser.add_argument(
        "--compare", action="store_true", help="also trafilatura, readability, jusText"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [r for site in args.sites for r in measure(site, args.compare)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    head = ("site", "method", "pages", "chunks", "boilerplate", "content kept")
    print(f"{head[0]:<34} {head[1]:<12} {head[2]:>5} {head[3]:>6} {head[4]:>11} {head[5]:>12}")
    for r in rows:
        print(f"{r['site']:<34} {r['method']:<12} {r['pages']:>5} {r['chunks']:>6} "
              f"{r['boilerplate_share']:>10.1%} {r['content_kept']:>11.1%}")  # fmt: skip
    return 0


def measure(site: Path, compare: bool = False) -> list[dict[str, Any]]:
    """The rows of one site (see the module)."""
    import tempfile

    from rag_assets.lib.ingest.sources.config import Limits, SourceSpec
    from rag_assets.lib.ingest.sources.sync import extract_sources

    out = []
    with served(site) as url, tempfile.TemporaryDirectory() as work:
        limits = Limits(rate=1000.0, depth=20, pages=5000)
        runs = {"before": False, "after": True}
        docs: dict[str, Any] = {}
        for method, main in runs.items():
            spec = SourceSpec("site", f"{url}/index.html", "web", limits=limits, main_content=main)
            result = extract_sources([spec], {}, Path(work) / method)
            docs[method] = [d for d in result.documents if d.ok and d.kind == "html"]
        found = {d.document_id: _file(site, d.document_id) for d in docs["before"]}
        pages = {k: v for k, v in found.items() if v is not None}
        docs = {m: [d for d in ds if d.document_id in pages] for m, ds in docs.items()}
        content = {doc_id: _content_lines(html) for doc_id, html in pages.items()}
        for method in runs:
            out.append(_row(site, method, docs[method], content))
        if compare:
            for method, fn in _others().items():
                out.append(_row(site, method, _extract_with(fn, pages), content))
    return out


def _file(site: Path, doc_id: str) -> bytes | None:
    """The served file of a page's document id (``site/<path>``; ``…/index``: a folder's)."""
    key = doc_id.removeprefix("site/").split("?")[0]
    for name in (key, key.removesuffix("index") + "index.html"):
        path = site / name
        if path.is_file():
            return path.read_bytes()
    return None


@contextmanager
def served(folder: Path) -> Iterator[str]:
    """``folder`` on a real HTTP server on 127.0.0.1 (the standard library's file server)."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _content_lines(html: bytes) -> set[str]:
    """The oracle: the lines the extractor reads of the page without its frame."""
    from selectolax.lexbor import LexborHTMLParser

    from rag_assets.lib.ingest.formats.html import extract_html

    tree = LexborHTMLParser(html.decode("utf-8", "replace"))
    for node in tree.css(FRAME):
        node.decompose()
    text = extract_html(tree.html or "", Path("page.html")).text
    return {" ".join(ln.split()) for ln in text.splitlines() if ln.strip()}


def _row(site: Path, method: str, docs: list[Any], content: dict[str, set[str]]) -> dict[str, Any]:
    from rag_assets.lib.ingest.chunk import chunk_documents, strategy

    joined = {d: "\n".join(lines) for d, lines in content.items()}
    chunks = chunk_documents(docs, strategy("E"))
    boiler = 0
    texts: dict[str, str] = {}
    for c in chunks:
        lines = content.get(c.document_id, set())
        texts[c.document_id] = texts.get(c.document_id, "") + "\n" + " ".join(c.content.split())
        total = outside = 0
        for ln in (" ".join(x.split()) for x in c.content.splitlines() if x.strip()):
            total += len(ln)
            if not _in_content(ln, lines, joined.get(c.document_id, "")):
                outside += len(ln)
        if total and outside * 2 > total:
            boiler += 1
    kept = want = 0
    for doc_id, lines in content.items():
        long = [ln for ln in lines if len(ln) >= LONG_LINE]
        want += len(long)
        kept += sum(1 for ln in long if ln in texts.get(doc_id, ""))
    return {
        "site": str(site),
        "method": method,
        "pages": len(docs),
        "chunks": len(chunks),
        "boilerplate_chunks": boiler,
        "boilerplate_share": boiler / len(chunks) if chunks else 0.0,
        "content_kept": kept / want if want else 1.0,
    }


def _in_content(line: str, lines: set[str], joined: str) -> bool:
    if line in lines:
        return True
    return len(line) >= LONG_LINE and line in joined


def _extract_with(fn: Callable[[bytes], str], pages: dict[str, bytes]) -> list[Any]:
    """Each page's main content by another library (HTML), read by the pipeline's extractor."""
    from rag_assets.lib.ingest.formats.html import extract_html
    from rag_assets.lib.types import ExtractedDocument

    out = []
    for doc_id, html in pages.items():
        try:
            ex = extract_html(fn(html), Path(doc_id).with_suffix(".html"))
        except Exception:  # noqa: BLE001 - a page the library leaves empty: nothing indexed
            continue
        doc = ExtractedDocument(doc_id, doc_id, "html", "ok", None, "html", "bench", "")
        out.append(replace(doc, text=ex.text, title=ex.title, headings=ex.headings,
                           locators=ex.locators))  # fmt: skip
    return out


def _others() -> dict[str, Callable[[bytes], str]]:
    """The main-content extractors weighed (those importable here)."""
    found: dict[str, Callable[[bytes], str]] = {}
    try:
        import trafilatura

        def traf(html: bytes) -> str:
            got = trafilatura.extract(html.decode("utf-8", "replace"), output_format="html",
                                      include_tables=True, include_formatting=True)  # fmt: skip
            return got or "<html><body></body></html>"

        found["trafilatura"] = traf
    except ImportError:
        pass
    try:
        from readability import Document

        found["readability"] = lambda html: Document(html.decode("utf-8", "replace")).summary()
    except ImportError:
        pass
    try:
        import justext

        def jus(html: bytes) -> str:
            paras = justext.justext(html, justext.get_stoplist("English"))
            body = "".join(f"<p>{_escape(p.text)}</p>" for p in paras if not p.is_boilerplate)
            return f"<html><body>{body}</body></html>"

        found["jusText"] = jus
    except ImportError:
        pass
    return found


def _escape(text: str) -> str:
    import html

    return html.escape(text)


if __name__ == "__main__":
    raise SystemExit(main())
