"""``rag-assets token add|list|revoke``: the API tokens kept (hashed) with the index."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rag_assets.commands.common import (
    INDEX_HELP,
    CliError,
)
from rag_assets.settings import Settings

#: commands that only read an index: see :data:`rag_assets.cli.QUERY_COMMANDS`
QUERY_COMMANDS = frozenset({"token"})


def register(sub: Any) -> None:
    """``token add|list|revoke``."""
    tk = sub.add_parser("token", help="API tokens of the index: add, list, revoke")
    on_index = argparse.ArgumentParser(add_help=False)
    on_index.add_argument("--index", default=None, help=INDEX_HELP)
    tks = tk.add_subparsers(dest="action", required=True)
    tka = tks.add_parser(
        "add", parents=[on_index], help="make a token (printed once; only its hash is kept)"
    )
    tka.add_argument("name", help="who holds it (letters, digits, _ . -)")
    tka.add_argument(
        "--groups", default="", help="comma-separated groups whose documents it may see"
    )
    tkl = tks.add_parser("list", parents=[on_index], help="every token: groups, made, revoked")
    tkl.add_argument("--json", action="store_true", help="the tokens as JSON")
    tkr = tks.add_parser(
        "revoke", parents=[on_index], help="refuse a token from the next request on"
    )
    tkr.add_argument("name")
    tk.set_defaults(func=cmd_token)


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    """Issue 34: tokens kept (hashed) with the index; the service reads them per request."""
    from rag_assets.lib.index.store import IndexStore, TokenError

    store = IndexStore(args.index or settings.index_uri)
    try:
        return _token_action(args, store)
    except TokenError as e:  # says what to do already
        raise CliError(str(e)) from None


def _token_action(args: argparse.Namespace, store: Any) -> int:
    if args.action == "add":
        groups = [g.strip() for g in args.groups.split(",") if g.strip()]
        token = store.add_token(args.name, groups)
        print(token)  # the only time it is shown: stdout alone, for `$(rag-assets token add …)`
        print(
            f"token {args.name!r} (groups: {', '.join(groups) or 'none: public documents only'})"
            " made; it is shown once: keep it now",
            file=sys.stderr,
        )
        return 0
    if args.action == "revoke":
        record = store.revoke_token(args.name)
        print(f"revoked {record.name!r}: a running service refuses it from its next request")
        return 0
    records = store.tokens()
    if args.json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return 0
    for r in records:
        state = f"revoked {r.revoked}" if r.revoked else "active"
        print(f"{r.name}  groups={','.join(r.groups) or '-'}  made {r.created}  {state}")
    if not records:
        print("no tokens (`rag-assets token add NAME --groups A,B` makes one)")
    return 0
