"""The folders of the day-0 refusal benchmark (issue 53): real documents, hand-written questions.

``python -m rag_assets.bench.day0_folders DEST [NAME ...]`` assembles every folder (or the named
ones) into ``DEST/documents/NAME`` and its question set into ``DEST/questions/NAME``, and prints
one line per folder (documents, questions, near and unrelated out-of-domain queries, licence), or
why it was skipped.

Each folder is built, deterministically, from files already on the machine: Debian's packaged
manuals (``/usr/share/doc``, ``/usr/share/info``, ``/usr/share/man``) or the project's development
data in ``../shared`` beside the repository (the course corpus, the PDFs, BEIR SciFact). The
repository holds only this registry, each source file's sha256 (:data:`SOURCES_FILE`) and the
question sets (``day0_data/<name>/``, with a README naming sources and licences); no document is
copied into it. A source whose sha256 differs from the recorded one (another package version)
stops :func:`assemble` with one line (:class:`SourceChanged`): the needles were copied from the
recorded version. An absent source (package not installed, no ``../shared``) raises
:class:`FolderUnavailable`, whose message is the reason to skip the folder.

Conversions use the standard library and groff only:

* ``html``, ``copy``: the files as they are (the extractor reads HTML, Markdown and PDF);
* ``info``: a GNU info manual (``.info.gz``) split at its nodes (``\\x1f``), one Markdown file per
  chapter (a node whose ``Up`` is ``Top``, with the sections below it): the node header lines and
  menus dropped, chapter and section titles as ``#``/``##`` headings (deeper ones ``###``), and
  every filled paragraph joined onto one line (:func:`unfill`), so that a sentence is on one
  line; examples keep their lines;
* ``man``: each page rendered at assembly time by :data:`MAN_COMMAND` (a line length of 1000
  characters and no hyphenation, so that a paragraph is one line; no overstrikes, no escape
  sequences), trailing blanks and runs of blank lines dropped, the title and footer lines'
  padding collapsed;
* ``beir``: :data:`BEIR_TAKE` abstracts of a BEIR corpus chosen by the sha256 of their ids, one
  ``<id>.txt`` each: the title on the first line, a blank line, the abstract.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The repository root; ``../shared`` paths are found beside it.
REPO = Path(__file__).resolve().parents[2]
SHARED_PREFIX = "../shared/"  # a registry path under ../shared beside the repository
#: The question sets (package data).
DATA = Path(__file__).resolve().parent / "day0_data"
DATA_PREFIX = "day0_data/"
#: The held-out off-topic questions, one a line.
UNRELATED_TEST = DATA / "unrelated_test.txt"
#: The sha256 of every source file, in ``sha256sum`` format (``sha256sum -c`` checks it from the
#: repository root).
SOURCES_FILE = DATA / "sources.sha256"

#: How a man page is rendered (its gzip-decompressed source on stdin, output UTF-8).
MAN_COMMAND = (
    "groff",
    "-t",  # tables (tbl)
    "-mandoc",
    "-Tutf8",
    "-Kutf-8",  # the source's encoding (preconv), not the locale's
    "-rLL=1000n",
    "-rLT=1000n",
    "-rHY=0",  # no hyphenation
    "-P-cbou",  # grotty: no SGR escapes, no overstriking for bold, underline or anything else
)
#: Abstracts taken from a BEIR corpus: the first by sha256 of the document id.
BEIR_TAKE = 200
#: makeinfo's fill column: a line of a filled paragraph plus the next line's first word is longer.
INFO_FILL_COLUMN = 72


class FolderUnavailable(RuntimeError):
    """A source is not on this machine: the message says which, and is the reason to skip."""


class SourceChanged(RuntimeError):
    """A source file differs from the recorded one (another package version)."""


@dataclass(frozen=True)
class Folder:
    """One benchmark folder: its documents' sources and its question set's files."""

    name: str
    description: str
    licence: str
    source: str  # where the documents come from (package and version, or ../shared folder)
    documents: int  # documents :func:`assemble` writes
    kind: str  # the conversion: html, copy, info, man or beir
    files: tuple[str, ...]  # source paths (../shared/... beside the repo); sha256 in SOURCES
    # the files whose rows make questions.jsonl (day0_data/... or ../shared/...)
    questions: tuple[str, ...]
    out_of_domain: tuple[str, ...]  # files whose rows make out_of_domain.jsonl
    skip: tuple[str, ...] = ()  # info: chapters left out (licence text, index)


def _read_sources() -> dict[str, str]:
    out = {}
    for line in SOURCES_FILE.read_text(encoding="utf-8").splitlines():
        sha, _, path = line.partition("  ")
        out[path] = sha
    return out


#: source path -> its recorded sha256 (:data:`SOURCES_FILE`).
SOURCES = _read_sources()


def _under(base: str, names: str) -> tuple[str, ...]:
    return tuple(base + name for name in names.split())


_LIBFFI = _under(
    "/usr/share/doc/libffi8/html/",
    "Arrays-Unions-Enums.html Closure-Example.html Complex-Type-Example.html Complex.html "
    "Introduction.html Memory-Usage.html Missing-Features.html Multiple-ABIs.html "
    "Primitive-Types.html Simple-Example.html Size-and-Alignment.html Structures.html "
    "The-Basics.html The-Closure-API.html Thread-Safety.html Type-Example.html Types.html "
    "Using-libffi.html",
)
_WGET = ("/usr/share/info/wget.info.gz",)
_MAN = _under(
    "/usr/share/man/",
    "man1/tar.1.gz man1/find.1.gz man1/xargs.1.gz man1/sort.1.gz man1/du.1.gz man1/df.1.gz "
    "man1/timeout.1.gz man1/date.1.gz man1/ps.1.gz man8/lsof.8.gz man1/tmux.1.gz man1/jq.1.gz "
    "man1/ssh.1.gz man1/zstd.1.gz man1/journalctl.1.gz man1/less.1.gz",
)
_VALGRIND = _under(
    "/usr/share/doc/valgrind/html/",
    "quick-start.html manual-intro.html manual-core.html manual-core-adv.html mc-manual.html "
    "cg-manual.html cl-manual.html hg-manual.html drd-manual.html ms-manual.html dh-manual.html "
    "lk-manual.html nl-manual.html bbv-manual.html faq.html manual-writing-tools.html",
)
_COURSE = _under(
    "../shared/corpus/course/",
    "01-what-transformers-can-do.md 02-how-transformers-work.md 03-transformer-architectures.md "
    "04-inference-with-llms.md 05-optimized-inference-deployment.md 06-full-training-loop.md "
    "07-learning-curves.md 08-slice-and-dice.md 09-creating-your-own-dataset.md "
    "10-building-a-tokenizer.md 11-when-you-get-an-error.md "
    "12-debugging-the-training-pipeline.md 13-supervised-fine-tuning.md "
    "14-grpo-in-deepseekmath.md",
)
_PDF = _under(
    "../shared/corpus/pdf/",
    "cs229-cheatsheet-supervised-learning.pdf cs229-refresher-probabilities-statistics.pdf "
    "ethereum-yellow-paper-shanghai.pdf nist-fips-197-aes-2001.pdf",
)
_SCIFACT = ("../shared/beir/scifact/corpus.jsonl.gz",)


def _own(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A folder whose question set is all in day0_data/<name>/."""
    return (f"{DATA_PREFIX}{name}/questions.jsonl",), (f"{DATA_PREFIX}{name}/out_of_domain.jsonl",)


