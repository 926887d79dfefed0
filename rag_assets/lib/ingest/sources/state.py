"""The sources' state kept in the work folder (issue 41): when each source was last observed
well, since when it is stale and why. Read by ``status`` without the extractors' imports."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STATE_FILE = "sources/state.json"


def load_state(work_dir: str | Path) -> dict[str, dict[str, Any]]:
    try:
        return dict(json.loads((Path(work_dir) / STATE_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def save_state(
    work_dir: str | Path, state: dict[str, dict[str, Any]], names: Sequence[str]
) -> None:
    path = Path(work_dir) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {n: state[n] for n in names if n in state}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept, indent=1, sort_keys=True))
    tmp.replace(path)


def source_lines(work_dir: str | Path) -> list[str]:
    """What ``status`` shows per source: ok since when, or stale since when and why."""
    out = []
    for name, e in sorted(load_state(work_dir).items()):
        where = f"{e.get('kind', '?')} {e.get('location', '')}"
        if e.get("stale_since"):
            out.append(f"source {name} ({where}): STALE since {e['stale_since']} (last good "
                       f"{e.get('last_good') or 'never'}): {e.get('error', '')}")  # fmt: skip
        else:
            extra = f", commit {e['commit'][:12]}" if e.get("commit") else ""
            held = f", {e['withheld']} deletions withheld" if e.get("withheld") else ""
            out.append(
                f"source {name} ({where}): ok, last observed {e.get('last_good', '?')}{extra}{held}"
            )
    return out
