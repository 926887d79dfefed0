"""Source specs: one location (``--documents``) or a sources file (``RAG_SOURCES``, TOML).

A sources file holds one ``[[source]]`` table per source::

    [[source]]
    name = "handbook"                       # the documents' id prefix: handbook/<key>
    location = "s3://docs-bucket/handbook"   # a folder, s3://, gs://, az://, git+…, https://
    include = ["**/*.md", "**/*.pdf"]        # gitignore-style globs (as RAG_INCLUDE)
    exclude = ["drafts/"]
    schedule = "*/15 * * * *"                # when it is observed (default RAG_REINDEX_CRON)
    link = "https://git.example.com/org/repo/blob/{commit}/{path}#L{line}"
    metadata = { access = "hr", team = "people" }
    max_items = 5000                         # limits, see :class:`Limits`
    max_file_size = 20_000_000
    main_content = true                      # a website: main content only (false: whole pages)

Names are unique and made of ``[A-Za-z0-9_.-]``; relative folder locations are relative to
the sources file.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rag_assets.lib.ingest.sources import SourceError
from rag_assets.lib.models.http import redact

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
OBJECT_SCHEMES = ("s3", "gs", "az")


@dataclass(frozen=True)
class Limits:
    """Per-source limits; each names itself (``max_items=…``) in the note or reason it gives.

    ``max_items``: documents listed (the rest are not indexed, named in a note);
    ``max_bytes``: total bytes of the listed documents; ``max_file_size``: one document (over
    it: that document fails, unread); ``timeout``: seconds per fetch (HTTP request, git command,
    object-store request); ``depth``/``pages``: a website's crawl depth from its start page and
    its page budget; ``rate``: a website's requests per second; ``max_crawl_delay``: the
    longest pause between two requests a website's ``robots.txt`` may ask for (seconds; more
    is capped, and a note says so)."""

    max_items: int = 100_000
    max_bytes: int = 20_000_000_000
    max_file_size: int = 50_000_000
    timeout: float = 30.0
    depth: int = 5
    pages: int = 1000
    rate: float = 5.0
    max_crawl_delay: float = 10.0


@dataclass(frozen=True)
class SourceSpec:
    """One source as configured. ``kind`` is folder, objects, git or web."""

    name: str
    location: str
    kind: str
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    schedule: str = ""
    metadata: dict[str, list[str]] = field(default_factory=dict)
    link: str = ""
    limits: Limits = Limits()
    main_content: bool = True  # a website: main content, less the site's repeated blocks

    def settings_digest(self) -> str:
        """A short hash of what, besides the items, shapes the documents (globs, metadata,
        link, limits): part of the source's data version, so an edit of them is a change."""
        import hashlib
        import json
        from dataclasses import asdict

        shape = [self.include, self.exclude, self.metadata, self.link, asdict(self.limits)]
        if not self.main_content:  # (absent when true: the digest of every index before it)
            shape.append({"main_content": False})
        blob = json.dumps(shape, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def shown(self) -> str:
        """The location as status, logs and errors may show it (credentials redacted)."""
        return shown_location(self.location)


def shown_location(location: str) -> str:
    """``location`` with any user info and query values redacted (else as given)."""
    parts = urlsplit(location) if "://" in location else None
    if parts is None or ("@" not in parts.netloc and not parts.query):
        return location
    return redact(location)


#: where each kind takes its credentials instead of its location (issue 49)
CREDENTIALS_FROM = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN)",
    "gs": "GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS",
    "az": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY)",
    "git": "a Git credential helper (credential.helper, e.g. through GIT_CONFIG_COUNT/"
    "GIT_CONFIG_KEY_0/GIT_CONFIG_VALUE_0) or GIT_ASKPASS; git+ssh:// with an SSH key",
}


def refuse_credentials(location: str, where: str = "") -> None:
    """Refuse a location holding a credential (``s3://KEY:SECRET@bucket``,
    ``git+https://user:token@host/…``): one line naming the variables to use instead, the
    location redacted. Nothing is stored with it (a location reaches the Dagster run config,
    tags, the sources' state and a Git cache's config). Only ``git+ssh://user@host`` (a user,
    no password: the SSH login) is taken."""
    text = location.strip()
    if "://" not in text:
        return
    parts = urlsplit(text)
    userinfo, at, _ = parts.netloc.rpartition("@")
    if not at:
        return
    scheme = parts.scheme.lower()
    if scheme == "git+ssh" and ":" not in userinfo:
        return  # the SSH login name (git@github.com), not a secret
    kind = scheme.removeprefix("git+")
    kind = "git" if scheme.startswith("git+") else ("web" if kind in ("http", "https") else kind)
    use = CREDENTIALS_FROM.get(kind)
    fix = f"give them in {use}" if use else "the website source sends no credentials"
    raise SourceError(
        f"{where}{shown_location(text)}: a location may not hold a user or password (it would be "
        f"stored with the run): remove them; {fix}"
    )


def kind_of(location: str) -> str:
    """folder, objects, git or web."""
    text = location.strip()
    scheme = urlsplit(text).scheme.lower() if "://" in text else ""
    if scheme in OBJECT_SCHEMES:
        return "objects"
    if scheme.startswith("git+"):
        return "git"
    if scheme in ("http", "https"):
        return "web"
    if scheme in ("", "file"):
        return "folder"
    raise SourceError(f"unknown source location {shown_location(text)!r}: give a folder, "
                      "s3://, gs://, az://, git+file://, git+https:// or https://")  # fmt: skip