#: The benchmark's folders, by name (day0_data/README.md says the same in prose).
FOLDERS: dict[str, Folder] = {
    f.name: f
    for f in (
        Folder(
            "libffi-manual",
            "the libffi manual: calling C functions whose signature is known only at run time "
            "(call interfaces, types, structures, closures)",
            "MIT (Expat); (c) 2008-2022 Anthony Green and Red Hat, Inc.",
            "Debian libffi8 3.4.4-1, /usr/share/doc/libffi8/html (its 18 pages; the table of "
            "contents index.html and the concept index Index.html left out)",
            18,
            "html",
            _LIBFFI,
            *_own("libffi-manual"),
        ),
        Folder(
            "wget-manual",
            "the GNU Wget manual: non-interactive downloads over HTTP(S) and FTP, recursive "
            "retrieval, time-stamping, wgetrc; one Markdown file per chapter",
            "GFDL 1.3 or later, no invariant sections; (c) 1996-2022 Free Software Foundation",
            "Debian wget 1.21.3-1+deb12u1, /usr/share/info/wget.info.gz (9 chapters; the "
            "licence text and the concept index left out)",
            9,
            "info",
            _WGET,
            *_own("wget-manual"),
            skip=("Copying this manual", "Concept Index"),
        ),
        Folder(
            "man-tools",
            "16 manual pages of command-line tools: archives and compression (tar, zstd), "
            "finding and sorting files (find, xargs, sort), disk usage (du, df), processes and "
            "open files (ps, lsof, timeout), dates, tmux, jq, ssh, journalctl, less",
            "per page: GPL-3+ (tar, find, xargs, coreutils' sort, du, df, timeout, date; less "
            "also under the Less licence), GPL-2+/LGPL-2+ (procps' ps), Purdue BSD-style (lsof), "
            "ISC (tmux), MIT and CC-BY-3.0 (jq), OpenSSH BSD-style (ssh), BSD-3-clause or GPL-2 "
            "(zstd), LGPL-2.1+ (systemd's journalctl)",
            "Debian 12 packages tar, findutils, coreutils, procps, lsof, tmux, jq, "
            "openssh-client, zstd, systemd, less: /usr/share/man, rendered by groff "
            "(MAN_COMMAND)",
            len(_MAN),
            "man",
            _MAN,
            *_own("man-tools"),
        ),
        Folder(
            "course",
            "14 lessons of the Hugging Face LLM course: Transformers, tokenizers, datasets, "
            "training, fine-tuning, inference",
            "Apache-2.0 (huggingface/course)",
            "../shared/corpus/course (its README and LICENSE left out)",
            len(_COURSE),
            "copy",
            _COURSE,
            ("../shared/eval/course-dev/questions.jsonl",),
            ("../shared/eval/course-dev/out_of_domain.jsonl",),
        ),
        Folder(
            "pdf",
            "four real PDFs: the Ethereum yellow paper, NIST FIPS 197 (AES), two Stanford CS 229 "
            "cheat sheets (supervised learning, probabilities and statistics)",
            "CC BY-SA 4.0 (Ethereum yellow paper), public domain (FIPS 197), MIT (CS 229 sheets)",
            "../shared/corpus/pdf (its README left out)",
            len(_PDF),
            "copy",
            _PDF,
            ("../shared/eval/pdf-dev/questions.jsonl", f"{DATA_PREFIX}pdf/questions.jsonl"),
            (f"{DATA_PREFIX}pdf/out_of_domain.jsonl",),
        ),
        Folder(
            "scifact-abstracts",
            f"{BEIR_TAKE} biomedical abstracts of BEIR SciFact (S2ORC), chosen by the sha256 of "
            "their ids",
            "ODC-By 1.0 (S2ORC abstracts; SciFact, Wadden et al. 2020)",
            "../shared/beir/scifact/corpus.jsonl.gz",
            BEIR_TAKE,
            "beir",
            _SCIFACT,
            *_own("scifact-abstracts"),
        ),
        Folder(
            "valgrind-manual",
            "the Valgrind manual: Memcheck, Cachegrind, Callgrind, Helgrind, DRD, Massif, DHAT "
            "and the other tools, the core's options, the client requests, the gdbserver, the FAQ",
            "GFDL 1.2 or later, no invariant sections; (c) 2000-2022 the Valgrind authors",
            "Debian valgrind 1:3.19.0-1, /usr/share/doc/valgrind/html (16 pages: the quick "
            "start, the user manual's chapters, the FAQ, writing a tool)",
            len(_VALGRIND),
            "html",
            _VALGRIND,
            *_own("valgrind-manual"),
        ),
    )
}


