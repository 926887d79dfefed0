"""A website as a source: ``https://host/start`` (crawled) or ``https://host/sitemap.xml``.

Pages on the start's host only (scheme, host and port), ``robots.txt`` obeyed as RFC 9309 reads
it (protego: the longest rule wins, ``*`` and ``$`` patterns; its redirects followed up to five
hops on the host; a 4xx: no rules; a 5xx or no answer: the site is disallowed, so the source
fails and keeps its documents; a ``Crawl-delay`` capped at ``max_crawl_delay``), at most
``pages`` fetches and ``depth`` links from the start (or the sitemap's pages), at most ``rate``
requests a second, each whole fetch within ``timeout`` seconds (:mod:`.fetch`). Links are
resolved as a browser resolves them (:func:`.fetch.resolve`: spaces and non-ASCII
percent-encoded). Redirects are followed on the same host; a page's ``<link rel="canonical">``
on that host is its address (two URLs of one page are one document). HTML pages are read for
links; PDFs (and text) linked from them are documents too, read by the same extractors as
files. An HTML page is indexed by its main content, less the blocks most pages of the site
repeat (:mod:`.boilerplate`; ``main_content = false`` in its ``[[source]]`` keeps whole pages).

Re-fetches are conditional: the ``ETag`` and ``Last-Modified`` of the last fetch go back as
``If-None-Match`` / ``If-Modified-Since``; a ``304`` reuses the page kept in the source's cache
folder (and its links), so an unchanged page is never downloaded again. A page's content
identity is its ETag, else its Last-Modified, else the sha256 of its bytes. A page that answers
404 or 410 is gone (its document is deleted); one that fails otherwise (a timeout, a 5xx) keeps
its last fetch and is named in a note (whatever the cause: a link that cannot be fetched fails
alone). The start page (or sitemap) failing fails the source.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from protego import Protego

from rag_assets.lib.ingest.sources import (
    Item,
    LimitHit,
    Listing,
    SourceError,
    boilerplate,
    digest_items,
)
from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.ingest.sources.fetch import USER_AGENT, Answer, Fetcher, resolve
from rag_assets.lib.models.http import redact

_TYPES = {"text/html": ".html", "application/xhtml+xml": ".html", "application/pdf": ".pdf",
          "text/plain": ".txt", "text/markdown": ".md"}  # fmt: skip
_REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5  # hops followed, for a page and for robots.txt (RFC 9309 asks for five)
SHOWN_EXAMPLES = 3  # URLs named in a note that counts many (pages disallowed, links unread)


class WebSource:
    def __init__(self, spec: SourceSpec, cache: Path):
        self.spec = spec
        self.start = resolve(spec.location.strip(), spec.location.strip()) or spec.location
        parts = urlsplit(self.start)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.cache = Path(cache)
        self.state_path = self.cache / "pages.json"
        self._http = Fetcher(spec.limits.timeout, spec.limits.max_file_size)
        self._last = 0.0
        self._delay = 1.0 / spec.limits.rate

    @property
    def fetched(self) -> int:
        """Requests sent (bench: items listed per second)."""
        return self._http.fetched

    @property
    def downloaded(self) -> int:
        """Bytes of bodies received (a 304 is 0)."""
        return self._http.downloaded

    # -- HTTP -----------------------------------------------------------------------------------
    def _get(self, url: str, headers: dict[str, str] | None = None) -> Answer:
        wait = self._last + self._delay - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            return self._http.get(url, headers)
        finally:
            self._last = time.monotonic()

    def _follow(self, url: str, headers: dict[str, str] | None = None) -> tuple[str, Answer]:
        """GET with redirects followed on the same host (at most :data:`MAX_REDIRECTS`); an
        answer of status -1: the redirect left the host (not followed)."""
        for _ in range(MAX_REDIRECTS + 1):
            got = self._get(url, headers)
            if got.status in _REDIRECTS and got.headers.get("location"):
                target = resolve(url, got.headers["location"])
                if target is None or not self._same_host(target):
                    return target or url, Answer(-1, got.headers, b"")  # left the host
                url = target
                continue
            return url, got
        raise SourceError(f"{redact(url)}: more than {MAX_REDIRECTS} redirects")

    def _same_host(self, url: str) -> bool:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}" == self.origin

    # -- the interface --------------------------------------------------------------------------
    def list_items(self) -> Listing:
        self._http = Fetcher(self.spec.limits.timeout, self.spec.limits.max_file_size)
        try:
            return self._crawl()
        finally:
            self._http.close()

    def _crawl(self) -> Listing:
        limits = self.spec.limits
        cache = self._load()
        notes: list[str] = []
        robots = self._robots(notes)
        delay = robots.crawl_delay(USER_AGENT)
        if delay:
            if float(delay) > limits.max_crawl_delay:
                notes.append(f"robots.txt asks for Crawl-delay: {float(delay):g}s, capped at "
                             f"max_crawl_delay={limits.max_crawl_delay:g}s")  # fmt: skip
            self._delay = max(self._delay, min(float(delay), limits.max_crawl_delay))
        seeds = self._sitemap() if self.start.endswith(".xml") else [self.start]
        queue = deque((u, 0) for u in seeds)
        seen: set[str] = set(seeds)
        pages: dict[str, dict[str, Any]] = {}
        disallowed: list[str] = []
        left: list[str] = []
        first = True
        budget_hit = False
        while queue:
            url, depth = queue.popleft()
            if not robots.can_fetch(url, USER_AGENT):
                disallowed.append(url)
                continue
            if self.fetched >= limits.pages:
                budget_hit = True
                break
            old = cache.get(url)
            try:
                page = self._page(url, old, left)
            except Exception as exc:  # noqa: BLE001 - one page fails alone, whatever the cause
                if first and not self.start.endswith(".xml"):
                    raise
                why = str(exc) if isinstance(exc, SourceError) else (
                    f"{redact(url)}: {type(exc).__name__}: {exc}")  # fmt: skip
                notes.append(f"{why}: its last fetch is kept" if old else why)
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
        notes += _counted(disallowed, "disallowed by robots.txt")
        notes += _counted(left, "redirected to another host: not followed")
        if budget_hit:  # pages fetched before and not this time stay as they were
            notes.append(f"page budget pages={limits.pages} reached: {len(queue) + 1} pages "
                         "not fetched (those fetched before are kept)")  # fmt: skip
            pages.update({u: cache[u] for u in [url, *(u for u, _ in queue)] if u in cache})
        self._save(pages)
        items = self._items(pages)
        return Listing(items, digest_items(items), notes)

    def _page(self, url: str, old: dict[str, Any] | None, left: list[str]) -> dict[str, Any] | None:
        headers = {}
        if old and old.get("etag"):
            headers["If-None-Match"] = old["etag"]
        if old and old.get("modified"):
            headers["If-Modified-Since"] = old["modified"]
        final, got = self._follow(url, headers)
        status, head, body = got.status, got.headers, got.body
        if status == -1:
            left.append(url)
            return None
        if status == 304 and old:
            if self.spec.main_content and "blocks" not in old and old.get("suffix") == ".html":
                old = {**old, "blocks": self._blocks(old.get("sha", ""))}  # kept before issue 49
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
        page: dict[str, Any] = {}
        if suffix == ".html":
            canonical, links = _html_links(final, body)
            canonical = canonical if self._same_host(canonical) else final
            if self.spec.main_content:
                page["blocks"] = boilerplate.page_signatures(body)
        identity = (f"etag:{head['etag']}" if head.get("etag")
                    else f"modified:{head['last-modified']}" if head.get("last-modified")
                    else f"sha256:{sha}")  # fmt: skip
        return page | {"url": url, "canonical": canonical, "etag": head.get("etag", ""),
                       "modified": head.get("last-modified", ""), "identity": identity,
                       "sha": sha, "suffix": suffix, "links": links, "size": len(body)}  # fmt: skip

    def _blocks(self, sha: str) -> list[str]:
        try:
            return boilerplate.page_signatures((self.cache / sha).read_bytes())
        except OSError:
            return []

    def _items(self, pages: dict[str, dict[str, Any]]) -> list[Item]:
        frame = boilerplate.repeated(
            p.get("blocks", []) for p in pages.values() if p["suffix"] == ".html"
        ) if self.spec.main_content else frozenset()  # fmt: skip
        by_key: dict[str, Item] = {}
        for page in pages.values():
            key = _key(page["canonical"])
            if key in by_key:
                continue
            identity, facts = page["identity"], {"sha": page["sha"]}
            if self.spec.main_content and page["suffix"] == ".html":
                mine = sorted(set(page.get("blocks", [])) & frame)
                identity += "|" + boilerplate.dropped_digest(mine, frame)
                facts["drop"] = ",".join(mine)
            by_key[key] = Item(key, identity, page["size"], page["canonical"], facts,
                               page["suffix"])  # fmt: skip
        return [by_key[k] for k in sorted(by_key)]

    def read(self, item: Item) -> bytes:
        try:
            body = (self.cache / item.facts["sha"]).read_bytes()
        except (OSError, KeyError):
            raise SourceError(
                f"{redact(item.url)}: its fetched copy is gone from the cache"
            ) from None
        if self.spec.main_content and item.suffix == ".html":
            drop = [s for s in item.facts.get("drop", "").split(",") if s]
            return boilerplate.main_content(body, drop)
        return body

    def _robots(self, notes: list[str]) -> Protego:
        """The site's rules (RFC 9309): its redirects followed on the host (five hops); a 4xx
        is no rules; a 5xx, an answer from another host or none at all: the source fails (the
        site is disallowed, its documents are kept)."""
        url = self.origin + "/robots.txt"
        for _ in range(MAX_REDIRECTS + 1):
            got = self._get(url)
            if got.status not in _REDIRECTS or not got.headers.get("location"):
                break
            target = resolve(url, got.headers["location"])
            if target is None or not self._same_host(target):
                raise SourceError(
                    f"{redact(url)} redirects to {redact(target or got.headers['location'])}, "
                    "another host, which a run never contacts: name that host in the location"
                )
            url = target
        else:  # RFC 9309 2.3.1.2: past five redirects robots.txt may be taken as unavailable
            notes.append(f"{redact(url)}: more than {MAX_REDIRECTS} redirects: no rules applied")
            return Protego.parse("")
        if 200 <= got.status < 300:
            return Protego.parse(got.body.decode("utf-8", "replace"))
        if 400 <= got.status < 500:  # unavailable: no rules (RFC 9309 2.3.1.3)
            return Protego.parse("")
        raise SourceError(  # unreachable: complete disallow (RFC 9309 2.3.1.4)
            f"{redact(url)}: HTTP {got.status}: robots.txt unreachable, so the site is "
            "disallowed (RFC 9309) until it answers"
        )

    def _sitemap(self) -> list[str]:
        import xml.etree.ElementTree as ET

        _, got = self._follow(self.start)
        if got.status != 200:
            raise SourceError(f"{redact(self.start)}: HTTP {got.status}")
        try:
            root = ET.fromstring(got.body)
        except ET.ParseError as exc:
            raise SourceError(f"{redact(self.start)}: not a sitemap: {exc}") from None
        locs = [e.text.strip() for e in root.iter() if e.tag.endswith("loc") and e.text]
        urls = [resolve(self.start, u) for u in locs]
        return list(dict.fromkeys(u for u in urls if u and self._same_host(u)))

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


def _counted(urls: list[str], what: str) -> list[str]:
    """One note for many URLs: how many, and the first few."""
    if not urls:
        return []
    shown = ", ".join(redact(u) for u in urls[:SHOWN_EXAMPLES])
    more = f" and {len(urls) - SHOWN_EXAMPLES} more" if len(urls) > SHOWN_EXAMPLES else ""
    return [f"{len(urls)} page{'s' if len(urls) != 1 else ''} {what}: {shown}{more}"]


def _key(url: str) -> str:
    """The document key of a page's URL: its path (``index`` for a folder's), its segments'
    percent-escapes decoded where that gives readable UTF-8 (``caf%C3%A9.html`` is
    ``café.html``), and its query."""
    parts = urlsplit(url)
    key = "/".join(_readable(seg) for seg in parts.path.lstrip("/").split("/")) or "index"
    if key.endswith("/"):
        key += "index"
    return key + (f"?{parts.query}" if parts.query else "")


def _readable(segment: str) -> str:
    try:
        text = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return segment
    if text in (".", "..") or any(c in "/?#%\x7f" or ord(c) < 0x20 for c in text):
        return segment
    return text


def _html_links(url: str, body: bytes) -> tuple[str, list[str]]:
    """(canonical URL, links without fragments) of an HTML page, each resolved as a browser
    resolves it (:func:`.fetch.resolve`); a link that cannot be is not followed."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(body.decode("utf-8", "replace"))
    canonical = url
    for node in tree.css("link[rel=canonical]"):
        href = node.attributes.get("href")
        found = resolve(url, href) if href else None
        if found:
            canonical = found
    links = [resolve(url, node.attributes.get("href") or "") for node in tree.css("a[href]")]
    return canonical, list(dict.fromkeys(u for u in links if u))
