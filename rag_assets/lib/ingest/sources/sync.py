"""Sources into documents (issue 41): list each source, reuse what did not change, read and
extract the rest, and decide what a listing may delete.

The rules (docs/sources.md):

- A document's id is ``<source name>/<key>``; its ``path`` is the URL a citation opens; its
  ``source_hash`` is the item's content identity, so an item whose identity is unchanged is
  reused without being read (``reused``), and only new or changed items are read (``read``).
- A source that does not answer (an unreachable bucket, a failed fetch, refused credentials, a
  deleted branch) fails alone: one line naming it and the cause; its documents stay exactly as
  they were (never read as deleted), and its state records since when it is stale.
- A deletion is a deletion only when the source answered and the item is gone. A listing that
  would delete more than ``max_delete_share`` of a source's documents applies its additions and
  changes, keeps the documents it would delete (``withheld``) and says how many and how to
  confirm (``RAG_SOURCE_CONFIRM_DELETE=<name>``).
- Limits name themselves: ``max_items`` and ``max_bytes`` leave the rest of a listing out (a
  note), ``max_file_size`` fails that document unread, ``timeout`` fails that fetch.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rag_assets.lib.ingest.extract import (
    DEFAULT_OCR_MIN_CONFIDENCE,
    FolderExtraction,
    _escaped,
    _extractor_for,
    extract_document,
    extractor_version,
)
from rag_assets.lib.ingest.metadata import (
    MetadataError,
    MetaRules,
    merge,
    read_rules,
    rules_from,
    system_facts,
)
from rag_assets.lib.ingest.select import Selection
from rag_assets.lib.ingest.sources import Item, Listing, Source, SourceError
from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.ingest.sources.state import Keep, load_state, save_state
from rag_assets.lib.types import ExtractedDocument

#: Default share of a source's documents one listing may delete (RAG_SOURCE_MAX_DELETE_SHARE).
DEFAULT_MAX_DELETE_SHARE = 0.5


@dataclass
class SourceReport:
    """What one source did in one run (run metadata, status, bench)."""

    name: str
    kind: str
    location: str  # redacted
    ok: bool = True
    error: str = ""
    state: str = ""
    listed: int = 0
    read: int = 0
    reused: int = 0
    read_bytes: int = 0
    deleted: int = 0
    withheld: int = 0
    notes: list[str] = field(default_factory=list)
    list_seconds: float = 0.0
    last_good: str = ""
    stale_since: str = ""
    reused_ids: set[str] = field(default_factory=set, repr=False)

    def line(self) -> str:
        """One line for the log and the run summary."""
        if not self.ok:
            since = f" (stale since {self.stale_since})" if self.stale_since else ""
            return f"source {self.name}: FAILED: {self.error}; its documents are kept{since}"
        out = (f"source {self.name}: {self.listed} listed, {self.read} read, {self.reused} "
               f"unchanged, {self.deleted} deleted")  # fmt: skip
        if self.withheld:
            out += (f"; {self.withheld} deletions WITHHELD (over the share a run may delete): "
                    f"confirm with RAG_SOURCE_CONFIRM_DELETE={self.name}")  # fmt: skip
        return out

    def lines(self) -> list[str]:
        """:meth:`line` and, below it, the source's notes (robots.txt, the page budget,
        redirects, limits: issue 49), at most :data:`SHOWN_NOTES` of them."""
        notes = [f"  note: {n}" for n in self.notes[:SHOWN_NOTES]]
        if len(self.notes) > SHOWN_NOTES:
            notes.append(f"  note: and {len(self.notes) - SHOWN_NOTES} more (the run's "
                         "metadata `sources` lists them all)")  # fmt: skip
        return [self.line(), *notes]


SHOWN_NOTES = 8  # notes of one source in the run summary (all of them: the run's metadata)


@dataclass
class SourcesExtraction(FolderExtraction):
    sources: list[SourceReport] = field(default_factory=list)


def open_source(spec: SourceSpec, work_dir: str | Path) -> Source:
    """The :class:`~rag_assets.lib.ingest.sources.Source` of ``spec`` (its cache folder is
    ``<work_dir>/sources/<name>``)."""
    from rag_assets.lib.ingest.sources.config import refuse_credentials

    refuse_credentials(spec.location, f"source {spec.name}: ")  # issue 49: never stored
    cache = Path(work_dir) / "sources" / spec.name
    if spec.kind == "objects":
        from rag_assets.lib.ingest.sources.objects import ObjectSource

        return ObjectSource(spec)
    if spec.kind == "git":
        from rag_assets.lib.ingest.sources.git import GitSource

        return GitSource(spec, cache)
    if spec.kind == "web":
        from rag_assets.lib.ingest.sources.web import WebSource

        return WebSource(spec, cache)
    from rag_assets.lib.ingest.sources.folder import FolderSource

    return FolderSource(spec)


def list_source(
    spec: SourceSpec, work_dir: str | Path, run_id: str = "", keep: Keep | None = None
) -> tuple[Source, Listing]:
    """Open and list one source (its include/exclude and item limits applied); ``keep`` holds
    the sources' state (default: ``work_dir``), where a Git source's last commit is.

    With ``run_id`` (a Dagster run's), the listing is kept in the source's folder and a second
    call in the same run (the extraction after the observation) takes it instead of listing
    again: a website is crawled once per run, a Git remote fetched once, a bucket listed once,
    and the run extracts exactly what its observation recorded as the data version."""
    source = open_source(spec, work_dir)
    listing = _observed(spec, work_dir, run_id) if run_id else None
    if listing is None:
        last = load_state(keep or work_dir).get(spec.name, {}).get("commit", "")
        listing = source.list_items(last) if spec.kind == "git" else source.list_items()  # type: ignore[call-arg]
        if run_id:
            _keep(spec, work_dir, run_id, listing)
    select = Selection(spec.include, tuple((False, p) for p in spec.exclude))
    items = [i for i in listing.items if select.wants(i.key) and _safe(i.key)]
    limits = spec.limits
    if len(items) > limits.max_items:
        listing.notes.append(f"limit max_items={limits.max_items:,} reached: "
                             f"{len(items) - limits.max_items:,} items not indexed")  # fmt: skip
        items = items[: limits.max_items]
    total, kept = 0, list[Item]()
    for item in items:
        total += item.size or 0
        if total > limits.max_bytes:
            listing.notes.append(f"limit max_bytes={limits.max_bytes:,} reached: "
                                 f"{len(items) - len(kept):,} items not indexed")  # fmt: skip
            break
        kept.append(item)
    listing.items = kept
    return source, listing


LISTING_FILE = "listing.json"  # in <work_dir>/sources/<name>/: the run's listing (see above)


def _listing_path(spec: SourceSpec, work_dir: str | Path) -> Path:
    return Path(work_dir) / "sources" / spec.name / LISTING_FILE


def _keep(spec: SourceSpec, work_dir: str | Path, run_id: str, listing: Listing) -> None:
    path = _listing_path(spec, work_dir)
    data = {"run_id": run_id, "location": _digest(spec.location),
            "settings": spec.settings_digest(), "items": [asdict(i) for i in listing.items],
            "state": listing.state, "notes": listing.notes, "info": listing.info,
            "meta": [asdict(i) for i in listing.meta]}  # fmt: skip
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except (OSError, TypeError, ValueError):
        pass  # not kept: the extraction lists the source again


def _digest(location: str) -> str:
    """The location as the kept listing names it (a token inside it is not written out)."""
    return hashlib.sha256(location.encode()).hexdigest()[:16]


def _observed(spec: SourceSpec, work_dir: str | Path, run_id: str) -> Listing | None:
    """The listing this run's observation of ``spec`` kept, or None (listed again)."""
    try:
        data = json.loads(_listing_path(spec, work_dir).read_text())
        if (data["run_id"], data["location"], data["settings"]) != (
            run_id,
            _digest(spec.location),
            spec.settings_digest(),
        ):
            return None
        items = [Item(**i) for i in data["items"]]
        meta = [Item(**i) for i in data.get("meta", [])]
        return Listing(items, data["state"], list(data["notes"]), dict(data["info"]), meta)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def failure_cause(exc: BaseException, spec: SourceSpec) -> str:
    """Why a source failed, on one line, with any user info of its location masked."""
    text = str(exc) if isinstance(exc, SourceError) else f"{type(exc).__name__}: {exc}"
    if "://" in spec.location:
        user = urlsplit(spec.location.removeprefix("git+")).netloc.rpartition("@")[0]
        if user:
            text = text.replace(user, "***")
    return " ".join(text.split())


def _safe(key: str) -> bool:
    return bool(key) and all(p not in ("", ".", "..") for p in key.split("/"))


def extract_sources(
    specs: Sequence[SourceSpec],
    previous: dict[str, ExtractedDocument],
    work_dir: str | Path,
    *,
    ocr_min_confidence: float = DEFAULT_OCR_MIN_CONFIDENCE,
    max_delete_share: float = DEFAULT_MAX_DELETE_SHARE,
    confirm_delete: Sequence[str] = (),
    progress: Callable[[int, int, str], None] | None = None,
    log: Callable[[str], None] | None = None,
    run_id: str = "",
    keep: Keep | None = None,
) -> SourcesExtraction:
    """Every source's documents (sorted by id), each source failing alone (see the module);
    with ``run_id``, each source's listing is the one its observation in that run kept.

    ``work_dir`` holds the sources' caches (a Git clone, fetched pages, the run's listing);
    ``keep`` their state between runs (default: ``work_dir``; the graph passes the index's
    artefacts, so the state is in the bucket for an object-store index)."""
    keep_at = keep or work_dir
    state = load_state(keep_at)
    documents: list[ExtractedDocument] = []
    reused: list[str] = []
    reports = []
    for spec in specs:
        report = SourceReport(spec.name, spec.kind, spec.shown)
        old = {k: d for k, d in previous.items() if k.startswith(spec.name + "/")}
        started = time.monotonic()
        try:
            source, listing = list_source(spec, work_dir, run_id, keep)
        except Exception as exc:  # noqa: BLE001 - one source fails alone, whatever the cause
            report.ok = False
            report.error = failure_cause(exc, spec)
            documents += old.values()  # published as they were: never read as deleted
            reports.append(_record(state, spec, report))
            if log:
                log(report.line())
            continue
        report.list_seconds = time.monotonic() - started
        report.state, report.notes = listing.state, list(listing.notes)
        report.listed = len(listing.items)
        rules = source_rules(spec, source, listing)
        docs = _documents(
            spec, source, listing.items, old, report, ocr_min_confidence, progress, rules
        )
        reused += [d.document_id for d in docs if d.document_id in report.reused_ids]
        gone = sorted(set(old) - {d.document_id for d in docs})
        confirmed = spec.name in confirm_delete or "all" in confirm_delete
        if gone and len(gone) > max_delete_share * len(old) and not confirmed:
            report.withheld = len(gone)
            docs += [old[k] for k in gone]
        else:
            report.deleted = len(gone)
        documents += docs
        reports.append(_record(state, spec, report, listing.info))
        if log:
            log(report.line())
            for note in report.notes:
                log(f"source {spec.name}: {note}")
    save_state(keep_at, state, [s.name for s in specs])
    documents.sort(key=lambda d: d.document_id)
    return SourcesExtraction(documents, reused, reports)


def _documents(
    spec: SourceSpec,
    source: Source,
    items: list[Item],
    old: dict[str, ExtractedDocument],
    report: SourceReport,
    ocr_min_confidence: float,
    progress: Callable[[int, int, str], None] | None,
    rules: MetaRules | None = None,
) -> list[ExtractedDocument]:
    out = []
    with tempfile.TemporaryDirectory(prefix="rag-source-") as tmp:
        for i, item in enumerate(items):
            doc_id = f"{spec.name}/{item.key}"
            if progress is not None:
                progress(i, len(items), doc_id)
            extractor = _extractor_for(Path(temp_name(item)))[1]
            version = extractor_version(extractor, ocr_min_confidence)
            prev = old.get(doc_id)
            if (
                prev is not None
                and prev.ok
                and prev.source_hash == item.identity
                and (prev.extractor_version == version)
            ):
                report.reused += 1
                report.reused_ids.add(doc_id)
                facts = {k: prev.metadata[k][0] for k in ("commit", "etag") if prev.metadata.get(k)}
                # issue 49: its link as the source gives it now (a new `link` template):
                # the citation changes, nothing is read or embedded again
                out.append(_with_metadata(replace(prev, path=item.url), spec, facts, rules))
                continue
            out.append(_read_one(spec, source, item, doc_id, Path(tmp), report, ocr_min_confidence))
            out[-1] = _with_metadata(
                out[-1],
                spec,
                {k: v for k, v in item.facts.items() if k in ("commit", "etag") and v},
                rules,
            )
    if progress is not None:
        progress(len(items), len(items), "")
    return out


def source_rules(spec: SourceSpec, source: Source, listing: Listing) -> MetaRules:
    """The ``.ragmeta`` rules of a source's tree (issue 49): a folder's files, a Git commit's
    or a bucket prefix's ``.ragmeta`` items (read each run: a few small files); one that
    cannot be read fails every document under its folder, as in a folder."""
    if spec.kind == "folder":
        return read_rules(Path(spec.location))
    files: dict[str, bytes | str] = {}
    for item in listing.meta:
        folder = item.key.rpartition("/")[0]
        try:
            files[folder] = source.read(item)
        except SourceError as exc:
            files[folder] = str(exc)
    return rules_from(files)


def _file_name(item: Item) -> Path:
    """The relative file name an item is extracted as (its extension picks the extractor)."""
    return Path(item.key + (item.suffix if not item.key.endswith(item.suffix) else ""))


MAX_NAME_BYTES = 100
"""Longest stem of the temporary file an item is extracted from (issue 49: nothing an item is
called becomes a longer file name; a 300-character key is cut, its extension kept)."""
MAX_SUFFIX_CHARS = 12  # a longer "extension" picks no extractor anyway


def temp_name(item: Item) -> str:
    """The file name an item's bytes are extracted from: the last segment of its key (bytes a
    file system cannot name escaped, cut to :data:`MAX_NAME_BYTES`), with the extension that
    picks its extractor. The stem is a title's last resort (a page without ``<title>``)."""
    name = _escaped(_file_name(item).name)
    suffix = Path(name).suffix if len(Path(name).suffix) <= MAX_SUFFIX_CHARS else ""
    stem = name[: len(name) - len(suffix)]
    stem = stem.encode("utf-8")[:MAX_NAME_BYTES].decode("utf-8", "ignore").strip()
    if not stem or stem.startswith("."):
        stem = "document" + stem
    return stem + suffix


def _read_one(
    spec: SourceSpec,
    source: Source,
    item: Item,
    doc_id: str,
    tmp: Path,
    report: SourceReport,
    ocr_min_confidence: float,
) -> ExtractedDocument:
    """Read one item's bytes and extract them as a file of its own (:func:`temp_name`) in a
    folder of its own; whatever goes wrong fails this item alone, with its reason."""
    folder = Path(tempfile.mkdtemp(dir=tmp))
    path = folder / temp_name(item)
    kind, name = _extractor_for(path)
    limit = spec.limits.max_file_size
    version = extractor_version(name, ocr_min_confidence)

    def failed(why: str) -> ExtractedDocument:
        return ExtractedDocument(
            doc_id, item.url, kind, "failed", f"source {spec.name}: {why}", name, version,
            item.identity,
        )  # fmt: skip

    try:
        if item.size is not None and item.size > limit:
            raise SourceError(f"{item.size:,} bytes, over max_file_size={limit:,}: not read")
        data = source.read(item)
    except SourceError as exc:
        return failed(str(exc))
    except Exception as exc:  # noqa: BLE001 - one item fails alone, whatever the cause
        return failed(f"cannot read it: {type(exc).__name__}: {exc}")
    report.read += 1
    report.read_bytes += len(data)
    try:
        path.write_bytes(data)
        doc = extract_document(path, folder, max_bytes=limit, ocr_min_confidence=ocr_min_confidence)
    except OSError as exc:  # the scratch folder (full, gone): this item fails alone
        return failed(f"cannot extract it: {exc.strerror or exc}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return replace(doc, document_id=doc_id, path=item.url, source_hash=item.identity)


def _with_metadata(
    doc: ExtractedDocument, spec: SourceSpec, facts: dict[str, str], rules: Any
) -> ExtractedDocument:
    """System facts, the source's default metadata (``access = "hr"``), the ``.ragmeta``
    lines of its tree (every kind but a website, issue 49), the item's facts (``commit``,
    ``etag``), and the document's front matter, later winning per key."""
    base = system_facts(doc.document_id, doc.kind, None, doc.title)
    given: dict[str, list[str]] = {**spec.metadata, "source": [spec.name]}
    if rules is not None:
        try:
            given.update(rules.for_document(doc.document_id.split("/", 1)[1]))
        except MetadataError as exc:
            return replace(doc, status="failed", reason=f"metadata: {exc}", text="", metadata=base)
    given.update({k: [v] for k, v in facts.items()})
    return replace(doc, metadata=merge(base, given, doc.front_matter))


# -- the sources' state (status: stale since) ------------------------------------------------
def _record(
    state: dict[str, dict[str, Any]],
    spec: SourceSpec,
    report: SourceReport,
    info: dict[str, Any] | None = None,
) -> SourceReport:
    """Update ``state`` with one source's outcome; the report gets its last good time."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = dict(state.get(spec.name, {}))
    entry.update(kind=spec.kind, location=spec.shown)
    if report.ok:
        entry.update(last_good=now, stale_since="", error="", state=report.state,
                     withheld=report.withheld, notes=report.notes, **(info or {}))  # fmt: skip
    else:
        entry.update(error=report.error, stale_since=entry.get("stale_since") or now)
    state[spec.name] = entry
    report.last_good, report.stale_since = entry.get("last_good", ""), entry.get("stale_since", "")
    return report


def as_metadata(reports: Sequence[SourceReport]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(r).items() if k != "reused_ids"} for r in reports]