def assemble(name: str, dest: Path, *, shared: Path | None = None) -> Path:
    """Build folder ``name``'s documents in ``dest/name`` (replacing it) and return that path.

    ``shared`` is the ``../shared`` folder (default: beside the repository). Raises
    :class:`FolderUnavailable` when a source is absent and :class:`SourceChanged` when one
    differs from the recorded file."""
    folder = FOLDERS[name]
    sources = [(_source(folder, path, shared), SOURCES.get(path, "")) for path in folder.files]
    for path, sha in sources:
        got = _sha256(path)
        if got != sha:
            raise SourceChanged(
                f"{name}: {path} is not the file its questions were written for (sha256 "
                f"{got[:16]}..., recorded {sha[:16] or 'none'}... in {SOURCES_FILE.name}): "
                "another package version, whose text may not hold their needles"
            )
    if folder.kind == "man" and shutil.which(MAN_COMMAND[0]) is None:
        raise FolderUnavailable(f"{name}: groff is not installed (Debian package groff-base)")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest))
    try:
        for file_name, data in BUILDERS[folder.kind](folder, [p for p, _ in sources]):
            (work / file_name).write_bytes(data)
        out = dest / name
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def question_set(name: str, dest: Path, *, shared: Path | None = None) -> Path:
    """Write folder ``name``'s question set (``questions.jsonl``, ``out_of_domain.jsonl``) in
    ``dest/name`` and return that path: the rows of its files, in order."""
    folder = FOLDERS[name]
    out = Path(dest) / name
    out.mkdir(parents=True, exist_ok=True)
    for target, parts in (
        ("questions.jsonl", folder.questions),
        ("out_of_domain.jsonl", folder.out_of_domain),
    ):
        rows: list[str] = []
        for part in parts:
            text = _source(folder, part, shared).read_text(encoding="utf-8")
            rows += [line for line in text.splitlines() if line.strip()]
        (out / target).write_text("".join(row + "\n" for row in rows), encoding="utf-8")
    return out