def is_source_location(location: str) -> bool:
    """Whether ``--documents`` names something other than a local folder."""
    try:
        return kind_of(location) != "folder"
    except SourceError:
        return "://" in location


def default_name(location: str) -> str:
    """The name a single ``--documents`` location gets: its bucket, repository or host."""
    parts = urlsplit(location.removeprefix("git+"))
    if location.startswith("git+"):  # the path without its @ref
        stem = Path(parts.path.rsplit("@", 1)[0].rstrip("/")).name.removesuffix(".git")
    elif kind_of(location) == "web":
        stem = parts.hostname or "web"
    else:
        stem = parts.netloc.rsplit("@", 1)[-1] or Path(parts.path).name
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", stem).strip("-.") or "source"
    return clean[:64]


def single(location: str, include: str = "", exclude: str = "") -> SourceSpec:
    """The spec of one ``--documents`` location (RAG_INCLUDE / RAG_EXCLUDE apply to it)."""
    refuse_credentials(location, "documents location ")
    split = tuple(p.strip() for p in include.split(",") if p.strip())
    excl = tuple(p.strip() for p in exclude.split(",") if p.strip())
    return SourceSpec(default_name(location), location, kind_of(location), split, excl)


_LIMIT_FIELDS = {f.name: f.type for f in fields(Limits)}
_KEYS = {"name", "location", "include", "exclude", "schedule", "metadata", "link", "main_content"}


def load_sources(path: str | Path) -> list[SourceSpec]:
    """The sources of a TOML file; a bad file raises :class:`SourceError` in one line."""
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SourceError(f"RAG_SOURCES={path}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SourceError(f"RAG_SOURCES={path}: not valid TOML: {exc}") from None
    entries = data.get("source", [])
    if not isinstance(entries, list) or not entries:
        raise SourceError(f"RAG_SOURCES={path}: no [[source]] entries")
    specs = [_spec(entry, path.parent, f"RAG_SOURCES={path}") for entry in entries]
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SourceError(f"RAG_SOURCES={path}: source names must be unique: {', '.join(dup)}")
    return specs


def _spec(entry: Any, base: Path, where: str) -> SourceSpec:
    if not isinstance(entry, dict):
        raise SourceError(f"{where}: each [[source]] must be a table")
    name = str(entry.get("name", ""))
    if not NAME_RE.fullmatch(name):
        raise SourceError(f"{where}: source name {name!r}: use letters, digits, _ . - (1-64)")
    unknown = sorted(set(entry) - _KEYS - set(_LIMIT_FIELDS))
    if unknown:
        raise SourceError(f"{where}: source {name}: unknown keys {', '.join(unknown)}")
    location = str(entry.get("location", "")).strip()
    if not location:
        raise SourceError(f"{where}: source {name}: no location")
    refuse_credentials(location, f"{where}: source {name}: ")
    kind = kind_of(location)
    if kind == "folder":
        folder = Path(location.removeprefix("file://")).expanduser()
        location = str(folder if folder.is_absolute() else (base / folder).resolve())
    limits: dict[str, Any] = {}
    for key, typ in _LIMIT_FIELDS.items():
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise SourceError(f"{where}: source {name}: {key} must be a positive number")
            limits[key] = int(value) if typ == "int" else float(value)
    main = entry.get("main_content", True)
    if not isinstance(main, bool):
        raise SourceError(f"{where}: source {name}: main_content must be true or false")
    meta = entry.get("metadata", {})
    if not isinstance(meta, dict):
        raise SourceError(f"{where}: source {name}: metadata must be a table")
    return SourceSpec(
        name=name,
        location=location,
        kind=kind,
        include=_globs(entry.get("include", ()), name, where),
        exclude=_globs(entry.get("exclude", ()), name, where),
        schedule=str(entry.get("schedule", "")),
        metadata={str(k): _values(v) for k, v in meta.items()},
        link=str(entry.get("link", "")),
        limits=Limits(**limits),
        main_content=main,
    )


def _globs(value: Any, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise SourceError(f"{where}: source {name}: include/exclude must be lists of globs")
    return tuple(value)


def _values(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [p.strip() for p in str(value).split(",") if p.strip()] or [str(value)]


def source_specs(
    documents: str, sources: str = "", include: str = "", exclude: str = ""
) -> list[SourceSpec] | None:
    """The sources to index: the sources file's (``RAG_SOURCES``), else the one location
    ``--documents`` names when it is not a folder; None for a plain folder (read as always)."""
    if sources.strip():
        return load_sources(sources.strip())
    if is_source_location(documents):
        return [single(documents.strip(), include, exclude)]
    return None


BUILT_FROM = {"folder": "folder", "objects": "bucket", "git": "git repository", "web": "website"}


def built_from(label: str) -> tuple[str, str]:
    """(what, where) of a :func:`documents_label` for the run summary: ``("sources file",
    "/…/sources.toml")``, ``("website", "https://…")``, ``("bucket", "s3://…")``, ``("git
    repository", "git+…")``, ``("folder", "/…")`` (issue 49: not ``folder:`` for them all)."""
    if label.startswith("sources:"):
        return "sources file", label.removeprefix("sources:")
    try:
        return BUILT_FROM[kind_of(label)], label
    except SourceError:
        return "folder", label


def documents_label(documents: str, sources: str = "") -> str:
    """What an index records it is built from (``status``, the run tag ``rag/documents``, the
    refusal to publish another one): ``sources:<file>``, a location (redacted), or a folder."""
    if sources.strip():
        return f"sources:{Path(sources.strip()).expanduser().resolve()}"
    if is_source_location(documents):
        return shown_location(documents.strip())
    return str(Path(documents).expanduser().resolve())
