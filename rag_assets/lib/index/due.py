"""When a table's own LanceDB index (the IVF-SQ of :mod:`.ann`, the full-text one of
:mod:`.lexical`) is due: the rule both share."""

from __future__ import annotations

from typing import Any


def index_due(table: Any, index: Any | None, min_rows: int, reindex_fraction: float) -> int:
    """The table's row count when an index should be built now, else 0: at ``min_rows`` rows
    or more, when ``index`` (the existing one, or None) is missing or leaves more than
    ``reindex_fraction`` of the rows outside it."""
    rows = int(table.count_rows())
    if rows < min_rows:
        return 0
    if index is not None:
        stats = table.index_stats(index.name)
        if stats is not None and stats.num_unindexed_rows <= reindex_fraction * rows:
            return 0
    return rows
