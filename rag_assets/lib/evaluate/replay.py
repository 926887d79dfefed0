"""Replaying logged questions on a candidate before it serves (issue 33).

A model change (a new table) or a fusion change is judged on the questions people actually
asked, not only on the evaluation set. Every distinct logged question (its text, case and
spacing folded; ``ask`` and ``search`` apart) is asked again of the candidate, and compared with
what users were shown (the logged entry: its top hits and, for an ``ask``, the gate's decision),
so the published model is not needed again:

- **top-4 agreement**: the share of the logged top 4 hits the candidate's top 4 also returns (a
  hit matches when it is in the same document and its span overlaps: chunkings may differ), and
  how often the first hit is the same passage;
- **decision flips**: asks answered before and refused now, and refused before and answered now
  (the candidate at its own calibrated cut);
- on **reviewed** questions (:mod:`.traffic`), the paired exact sign tests that the upgrade gate
  ``not_worse_than_published`` uses: hit@4 and answered-with-the-needle for answerable questions
  (the needle in the chunk's text; for the logged side, the chunk read back from the table
  version that answered), refusal for out-of-domain ones. ``worse`` names a test the candidate
  loses significantly (p < :data:`~.evaluate.UPGRADE_ALPHA`, more losses than wins).

The report holds query ids and figures, no question text.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rag_assets.lib.evaluate import metrics
from rag_assets.lib.evaluate.evaluate import UPGRADE_ALPHA
from rag_assets.lib.evaluate.traffic import normalized, relocate
from rag_assets.lib.index.store import scan
from rag_assets.lib.query.cite import MAX_SOURCES, gate
from rag_assets.lib.query.feedback import ANSWERABLE, OUT_OF_DOMAIN
from rag_assets.lib.query.retrieve import RERANK_DEPTH
from rag_assets.lib.types import normalize_ws

TOP = 4  # the gate keeps at most 4 sources: agreement is measured at that depth


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same passage: the same document and overlapping ``[from, to)``."""
    if a.get("document_id") != b.get("document_id"):
        return False
    try:
        return int(a["from"]) < int(b["to"]) and int(b["from"]) < int(a["to"])
    except (KeyError, TypeError, ValueError):
        return a.get("chunk_id") == b.get("chunk_id")


def _hit_dict(h: Any) -> dict[str, Any]:
    return {"document_id": h.document_id, "from": h.start, "to": h.end, "chunk_id": h.chunk_id}


