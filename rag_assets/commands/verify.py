"""``rag-assets verify``: an answer's sentences checked against the sources ``ask`` would cite
(issue 50), one answer from the flags or a JSON-lines file of them (``--batch``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rag_assets.commands.common import INDEX_HELP, CliError, question_arg
from rag_assets.settings import Settings

#: commands that only read an index: see :data:`rag_assets.cli.QUERY_COMMANDS`
QUERY_COMMANDS = frozenset({"verify"})
#: commands that encode text: see :data:`rag_assets.cli.DEVICE_COMMANDS`
DEVICE_COMMANDS = frozenset({"verify"})


def register(sub: Any) -> None:
    """``verify``."""
    from rag_assets.commands.query import scope_flags

    v = sub.add_parser(
        "verify",
        help="check an answer's sentences against the sources `ask` cites for the question",
        usage='%(prog)s [options] "QUESTION" --answer "TEXT" | --batch FILE',
        description="Retrieve the question's sources exactly as `ask` does (the same gate and "
        "numbering), then give every sentence of the answer a verdict: supported (with the "
        "span of the cited source that states it), unsupported (with what differs: a changed "
        "number, a negation, a swapped name or term, a statement from elsewhere) or uncited.",
    )
    v.add_argument("question", nargs="?", type=question_arg, help="the question, in quotes")
    v.add_argument("--answer", default=None, help="the answer to check, with its [n] markers")
    v.add_argument(
        "--batch",
        default=None,
        metavar="FILE",
        help='JSON lines {"question": …, "answer": …} (- for stdin); one JSON line out per '
        "line in, in order (a broken line gets an error line)",
    )
    v.add_argument("--index", default=None, help=INDEX_HELP)
    v.add_argument("--json", action="store_true", help="the verdicts as JSON")
    v.add_argument("--no-rerank", action="store_true", help="skip the reranker (RAG_RERANK_MODEL)")
    scope_flags(v)
    v.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from rag_assets.commands.query import open_index, scope_of
    from rag_assets.lib.query.verify import VerifyInputError, check_answer, second_opinion_of

    if args.batch is None:
        if args.question is None or args.answer is None:
            raise CliError(
                'give a question and --answer "TEXT" (or --batch FILE of JSON lines with '
                "question and answer)"
            )
        try:
            check_answer(args.answer, what="--answer")  # before any model is loaded
        except VerifyInputError as e:
            raise CliError(str(e)) from None
    elif args.question is not None or args.answer is not None:
        raise CliError("--batch reads questions and answers from FILE: give no QUESTION/--answer")
    lines = _batch_lines(args.batch) if args.batch is not None else None
    index = open_index(settings, args.index)  # one model load for the whole file
    scope = scope_of(args, settings, index)
    opinion = second_opinion_of(settings)
    base = settings.base_url or None
    if lines is None:
        assert args.question is not None and args.answer is not None
        try:
            out = _verify(index, args.question, args.answer, scope, base, opinion, args.no_rerank,
                          what="--answer")  # fmt: skip
        except VerifyInputError as e:
            raise CliError(str(e)) from None
        print(json.dumps(out, indent=2, ensure_ascii=False) if args.json else _text(out))
        return 0
    failed = 0
    for number, line in lines:
        try:
            question, answer, given = _parse_line(line)
            out = given | _verify(index, question, answer, scope, base, opinion, args.no_rerank)
        except (VerifyInputError, ValueError) as e:
            failed += 1
            out = {"line": number, "error": " ".join(str(e).split())}
        print(json.dumps(out, ensure_ascii=False), flush=True)
    if failed:
        print(
            f"rag-assets: {failed} line(s) of {args.batch} not verified (see their error lines)",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _verify(
    index: Any,
    question: str,
    answer: str,
    scope: Any,
    base: Any,
    opinion: Any,
    no_rerank: bool,
    what: str = "answer",
) -> dict[str, Any]:
    from rag_assets.lib.query.verify import verify_question

    return verify_question(
        index,
        question,
        answer,
        rerank=not no_rerank,
        scope=scope,
        base_url=base,
        second_opinion=opinion,
        what=what,
    )


def _batch_lines(path: str) -> list[tuple[int, str]]:
    """(1-based line number, text) of every non-blank line of ``path`` (``-``: stdin)."""
    if path == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as e:
            raise CliError(f"--batch {path}: {e.strerror or e}") from None
    return [(i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _parse_line(line: str) -> tuple[str, str, dict[str, Any]]:
    """(question, answer, ``{"id": …}`` when the line has one) of one batch line, or ValueError
    naming what is wrong."""
    from rag_assets.lib.ingest.validate import text_problem
    from rag_assets.lib.query.verify import check_answer
    from rag_assets.serve.bounds import BadRequest
    from rag_assets.serve.service import check_text

    if text_problem(line, "the line"):
        raise ValueError(text_problem(line, "the line"))
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"not JSON ({e.msg} at column {e.colno}): send one object a line"
        ) from None
    if not isinstance(obj, dict):
        raise ValueError('not a JSON object: send {"question": "…", "answer": "…"}')
    unknown = sorted(set(obj) - {"question", "answer", "id"})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}: send question and answer")
    question, answer = obj.get("question"), obj.get("answer")
    if not isinstance(question, str):
        raise ValueError('no "question" string: send {"question": "…", "answer": "…"}')
    try:
        question = check_text(question, "question")
    except BadRequest as e:
        raise ValueError(str(e)) from None
    return question, check_answer(answer), ({"id": obj["id"]} if "id" in obj else {})


def _text(out: dict[str, Any]) -> str:
    """``verify``'s plain-text form: one block per sentence, then the count supported."""
    from rag_assets.lib.query.plain import shorten

    lines = []
    for i, s in enumerate(out["sentences"], start=1):
        cites = "".join(f"[{n}]" for n in s["cites"])
        lines.append(f'{i:>2} {s["verdict"].upper():<11} {cites:<6} "{shorten(s["text"], 70)}"')
        ev = s.get("evidence")
        if ev:
            lines.append(
                f"   source [{ev['source']}] {ev['document_id']}, {ev['label']}: "
                f'"{shorten(ev["quote"], 80)}"'
            )
        if s.get("reason"):
            lines.append(f"   {s['reason']}")
    lines.append(f"{out['supported']} of {out['total']} sentences supported by their sources")
    return "\n".join(lines)
