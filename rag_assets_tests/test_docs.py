"""The README and the pages in ``docs/`` name only what exists, and their links resolve.

Checked against the code itself, without a model: every ``rag-assets COMMAND --flag`` against
the CLI's parser, every ``RAG_*`` against ``settings.ENV`` (plus the few variables the code
reads that are not settings, each checked to be read somewhere), every ``python -m rag_assets…``
module and every ``rag_assets/…`` path against the tree, every relative link against the files
and their headings' anchors. ``test_the_checks_catch_bad_names`` plants one mistake of each
kind, so none of these checks passes vacuously.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

from rag_assets_tests.helpers import REPO

README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
#: The README is a product page; the rest lives in docs/ (issue 24: about 150 lines).
README_MAX_LINES = 160
#: Environment variables the code reads that are not settings (not in ``settings.ENV``): the
#: test checks that each is still read by some module, so the list cannot go stale.
NOT_SETTINGS = {
    "RAG_DEBUG": "rag_assets/cli.py",
    "RAG_CHROMIUM": "rag_assets_tests/serve/test_browser.py",
    "RAG_MODELS_DIR": "rag_assets_tests/llm_server.py",
    "RAG_SCREENSHOT_DIR": "rag_assets_tests/serve/test_browser.py",
}

FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)
COMMAND = re.compile(r"(?<![\w/.-])rag-assets ([a-z][\w-]*)([^`\n]*)")
FLAG = re.compile(r"(?<![\w-])--?[a-z][\w-]*")
SETTING = re.compile(r"\bRAG_[A-Z0-9_]+\b")
MODULE = re.compile(r"\bpython -m (rag_assets[\w.]*)")
PATH = re.compile(r"(?<![\w/.-])(rag_assets(?:_tests)?/[\w./*<>-]*\w)")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
#: where prose breaks into sentences: after . ! ? (and a closing bracket or quote), before a space
SENTENCE_END = re.compile(r"(?<=[.!?])[)\]*_`\"']*\s+")
#: a sentence shorter than this many words may well be said twice ("See below.")
REPEAT_MIN_WORDS = 5


@cache
def _cli() -> dict[str, set[str]]:
    """Each subcommand's option strings (and the top-level ones under "")."""
    from rag_assets.cli import _parser

    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {name: _options(sub) for name, sub in subs.choices.items()}
    out[""] = {o for a in parser._actions for o in a.option_strings}
    return out


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """A command's option strings, its own subcommands' included (``token add --groups``)."""
    out = {o for a in parser._actions for o in a.option_strings}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                out |= _options(sub)
    return out


@cache
def _settings() -> set[str]:
    from rag_assets.settings import ENV

    return {var for var, _ in ENV.values()}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(FENCE.sub("", text)):
        slug = _slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def command_problems(text: str) -> list[str]:
    cli = _cli()
    out = []
    for command, rest in COMMAND.findall(text):
        if command not in cli:
            out.append(f"`rag-assets {command}` is not a command")
            continue
        for flag in FLAG.findall(rest.split(" #")[0]):
            if flag not in cli[command] | cli[""]:
                out.append(f"`rag-assets {command} {flag}` is not an option")
    return out


def setting_problems(text: str) -> list[str]:
    known = _settings() | set(NOT_SETTINGS)
    return [f"{name} is not a setting" for name in sorted(set(SETTING.findall(text)) - known)]


def module_problems(text: str) -> list[str]:
    out = []
    for name in sorted(set(MODULE.findall(text))):
        name = name.rstrip(".")
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(f"`python -m {name}`: no such module")
    return out


def path_problems(text: str) -> list[str]:
    return [
        f"{p}: no such file or folder"
        for p in sorted(set(PATH.findall(text)))
        if not any(REPO.glob(re.sub(r"<\w+>", "*", p)))  # `lib/<stage>/test_*.py`: a pattern
    ]


def link_problems(doc: Path, text: str) -> list[str]:
    out = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.is_relative_to(REPO):
            out.append(f"({target}) leaves the repository: the docs must stand alone")
        elif not dest.exists():
            out.append(f"({target}): no such file")
        elif anchor and anchor not in _anchors(dest.read_text(encoding="utf-8") if path else text):
            out.append(f"({target}): no heading with that anchor in {dest.name}")
    return out


def _sentences(text: str) -> list[str]:
    """The prose's sentences, whitespace collapsed: code blocks, tables and headings left out."""
    prose = [
        ln for ln in FENCE.sub("", text).splitlines() if not ln.lstrip().startswith(("|", "#"))
    ]
    return [" ".join(s.split()) for s in SENTENCE_END.split("\n".join(prose)) if s.strip()]