def unrelated_test() -> list[str]:
    """The held-out off-topic questions (:data:`UNRELATED_TEST`), one a line."""
    return [q for q in UNRELATED_TEST.read_text(encoding="utf-8").splitlines() if q.strip()]


# --------------------------------------------------------------------------- the conversions

Built = Iterator[tuple[str, bytes]]  # (file name, contents) of each document


def _copy(folder: Folder, paths: list[Path]) -> Built:
    for path in paths:
        yield path.name, path.read_bytes()


def _man(folder: Folder, paths: list[Path]) -> Built:
    for path in paths:
        page = path.name.removesuffix(".gz")  # tar.1
        yield f"{page}.txt", render_man(gzip.decompress(path.read_bytes())).encode("utf-8")


def render_man(source: bytes) -> str:
    """A man page's source rendered as plain text by :data:`MAN_COMMAND` (see the module)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
    done = subprocess.run(MAN_COMMAND, input=source, capture_output=True, env=env, check=True)
    lines = [line.rstrip() for line in done.stdout.decode("utf-8").split("\n")]
    body = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n").split("\n")
    for i in (0, -1):  # "TAR(1)   <padding>   General Commands Manual   <padding>   TAR(1)"
        body[i] = re.sub(r" {3,}", "   ", body[i])
    return "\n".join(body) + "\n"


def _info(folder: Folder, paths: list[Path]) -> Built:
    (path,) = paths
    chapters = info_chapters(gzip.decompress(path.read_bytes()).decode("utf-8"), folder.skip)
    for i, (title, text) in enumerate(chapters, 1):
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        yield f"{i:02d}-{slug}.md", text.encode("utf-8")


def info_chapters(info: str, skip: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(chapter title, Markdown) of each chapter of an info manual, in order (see the module):
    a chapter is a node whose ``Up`` is ``Top`` with the nodes after it up to the next one."""
    chapters: list[tuple[str, list[str]]] = []
    for node in info.split("\x1f\n")[1:]:
        header, _, body = node.partition("\n")
        fields = dict(re.findall(r"(\w+): ([^,]*)", header))
        if "Node" not in fields:  # the tag table, local variables
            continue
        if fields.get("Up") == "Top":
            chapters.append((fields["Node"], []))
        elif not chapters:  # Top
            continue
        chapters[-1][1].append(_info_node(body))
    return [
        (title, "\n\n".join(p for p in parts if p) + "\n")
        for title, parts in chapters
        if title not in skip
    ]


_UNDERLINES = {"*": "#", "=": "##", "-": "###", ".": "###"}


def _info_node(body: str) -> str:
    lines = body.split("\n")
    out: list[str] = []
    i = 0
    in_menu = False
    while i < len(lines):
        line = lines[i]
        if line.startswith("* Menu:"):
            in_menu = True
        elif in_menu and line and not line.startswith(("* ", " ")):
            in_menu = False
        if in_menu:
            i += 1
            continue
        under = lines[i + 1] if i + 1 < len(lines) else ""
        if line and len(under) == len(line) and len(set(under)) == 1 and under[0] in _UNDERLINES:
            out.append(f"{_UNDERLINES[under[0]]} {line}")
            i += 2
            continue
        out.append(line)
        i += 1
    text = "\n".join(unfill(out))
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


_CODE = ("#", "$")  # an example's comment or prompt line is never joined
_BULLET = re.compile(r"^( *)(?:[•*-]|\d+\.) +")


