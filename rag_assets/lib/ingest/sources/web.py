"""A website as a source: ``https://host/start`` (crawled) or ``https://host/sitemap.xml``.

Pages on the start's host only (scheme, host and port), ``robots.txt`` obeyed (and its
``Crawl-delay``), at most ``pages`` fetches and ``depth`` links from the start (or the sitemap's
pages), at most ``rate`` requests a second, each within ``timeout`` seconds. Redirects are
followed on the same host; a page's ``<link rel="canonical">`` on that host is its address (two
URLs of one page are one document). HTML pages are read for links; PDFs (and text) linked from
them are documents too, read by the same extractors as files.

Re-fetches are conditional: the ``ETag`` and ``Last-Modified`` of the last fetch go back as
``If-None-Match`` / ``If-Modified-Since``; a ``304`` reuses the page kept in the source's cache
folder (and its links), so an unchanged page is never downloaded again. A page's content
identity is its ETag, else its Last-Modified, else the sha256 of its bytes. A page that answers
404 or 410 is gone (its document is deleted); one that fails otherwise (a timeout, a 5xx) keeps
its last fetch and is named in a note. The start page (or sitemap) failing fails the source.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
import urllib.robotparser
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

from rag_assets.lib.ingest.sources import Item, LimitHit, Listing, SourceError, digest_items
from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.models.http import redact

USER_AGENT = "rag-assets"
_TYPES = {"text/html": ".html", "application/xhtml+xml": ".html", "application/pdf": ".pdf",
          "text/plain": ".txt", "text/markdown": ".md"}  # fmt: skip


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by the crawler itself (same host only, each one counted)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class WebSource:
    def __init__(self, spec: SourceSpec, cache: Path):
        self.spec = spec
        self.start = spec.location.strip()
        parts = urlsplit(self.start)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.cache = Path(cache)
        self.state_path = self.cache / "pages.json"
        self._opener = urllib.request.build_opener(_NoRedirect)
        self._last = 0.0
        self._delay = 1.0 / spec.limits.rate
        self.fetched = 0  # requests sent (bench: items listed per second, bytes re-read)
        self.downloaded = 0  # bytes of bodies received (a 304 is 0)

    # -- HTTP -----------------------------------------------------------------------------------
    def _get(
        self, url: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        wait = self._last + self._delay - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._last = time.monotonic()
        self.fetched += 1
        req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
        try:
            with self._opener.open(req, timeout=self.spec.limits.timeout) as resp:
                body = resp.read(self.spec.limits.max_file_size + 1)
                self.downloaded += len(body)
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, body
        except urllib.error.HTTPError as exc:
            return exc.code, {k.lower(): v for k, v in (exc.headers or {}).items()}, b""
        except TimeoutError:
            raise LimitHit(
                f"{redact(url)}: no answer within timeout={self.spec.limits.timeout:g}s"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise SourceError(f"{redact(url)}: {why}") from None

    def _follow(
        self, url: str, headers: dict[str, str] | None = None
    ) -> tuple[str, int, dict[str, str], bytes]:
        """GET with redirects followed on the same host (at most 5)."""
        for _ in range(6):
            status, head, body = self._get(url, headers)
            if status in (301, 302, 303, 307, 308) and head.get("location"):
                url = urldefrag(urljoin(url, head["location"]))[0]
                if not self._same_host(url):
                    return url, -1, head, b""  # left the host: not followed
                continue
            return url, status, head, body
        raise SourceError(f"{redact(url)}: too many redirects")

    def _same_host(self, url: str) -> bool:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}" == self.origin

    # -- the interface --------------------------------------------------------------------------
    def list_items(self) -> Listing:
        limits = self.spec.limits
        cache = self._load()
        robots = self._robots()
        delay = robots.crawl_delay(USER_AGENT)
        if delay:
            self._delay = max(self._delay, float(delay))
        seeds = self._sitemap() if self.start.endswith(".xml") else [self.start]
        queue = deque((u, 0) for u in seeds)
        seen: set[str] = set(seeds)
        pages: dict[str, dict[str, Any]] = {}
        notes: list[str] = []
        first = True
        budget_hit = False
        while queue:
            url, depth = queue.popleft()
            if not robots.can_fetch(USER_AGENT, url):
                notes.append(f"{redact(url)}: disallowed by robots.txt")
                continue
            if self.fetched >= limits.pages:
                budget_hit = True
                break
            old = cache.get(url)
            try:
                page = self._page(url, old)
            except SourceError as exc:
                if first and not self.start.endswith(".xml"):
                    raise
                notes.append(f"{exc}: its last fetch is kept" if old else str(exc))
                page = old
            first = False
            if page is None:
                continue
            pages[url] = page
            if depth < limits.depth:
                for link in page.get("links", []):
                    if link not in seen and self._same_host(link):
                        seen.add(link)
                        queue.append((link, depth + 1))
        if budget_hit:  # pages fetched before and not this time stay as they were
            notes.append(f"page budget pages={limits.pages} reached: {len(queue) + 1} pages "
                         "not fetched (those fetched before are kept)")  # fmt: skip
            pages.update({u: cache[u] for u in [url, *(u for u, _ in queue)] if u in cache})
        self._save(pages)
        items = self._items(pages)
        return Listing(items, digest_items(items), notes)

    def _page(self, url: str, old: dict[str, Any] | None) -> dict[str, Any] | None:
        headers = {}
        if old and old.get("etag"):
            headers["If-None-Match"] = old["etag"]
        if old and old.get("modified"):
            headers["If-Modified-Since"] = old["modified"]
        final, status, head, body = self._follow(url, headers)
        if status == -1:
            return None
        if status == 304 and old:
            return old
        if status in (404, 410):
            return None  # gone: its document is deleted
        if status != 200:
            raise SourceError(f"{redact(url)}: HTTP {status}")
        if len(body) > self.spec.limits.max_file_size:
            raise LimitHit(
                f"{redact(url)}: over max_file_size={self.spec.limits.max_file_size:,} bytes"
            )
        ctype = head.get("content-type", "").split(";")[0].strip().lower()
        suffix = _TYPES.get(ctype)
        if suffix is None:
            return None  # an image, a download: not a document
        sha = hashlib.sha256(body).hexdigest()
        self.cache.mkdir(parents=True, exist_ok=True)
        (self.cache / sha).write_bytes(body)
        canonical, links = final, list[str]()
        if suffix == ".html":
            canonical, links = _html_links(final, body)
            canonical = canonical if self._same_host(canonical) else final
        identity = (f"etag:{head['etag']}" if head.get("etag")
                    else f"modified:{head['last-modified']}" if head.get("last-modified")
                    else f"sha256:{sha}")  # fmt: skip
        return {"url": url, "canonical": canonical, "etag": head.get("etag", ""),
                "modified": head.get("last-modified", ""), "identity": identity, "sha": sha,
                "suffix": suffix, "links": links, "size": len(body)}  # fmt: skip

    def _items(self, pages: dict[str, dict[str, Any]]) -> list[Item]:
        by_key: dict[str, Item] = {}
        for page in pages.values():
            key = _key(page["canonical"])
            if key in by_key:
                continue
            by_key[key] = Item(key, page["identity"], page["size"], page["canonical"],
                               {"sha": page["sha"]}, page["suffix"])  # fmt: skip
        return [by_key[k] for k in sorted(by_key)]

    def read(self, item: Item) -> bytes:
        try:
            return (self.cache / item.facts["sha"]).read_bytes()
        except (OSError, KeyError):
            raise SourceError(
                f"{redact(item.url)}: its fetched copy is gone from the cache"
            ) from None

    def _robots(self) -> urllib.robotparser.RobotFileParser:
        parser = urllib.robotparser.RobotFileParser()
        status, _, body = self._get(self.origin + "/robots.txt")
        if status in (401, 403):
            parser.disallow_all = True  # type: ignore[attr-defined]
        elif status == 200:
            parser.parse(body.decode("utf-8", "replace").splitlines())
        else:
            parser.allow_all = True  # type: ignore[attr-defined]
        return parser

    def _sitemap(self) -> list[str]:
        import xml.etree.ElementTree as ET

        _, status, _, body = self._follow(self.start)
        if status != 200:
            raise SourceError(f"{redact(self.start)}: HTTP {status}")
        try:
            root = ET.fromstring(body)
        except ET.ParseError as exc:
            raise SourceError(f"{redact(self.start)}: not a sitemap: {exc}") from None
        urls = [e.text.strip() for e in root.iter() if e.tag.endswith("loc") and e.text]
        return [urldefrag(u)[0] for u in urls if self._same_host(u)]

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            return dict(json.loads(self.state_path.read_text()))
        except (OSError, ValueError):
            return {}

    def _save(self, pages: dict[str, dict[str, Any]]) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        keep = {p["sha"] for p in pages.values()}
        for f in self.cache.iterdir():  # bodies no page points at any more
            if len(f.name) == 64 and f.name not in keep:
                f.unlink(missing_ok=True)
        self.state_path.write_text(json.dumps(pages, indent=1, sort_keys=True))


def _key(url: str) -> str:
    parts = urlsplit(url)
    key = parts.path.lstrip("/") or "index"
    if key.endswith("/"):
        key += "index"
    return key + (f"?{parts.query}" if parts.query else "")


def _html_links(url: str, body: bytes) -> tuple[str, list[str]]:
    """(canonical URL, links without fragments) of an HTML page."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(body.decode("utf-8", "replace"))
    canonical = url
    for node in tree.css("link[rel=canonical]"):
        href = node.attributes.get("href")
        if href:
            canonical = urldefrag(urljoin(url, href))[0]
    links = []
    for node in tree.css("a[href]"):
        href = node.attributes.get("href") or ""
        if href.startswith(("mailto:", "javascript:")):
            continue
        links.append(urldefrag(urljoin(url, href))[0])
    return canonical, list(dict.fromkeys(links))
