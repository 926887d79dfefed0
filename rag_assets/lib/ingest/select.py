"""Which files of the documents folder are indexed: include/exclude globs and ``.ragignore``.

Patterns are gitignore-style, matched against a file's path relative to the folder (``/``
separated): ``*`` and ``?`` never cross a ``/``, ``**`` does (``**/`` also matches no folder);
a pattern without a ``/`` (other than a trailing one) matches the name at any depth
(``*.png``, ``drafts/``); one with a ``/`` is anchored at the folder (``/notes/*.md`` and
``notes/*.md`` are the same); a trailing ``/`` matches a folder and everything below it.

* ``RAG_INCLUDE`` (comma-separated): when set, only files matching one of them are indexed.
* ``RAG_EXCLUDE`` (comma-separated) and the lines of ``<folder>/.ragignore`` (``#`` comments,
  blank lines ignored, ``!pattern`` re-includes what an earlier line excluded; the last match
  wins, as in gitignore): matching files are not indexed.

A file left out is not a document at all (its rows go, like a deleted file's); changing the
patterns re-extracts only the files they add. :meth:`Selection.describe` is what ``status`` and
the run tags show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

IGNORE_FILE = ".ragignore"


def _regex(pattern: str) -> re.Pattern[str]:
    dir_only = pattern.endswith("/")
    p = pattern.strip("/") if dir_only else pattern.lstrip("/")
    anchored = "/" in p or pattern.startswith("/")
    out = ""
    i = 0
    while i < len(p):
        c = p[i]
        if p.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if p.startswith("**", i):
            out += ".*"
            i += 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = p.find("]", i + 1)
            if j < 0:
                out += re.escape(c)
            else:
                out += "[" + p[i + 1 : j].replace("!", "^", 1) + "]"
                i = j
        else:
            out += re.escape(c)
        i += 1
    head = "" if anchored else "(?:.*/)?"
    tail = "/.*" if dir_only else "(?:/.*)?"  # a folder's name matches everything below it
    return re.compile(f"^{head}{out}{tail}$")


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


@dataclass(frozen=True)
class Selection:
    """Include globs, then exclude rules (``(negated, pattern)`` in order, last match wins)."""

    include: tuple[str, ...] = ()
    exclude: tuple[tuple[bool, str], ...] = ()
    sources: tuple[str, ...] = field(default=())  # where the rules came from

    @classmethod
    def for_folder(cls, root: Path, include: str = "", exclude: str = "") -> Selection:
        """RAG_INCLUDE / RAG_EXCLUDE values plus ``root/.ragignore`` when it exists."""
        rules = [(False, p) for p in _split(exclude)]
        sources = ["RAG_INCLUDE"] * bool(include.strip()) + ["RAG_EXCLUDE"] * bool(rules)
        ignore = Path(root) / IGNORE_FILE
        if ignore.is_file():
            sources.append(IGNORE_FILE)
            for line in ignore.read_text(encoding="utf-8", errors="replace").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                rules.append((True, line[1:]) if line.startswith("!") else (False, line))
        return cls(tuple(_split(include)), tuple(rules), tuple(sources))

    def wants(self, rel: str) -> bool:
        """Whether the file at ``rel`` (relative, ``/``-separated) is indexed."""
        if self.include and not any(_regex(p).match(rel) for p in self.include):
            return False
        out = True
        for negated, pattern in self.exclude:
            if _regex(pattern).match(rel):
                out = negated
        return out

    def describe(self) -> dict[str, list[str]]:
        """The rules as ``status`` shows them (empty lists: every file is indexed)."""
        return {
            "include": list(self.include),
            "exclude": [("!" if neg else "") + p for neg, p in self.exclude],
            "sources": list(self.sources),
        }

    def tag(self) -> str:
        """One line for the run tags (``rag/selection``)."""
        d = self.describe()
        if not d["include"] and not d["exclude"]:
            return "all files"
        return f"include={','.join(d['include']) or '*'}; exclude={','.join(d['exclude'])}"