def _text_indent(line: str) -> int:
    """Where a line's text starts (after a list bullet or number)."""
    m = _BULLET.match(line)
    return m.end() if m else len(line) - len(line.lstrip(" "))


def unfill(lines: Sequence[str], column: int = INFO_FILL_COLUMN) -> list[str]:
    """Join each filled paragraph's lines into one: a line is continued by the next when the
    next one's first word would not have fitted on it (makeinfo filled it there) and the next
    line continues its text (same text indentation, or 3 less after a paragraph's indented
    first line) without opening a list item. Examples, whose lines are short, stay as they are,
    and so do lines that start with a comment or prompt sign (:data:`_CODE`)."""
    out: list[str] = []
    last = ""  # the source line out[-1] ends with
    for line in lines:
        if out and line.strip() and last.strip() and not out[-1].startswith("#"):
            indent, text_indent = len(line) - len(line.lstrip(" ")), _text_indent(last)
            gap = 2 if re.search(r"[.?!][’”)]?$", last) else 1  # two spaces after a sentence
            filled = len(last) + gap + len(line.split()[0]) > column
            continues = indent in (text_indent, text_indent - 3) and not _BULLET.match(line)
            code = line.lstrip().startswith(_CODE) or last.lstrip().startswith(_CODE)
            if filled and continues and not code:
                out[-1] += " " + line.strip()
                last = line
                continue
        out.append(line)
        last = line
    return out


def _beir(folder: Folder, paths: list[Path]) -> Built:
    (path,) = paths
    docs = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            docs[doc["_id"]] = doc
    for doc_id in sorted(docs, key=lambda d: hashlib.sha256(d.encode("utf-8")).hexdigest())[
        :BEIR_TAKE
    ]:
        doc = docs[doc_id]
        text = f"{doc['title'].strip()}\n\n{doc['text'].strip()}\n"
        yield f"{doc_id}.txt", text.encode("utf-8")


BUILDERS: dict[str, Callable[[Folder, list[Path]], Built]] = {
    "html": _copy,
    "copy": _copy,
    "info": _info,
    "man": _man,
    "beir": _beir,
}


def _source(folder: Folder, path: str, shared: Path | None) -> Path:
    """A registry path on this machine; :class:`FolderUnavailable` when it is absent."""
    if path.startswith(SHARED_PREFIX):
        root = shared if shared is not None else REPO.parent / "shared"
        if not root.is_dir():
            raise FolderUnavailable(f"{folder.name}: no ../shared beside the repository ({root})")
        found = root / path.removeprefix(SHARED_PREFIX)
    elif path.startswith(DATA_PREFIX):
        found = DATA / path.removeprefix(DATA_PREFIX)
    else:
        found = Path(path)
    if not found.is_file():
        raise FolderUnavailable(f"{folder.name}: {found} is absent ({folder.source})")
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _count(path: Path, kind: str | None = None) -> int:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return sum(1 for r in rows if kind is None or r.get("kind") == kind)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rag_assets.bench.day0_folders",
        description="Assemble the day-0 benchmark folders and their question sets.",
    )
    p.add_argument(
        "dest", type=Path, help="documents go to DEST/documents/NAME, sets to DEST/questions/NAME"
    )
    p.add_argument("names", nargs="*", help=f"folders (default: all of {', '.join(FOLDERS)})")
    p.add_argument("--shared", type=Path, default=None, help="the ../shared folder")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in FOLDERS]
    if unknown:
        p.error(f"unknown folder {unknown[0]!r} (known: {', '.join(FOLDERS)})")
    failed = 0
    for name in args.names or list(FOLDERS):
        try:
            docs = assemble(name, args.dest / "documents", shared=args.shared)
            qs = question_set(name, args.dest / "questions", shared=args.shared)
        except FolderUnavailable as exc:
            print(f"{name}: skipped: {exc}")
            continue
        except SourceChanged as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
            continue
        n_docs = sum(1 for f in docs.iterdir() if f.is_file())
        ood = qs / "out_of_domain.jsonl"
        print(
            f"{name}: {n_docs} documents in {docs}; {_count(qs / 'questions.jsonl')} questions, "
            f"{_count(ood, 'near')} near and {_count(ood, 'unrelated')} unrelated out-of-domain "
            f"in {qs}; licence: {FOLDERS[name].licence}"
        )
    print(f"{len(unrelated_test())} held-out unrelated questions: {UNRELATED_TEST}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
