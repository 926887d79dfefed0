"""The README's model-upgrade runbook, followed for real and timed (issue 8).

    python -m rag_assets.bench.upgrade_walkthrough --documents DIR --questions DIR --to MODEL_DIR \\
        --work /tmp/upgrade [--json]
    python -m rag_assets.bench.upgrade_walkthrough --documents DIR --questions DIR --adapt \\
        [--adapt-steps N] --work /tmp/upgrade-adapt [--json]

On a persistent Dagster instance (``WORK/dagster_home``) and a real LanceDB directory: index with
the packaged MiniLM; switch ``RAG_EMBEDDING_MODEL`` to ``--to`` and reload the definitions; read
what is stale (the UI's status) and what the automation sensor would request; run that (embed,
evaluate, calibrate, publish) while a second thread queries the *old* published index in a loop
(every answer must come from one table version, with zero errors); then ``rollback``. Each step
is timed; the result is one JSON document (and a Markdown table).

With ``--adapt`` (issue 32) the upgrade is the encoder adapted to the corpus instead of another
model: ``RAG_ADAPT=on`` (and ``RAG_ADAPT_STEPS``) is what changes; the run trains
``adapted_encoder``, embeds with the proposed model, evaluates it against the published base
table (``not_worse_than_published``) and publishes; the queries follow the published table's
model, and ``rollback`` returns to the base one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rag_assets.settings import Settings

ASSETS = [
    "extracted_documents",
    "chunks",
    "chunk_embeddings",
    "retrieval_eval",
    "refusal_threshold",
    "published_index",
]
QUERIES = [
    "How do I roll back to the previous embedding model?",
    "Which assets become stale after a model change?",
    "What does the refusal threshold do?",
]


def _stale(defs: Any, instance: Any, adapt: bool = False) -> list[str]:
    import dagster as dg
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._core.loader import LoadingContextForTest

    resolver = CachingStaleStatusResolver(
        instance, defs.resolve_asset_graph(), LoadingContextForTest(instance)
    )
    keys = (["adapted_encoder"] if adapt else []) + ASSETS
    return [k for k in keys if resolver.get_status(dg.AssetKey(k)).name != "FRESH"]


def walkthrough(
    documents: Path,
    questions: Path,
    to_model: str,
    work: Path,
    adapt: bool = False,
    adapt_steps: int = 0,
) -> dict[str, Any]:
    import dagster as dg

    from rag_assets.defs.build import build_definitions
    from rag_assets.defs.run import materialize_graph
    from rag_assets.lib.index.store import IndexStore
    from rag_assets.lib.query.retrieve import Index

    work.mkdir(parents=True, exist_ok=True)
    home = work / "dagster_home"
    home.mkdir(exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    instance = dg.DagsterInstance.get()
    base = Settings.from_env(os.environ)
    s1 = replace(
        base,
        documents_dir=str(documents),
        eval_dir=str(questions),
        index_uri=str(work / "index"),
        work_dir=str(work / "work"),
        embedding_model="",
        adapt="off",
    )
    steps: list[dict[str, Any]] = []

    def step(name: str, t0: float, **info: Any) -> None:
        steps.append({"step": name, "s": round(time.perf_counter() - t0, 1), **info})

    t = time.perf_counter()
    first = materialize_graph(s1, progress=False, instance=instance)
    old_pub = IndexStore(s1.index_uri).published()
    step(
        "1. index with MiniLM (whole graph)",
        t,
        success=first.success,
        table=old_pub and old_pub.table,
    )
    if not first.success or old_pub is None:
        return {"steps": steps, "error": first.error}

    t = time.perf_counter()
    if adapt:  # issue 32: the same model, adapted to the corpus by the graph
        s2 = replace(s1, adapt="on", adapt_steps=adapt_steps)
    else:
        s2 = replace(s1, embedding_model=to_model)
    defs1, defs2 = build_definitions(s1), build_definitions(s2)  # "reload the code location"
    stale = _stale(defs2, instance, adapt)
    what = "RAG_ADAPT=on" if adapt else "RAG_EMBEDDING_MODEL"
    step(f"2. switch {what}, reload: what is stale", t, stale=stale)

    t = time.perf_counter()
    now = datetime.datetime.now()
    r1 = dg.evaluate_automation_conditions(defs=defs1, instance=instance, evaluation_time=now)
    r2 = dg.evaluate_automation_conditions(
        defs=defs2,
        instance=instance,
        cursor=r1.cursor,
        evaluation_time=now + datetime.timedelta(seconds=30),
    )
    keys = (["adapted_encoder"] if adapt else []) + ASSETS
    requested = [k for k in keys if r2.get_num_requested(dg.AssetKey(k))]
    step("3. automation sensor: what it requests", t, requested=requested)

    # queries on the old published index, in a loop, while the new table is built
    old_index = Index.open(s1.index_uri)
    served: dict[str, int] = {}
    errors: list[str] = []
    latencies: list[float] = []
    stop = threading.Event()

    def query_loop() -> None:
        i = 0
        while not stop.is_set():
            q = QUERIES[i % len(QUERIES)]
            i += 1
            t0 = time.perf_counter()
            try:
                hits = old_index.search(q, "hybrid", k=4)
                versions = {(h.stamps["table"], h.stamps["version"]) for h in hits}
                if len(versions) != 1:
                    errors.append(f"{q!r}: answer mixes versions {sorted(versions)}")
                for v in versions:
                    served[f"{v[0]}@v{v[1]}"] = served.get(f"{v[0]}@v{v[1]}", 0) + 1
            except Exception as e:  # counted, not raised: the loop measures availability
                errors.append(f"{q!r}: {type(e).__name__}: {e}")
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.2)

    loop = threading.Thread(target=query_loop, daemon=True)
    loop.start()
    t = time.perf_counter()
    second = materialize_graph(s2, progress=False, instance=instance)
    new_pub = IndexStore(s2.index_uri).published()
    m = second.metadata.get("chunk_embeddings", {})
    trained = second.metadata.get("adapted_encoder", {})
    step(
        "4. the requested run: " + ("adapt, " if adapt else "") + "embed, evaluate (gate), "
        "calibrate, publish",
        t,
        success=second.success,
        **(
            {
                "adapted": trained.get("status"),
                "self_mrr": [trained.get("self_mrr/base"), trained.get("self_mrr/adapted")],
                "train_s": trained.get("train_seconds"),
                "pairs": trained.get("pairs"),
                "steps": trained.get("steps"),
            }
            if adapt
            else {}
        ),
        embedded=m.get("embedded"),
        reused=m.get("reused"),
        checks=[f"{n}: {'passed' if p else 'FAILED'}" for n, p, _ in second.checks],
        published=new_pub and new_pub.table,
    )
    stop.set()
    loop.join()
    step(
        "   queries on the old table meanwhile",
        time.perf_counter(),
        queries=len(latencies),
        errors=len(errors),
        error_samples=errors[:3],
        served_from=served,
        p50_ms=round(1000 * sorted(latencies)[len(latencies) // 2], 1) if latencies else None,
    )
    t = time.perf_counter()
    # the adapted model is found from the published table's stamps; another model is named
    new_index = Index.open(s2.index_uri) if adapt else Index.open(s2.index_uri, model=to_model)
    ok_new = bool(new_index.search(QUERIES[0], "hybrid", k=4))
    refused = ""
    try:  # MiniLM itself against the new table
        from rag_assets.lib.index.embed import Embedder, resolve_model

        Index.open(s2.index_uri, embedder=Embedder(resolve_model(None)))
    except Exception as e:
        refused = f"{type(e).__name__}: {str(e)[:160]}"
    step(
        "5. queries with the new model; MiniLM refused",
        t,
        answers=ok_new,
        query_model=new_index.embedder.spec.model_id,
        refused=refused,
    )
    t = time.perf_counter()
    back = IndexStore(s2.index_uri).rollback()
    back_index = Index.open(s1.index_uri)
    back_ok = bool(back_index.search(QUERIES[0], "hybrid", k=4))
    step(
        "6. rollback" + ("" if adapt else " (and RAG_EMBEDDING_MODEL back)"),
        t,
        published=back.table,
        answers=back_ok,
        query_model=back_index.embedder.spec.model_id,
    )
    return {
        "documents": str(documents),
        "from": old_pub.stamps.model,
        "upgrade": "adapted encoder (RAG_ADAPT=on)" if adapt else "RAG_EMBEDDING_MODEL",
        "to": new_pub.stamps.model if new_pub else None,
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag_assets.bench.upgrade_walkthrough")
    ap.add_argument("--documents", type=Path, required=True)
    ap.add_argument("--questions", type=Path, required=True)
    ap.add_argument("--to", default="", help="the new model's local directory")
    ap.add_argument("--adapt", action="store_true", help="upgrade to the adapted encoder instead")
    ap.add_argument("--adapt-steps", type=int, default=0, help="RAG_ADAPT_STEPS (0 = auto)")
    ap.add_argument("--work", type=Path, required=True, help="an empty folder for this run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.to and not args.adapt:
        ap.error("give --to MODEL_DIR or --adapt")
    out = walkthrough(
        args.documents, args.questions, args.to, args.work, args.adapt, args.adapt_steps
    )
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print("| step | s | what happened |\n|---|---|---|")
        for s in out["steps"]:
            info = {k: v for k, v in s.items() if k not in ("step", "s")}
            print(f"| {s['step']} | {s['s']} | {json.dumps(info, default=str)} |")
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    raise SystemExit(main())
