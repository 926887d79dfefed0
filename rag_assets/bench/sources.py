"""``rag-assets bench --sources`` (issue 41): the incremental cost of each configured source.

Each source of ``RAG_SOURCES`` (or the location or folder ``--documents`` names) is listed and
extracted twice into a scratch working folder, the second time over the first's documents, as a
re-run over an unchanged source: items listed per second (the second listing, what every
observation costs), bytes read the first time, and bytes re-read the second time (0: an
unchanged item is never read again). Nothing is embedded and no index is touched.
"""

from __future__ import annotations

import tempfile
from typing import Any

from rag_assets.lib.ingest.sources.config import SourceSpec, source_specs
from rag_assets.lib.ingest.sources.sync import extract_sources


def run_sources_bench(settings: Any) -> tuple[dict[str, Any], str]:
    specs = source_specs(settings.documents_dir, settings.sources, settings.include,
                         settings.exclude)  # fmt: skip
    if specs is None:
        specs = [SourceSpec("folder", str(settings.documents_dir), "folder")]
    with tempfile.TemporaryDirectory(prefix="rag-bench-sources-") as work:
        first = extract_sources(specs, {}, work)
        previous = {d.document_id: d for d in first.documents}
        second = extract_sources(specs, previous, work)
    rows = []
    for a, b in zip(first.sources, second.sources, strict=True):
        rows.append(
            {
                "source": a.name,
                "kind": a.kind,
                "ok": a.ok and b.ok,
                "error": a.error or b.error,
                "items": b.listed,
                "items_listed_per_s": round(b.listed / b.list_seconds, 1)
                if b.list_seconds
                else None,
                "first_read_bytes": a.read_bytes,
                "first_read_items": a.read,
                "rerun_read_bytes": b.read_bytes,
                "rerun_read_items": b.read,
            }
        )
    lines = ["source      kind     items  listed/s  first run read   unchanged re-run re-read"]
    for r in rows:
        if not r["ok"]:
            lines.append(f"{r['source']:11} {r['kind']:8} FAILED: {r['error']}")
            continue
        rate = "-" if r["items_listed_per_s"] is None else f"{r['items_listed_per_s']:g}"
        lines.append(
            f"{r['source']:11} {r['kind']:8} {r['items']:5}  {rate:>8}  "
            f"{r['first_read_bytes']:>10,} B ({r['first_read_items']})   "
            f"{r['rerun_read_bytes']:,} B ({r['rerun_read_items']} items)"
        )
    return {"sources": rows}, "\n".join(lines)