def repeat_problems(text: str) -> list[str]:
    """Issue 39: a sentence said twice, or said again as the end of another one (what a merge
    leaves when it keeps both sides of a rewrapped line)."""
    out = []
    seen: list[str] = []
    for s in (s for s in _sentences(text) if len(s.split()) >= REPEAT_MIN_WORDS):
        if any(t == s or t.endswith(" " + s) or s.endswith(" " + t) for t in seen):
            out.append(f"repeated sentence: {s!r}")
        seen.append(s)
    return out


def _problems(doc: Path, text: str) -> list[str]:
    return [
        *command_problems(text),
        *setting_problems(text),
        *module_problems(text),
        *path_problems(text),
        *link_problems(doc, text),
        *repeat_problems(text),
    ]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_the_docs_name_only_what_exists(doc):
    problems = _problems(doc, doc.read_text(encoding="utf-8"))
    assert not problems, f"{doc.relative_to(REPO)}:\n  " + "\n  ".join(problems)


def test_the_checks_catch_bad_names():
    """One planted mistake of each kind is reported (so the checks above can fail)."""
    planted = (
        "Run `rag-assets reindex` or `rag-assets index --documents D --fast`; "
        "set RAG_NO_SUCH_SETTING=1; `python -m rag_assets.bench.nothing`; "
        "see `rag_assets/lib/store.py`, [gone](docs/nowhere.md), [anchor](#no-such-heading), "
        "[outside](../shared/eval/README.md). Fine: `rag-assets ask --json`, RAG_FUSION, "
        "[here](#planted), `python -m rag_assets.bench.compare`, `rag_assets/lib/index/store/`.\n"
        "# Planted\n"
    )
    problems = _problems(REPO / "README.md", planted)
    expected = [
        "`rag-assets reindex` is not a command",
        "`rag-assets index --fast` is not an option",
        "RAG_NO_SUCH_SETTING is not a setting",
        "`python -m rag_assets.bench.nothing`: no such module",
        "rag_assets/lib/store.py: no such file or folder",
        "(docs/nowhere.md): no such file",
        "(#no-such-heading): no heading with that anchor in README.md",
        "(../shared/eval/README.md) leaves the repository: the docs must stand alone",
    ]
    assert problems == expected


def test_a_repeated_sentence_is_caught():
    """The README's slip of issue 39: a merge kept the end of a sentence twice."""
    slip = (
        "**Which model:** the default stays MiniLM; the upgrade answers more (42 vs 30 at the "
        "same\nbluff rate): [Choosing a model](docs/models.md). Model servers: [here](x.md).\n"
        "bluff rate): [Choosing a model](docs/models.md). Or keep MiniLM and adapt it.\n\n"
        "Indexing is one run of the graph. Indexing is one run of the graph.\n"
    )
    assert repeat_problems(slip) == [
        "repeated sentence: 'bluff rate): [Choosing a model](docs/models.md).'",
        "repeated sentence: 'Indexing is one run of the graph.'",
    ]
    assert not repeat_problems("See below. See below. It runs once. It runs twice.")


def test_the_docs_are_checked_at_all():
    """The checks see what they are meant to: the README's commands, the docs' settings."""
    text = "\n".join(d.read_text(encoding="utf-8") for d in DOCS)
    assert {c for c, _ in COMMAND.findall(text)} == set(_cli()) - {""}, "a command undocumented"
    assert len(LINK.findall(text)) >= 20 and len(DOCS) >= 8


def test_every_setting_is_in_the_settings_reference():
    reference = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    first_cells = [ln.split("|")[1] for ln in reference.splitlines() if ln.startswith("|")]
    rows = {name for cell in first_cells for name in re.findall(r"`(RAG_[A-Z0-9_]+)`", cell)}
    missing = _settings() - rows
    assert not missing, f"settings without a row in docs/settings.md: {sorted(missing)}"


def test_the_variables_that_are_not_settings_are_still_read():
    for name, path in NOT_SETTINGS.items():
        assert name not in _settings(), f"{name} is a setting now: drop it from NOT_SETTINGS"
        assert name in (REPO / path).read_text(encoding="utf-8"), f"{path} no longer reads {name}"


def test_the_readme_is_a_product_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"
    first_screen = "\n".join(lines[:40])
    assert "make demo" in first_screen and "make test" in first_screen
    text = "\n".join(lines)
    line = next(ln for ln in text.split("\n\n") if "embeddinggemma-300m" in ln)
    assert "rrf:dense=4" in line and "(docs/models.md" in line, "the recommendation, linked"