def _groups(
    entries: Sequence[dict[str, Any]], reviews: dict[str, dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(baseline entry, its review) per distinct question and kind: the newest reviewed entry
    of a question, else its newest entry."""
    best: dict[tuple[str, str], tuple[tuple[int, int], dict[str, Any]]] = {}
    for e in entries:
        if not e.get("question"):
            continue
        kind = "ask" if e.get("decision") in ("answered", "refused") else "search"
        key = (normalized(e["question"]), kind)
        rank = (1 if e["id"] in reviews else 0, int(e["at_ns"]))
        if key not in best or rank > best[key][0]:
            best[key] = (rank, e)
    out = [(e, reviews.get(e["id"])) for _, e in best.values()]
    return sorted(out, key=lambda p: (p[0]["at_ns"], p[0]["id"]))


class _Contents:
    """Chunk texts of the table versions that answered (read once per version)."""

    def __init__(self, store: Any):
        self.store = store
        self.cache: dict[tuple[str, int], dict[str, str] | None] = {}

    def of(self, table: str, version: int, chunk_ids: Sequence[str]) -> dict[str, str] | None:
        key = (table, int(version))
        if key not in self.cache:
            try:
                tbl = self.store.open_table(table, int(version))
                rows = scan(tbl, ["chunk_id", "content"]).to_pylist()
                self.cache[key] = {r["chunk_id"]: r["content"] for r in rows}
            except Exception:  # noqa: BLE001 - compacted away or dropped: no baseline
                self.cache[key] = None
        found = self.cache[key]
        if found is None or any(c not in found for c in chunk_ids):
            return None
        return found


def replay(
    candidate: Any,
    entries: Sequence[dict[str, Any]],
    reviews: dict[str, dict[str, Any]],
    *,
    cut: float,
    store: Any = None,
) -> dict[str, Any]:
    """Replay ``entries`` (log rows) on ``candidate`` (an :class:`~rag_assets.lib.query.
    retrieve.Index`) gated at ``cut``; ``store`` reads the logged chunks back (default: the
    candidate's). See the module docstring for what is measured."""
    store = store if store is not None else candidate.store
    contents = _Contents(store)
    texts = {d: str(r["text"]) for d, r in candidate.documents.items()}
    ask_retriever = "rerank" if getattr(candidate, "reranker", None) is not None else "hybrid"
    groups = _groups(entries, reviews)
    if hasattr(candidate.embedder, "prefetch_queries"):
        candidate.embedder.prefetch_queries([e["question"] for e, _ in groups])
    flips: Counter[str] = Counter()
    baselines: Counter[str] = Counter()
    agreement: list[float] = []
    same_first: list[bool] = []
    paired: dict[str, tuple[list[bool], list[bool]]] = {
        "hit@4": ([], []),
        "answered_with_needle": ([], []),
        "refused_out_of_domain": ([], []),
    }
    unavailable = 0
    rows = []
    for entry, review in groups:
        kind = "ask" if entry.get("decision") in ("answered", "refused") else "search"
        retriever = ask_retriever if kind == "ask" else str(entry.get("retriever") or "hybrid")
        if retriever == "rerank" and getattr(candidate, "reranker", None) is None:
            retriever = "hybrid"
        hits = candidate.search(entry["question"], retriever, k=RERANK_DEPTH)
        logged = json.loads(entry.get("hits") or "[]")[:TOP]
        mine = [_hit_dict(h) for h in hits[:TOP]]
        baselines[f"{entry.get('table')}@{entry.get('version')}"] += 1
        row: dict[str, Any] = {"query_id": entry["id"], "kind": kind}
        if logged and mine:
            matched = sum(any(_overlaps(m, g) for g in logged) for m in mine)
            agreement.append(matched / min(len(logged), len(mine)))
            same_first.append(_overlaps(mine[0], logged[0]))
            row["agreement"] = agreement[-1]
        kept = gate(hits, cut) if kind == "ask" else hits[:MAX_SOURCES]
        if kind == "ask":
            now = "answered" if kept else "refused"
            was = str(entry["decision"])
            row["decision"] = [was, now]
            flips["unchanged" if now == was else f"{was}_to_{now}"] += 1
        verdict = (review or {}).get("verdict")
        if verdict in OUT_OF_DOMAIN and kind == "ask":
            paired["refused_out_of_domain"][0].append(not kept)
            paired["refused_out_of_domain"][1].append(entry["decision"] == "refused")
            row["review"] = verdict
        elif verdict in ANSWERABLE and review is not None:
            found = relocate(
                str(review.get("quote") or ""), str(review.get("document") or ""), texts
            )
            if found is None:
                continue
            needle = normalize_ws(found[1])
            shown = json.loads(entry.get("citations") or "[]") if kind == "ask" else []
            ids = [h["chunk_id"] for h in logged] + [c["chunk_id"] for c in shown]
            old = contents.of(str(entry.get("table")), int(entry.get("version") or 0), ids)
            if old is None:
                unavailable += 1
                continue

            def has(content: str, needle: str = needle) -> bool:
                return needle in normalize_ws(content)

            paired["hit@4"][0].append(any(has(h.content) for h in hits[:TOP]))
            paired["hit@4"][1].append(any(has(old[h["chunk_id"]]) for h in logged))
            if kind == "ask":
                paired["answered_with_needle"][0].append(any(has(h.content) for h in kept))
                paired["answered_with_needle"][1].append(
                    any(has(old[c["chunk_id"]]) for c in shown)
                )
            row["review"] = verdict
        rows.append(row)
    tests = {
        name: metrics.sign_test(new, old)._asdict() for name, (new, old) in paired.items() if new
    }
    worse = [n for n, t in tests.items() if t["p"] < UPGRADE_ALPHA and t["losses"] > t["wins"]]
    out = {
        "candidate": {
            "table": candidate.published.table,
            "version": candidate.published.version,
            "model": candidate.published.stamps.model,
            "cut": cut,
            "fusion": candidate.fusion.label,
            "retriever": ask_retriever,
        },
        "baselines": dict(sorted(baselines.items())),
        "entries": len(entries),
        "questions": len(groups),
        "asks": sum(1 for e, _ in groups if e.get("decision") in ("answered", "refused")),
        "top4_agreement": sum(agreement) / len(agreement) if agreement else None,
        "top1_same": sum(same_first) / len(same_first) if same_first else None,
        "flips": {
            "answered_to_refused": flips["answered_to_refused"],
            "refused_to_answered": flips["refused_to_answered"],
            "unchanged": flips["unchanged"],
        },
        "reviewed": {
            "answerable": len(paired["hit@4"][0]),
            "out_of_domain": len(paired["refused_out_of_domain"][0]),
            "baseline_unavailable": unavailable,
        },
        "tests": tests,
        "worse": worse,
        "rows": rows,
    }
    out["table"] = replay_markdown(out)
    return out


def replay_markdown(r: dict[str, Any]) -> str:
    """The replay report as two Markdown tables (figures only)."""

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.1f} %"

    c, f = r["candidate"], r["flips"]
    lines = [
        f"Replayed {r['questions']} distinct logged questions ({r['asks']} asks, "
        f"{r['entries']} log entries) on {c['table']}@{c['version']} ({c['model']}, "
        f"fusion {c['fusion']}, cut {c['cut']:.3f}), against what users were shown "
        f"({', '.join(f'{k}: {v}' for k, v in r['baselines'].items()) or 'no entries'}).",
        "",
        "| top-4 agreement | same first hit | answered → NO ANSWER | NO ANSWER → answered | "
        "unchanged |",
        "|---|---|---|---|---|",
        f"| {pct(r['top4_agreement'])} | {pct(r['top1_same'])} | {f['answered_to_refused']} | "
        f"{f['refused_to_answered']} | {f['unchanged']} |",
    ]
    if r["tests"]:
        lines += [
            "",
            f"Reviewed: {r['reviewed']['answerable']} answerable, "
            f"{r['reviewed']['out_of_domain']} out-of-domain"
            + (
                f" ({r['reviewed']['baseline_unavailable']} without the logged version's chunks)"
                if r["reviewed"]["baseline_unavailable"]
                else ""
            )
            + ".",
            "",
            "| paired test (candidate vs shown) | wins | losses | p |",
            "|---|---|---|---|",
            *[
                f"| {n} | {t['wins']} | {t['losses']} | {t['p']:.3g} |"
                for n, t in r["tests"].items()
            ],
        ]
    if r["worse"]:
        lines += ["", f"**Worse on reviewed traffic:** {', '.join(r['worse'])} (p < 0.05)."]
    return "\n".join(lines)
