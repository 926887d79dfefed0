"""Does a gate calibrated on reviewed traffic hold up? The issue 33 simulation, for real.

    python -m rag_assets.bench.traffic --corpus ../shared/corpus/course \\
        --questions ../shared/eval/course-dev --work /tmp/traffic-sim [--needles 16] [--ood 25] \\
        [--seed 0] [--drift] [--gaps] [--upgrade-model DIR --upgrade-fusion rrf:dense=4] [--json]

1. **split** the question set deterministically (SHA-256 of ``seed:id``): ``--needles`` needles
   (both phrasings) and ``--ood`` out-of-domain questions become traffic, as many others are
   held out for scoring;
2. **index** the corpus with no question set (``rag-assets index``, ``RAG_EVAL_DIR`` empty): the
   model-free cut (a); a copy of that index is calibrated on a hand-written set made of the
   traffic questions (b);
3. **traffic**: a real ``rag-assets serve`` (with a token) gets each traffic question over HTTP
   (``POST /ask``) and the verdict its truth implies (``POST /feedback``: ``answered`` with the
   citation holding the needle, else ``missed`` with the needle; out-of-domain:
   ``right_refusal`` or ``should_refuse``), then is stopped (its log is written on shutdown);
4. **calibrate**: ``rag-assets index`` again: the graph calibrates on the reviewed traffic;
5. **score** the three cuts on the held-out needles and out-of-domain questions (the same table:
   only the cut differs) and say whether the issue's two conditions hold: the traffic gate within
   2 answered and 2 bluffs of (b); more answered than (a) at no more than (a)'s bluffs + 2.

Optional steps: ``--drift`` (steady traffic, then a burst of off-topic questions through the
server; the ``query_log_drift`` check run before and after), ``--gaps`` (the ``content_gaps``
report), ``--upgrade-model`` (``rag-assets index`` with another model and fusion: the
``not_worse_on_traffic`` replay table). Every step records its result in ``WORK/state.json`` and
is skipped when run again (``--redo STEP`` runs one again); the traffic step resumes where it
stopped. The Dagster instance of the traffic index is ``WORK/a-work/dagster``: start the UI with
``DAGSTER_HOME=WORK/a-work/dagster dg dev`` to see ``query_log``'s plots.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STEPS = ("split", "index", "hand", "traffic", "calibrate", "score", "drift", "gaps", "upgrade")


def _order(seed: int, ident: str) -> str:
    return hashlib.sha256(f"{seed}:{ident}".encode()).hexdigest()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text("utf-8").splitlines() if x.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")


class Sim:
    """The simulation's folders, state and commands."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.corpus = Path(args.corpus).resolve()
        self.questions = Path(args.questions).resolve()
        self.state_file = self.work / "state.json"
        self.state: dict[str, Any] = (
            json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}
        )
        self.index = self.work / "index"
        self.index_b = self.work / "index-b"

    def save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.state_file)

    def log(self, line: str) -> None:
        print(f"[traffic-sim] {line}", file=sys.stderr, flush=True)

    def env(self, work: str, eval_dir: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME",)}
        for var in ("RAG_EMBEDDING_MODEL", "RAG_FUSION", "RAG_DISTANCE_CUT", "RAG_LLM_URL"):
            env.pop(var, None)
        env |= {
            "RAG_WORK_DIR": str(self.work / work),
            "RAG_EVAL_DIR": str(eval_dir),
            "RAG_QUERY_LOG": "on",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **extra,
        }
        return env

    def cli(self, argv: list[str], env: dict[str, str]) -> str:
        cmd = [sys.executable, "-m", "rag_assets.cli", *argv]
        self.log("$ rag-assets " + " ".join(argv))
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"rag-assets {argv[0]} failed: {r.stderr.strip() or r.stdout[-2000:]}")
        return r.stdout

    # -- the steps ------------------------------------------------------------------------
    def split(self) -> dict[str, Any]:
        from rag_assets.lib.evaluate.questions import check_needles, load_needle_set
        from rag_assets.lib.ingest.extract import extract_folder

        qset = load_needle_set(self.questions)
        docs = {d.document_id: d.text for d in extract_folder(self.corpus).documents if d.ok}
        broken = {b.question_id for b in check_needles(qset.questions, docs, collapse_ws=True)}
        usable = sorted(
            (q for q in qset.questions if q.id not in broken),
            key=lambda q: _order(self.args.seed, q.id),
        )
        ood = sorted(qset.out_of_domain, key=lambda o: _order(self.args.seed, o.id))
        n, m = min(self.args.needles, len(usable) // 2), min(self.args.ood, len(ood) // 2)
        split = {
            "traffic_needles": [q.id for q in usable[:n]],
            "heldout_needles": [q.id for q in usable[n : 2 * n]],
            "traffic_ood": [o.id for o in ood[:m]],
            "heldout_ood": [o.id for o in ood[m : 2 * m]],
            "not_in_corpus": len(broken),
        }
        self.log(f"split: {n} + {n} needles, {m} + {m} out-of-domain ({len(broken)} not in corpus)")
        return split

    def _rows(self, kind: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        split = self.state["split"]
        qrows = {r["id"]: r for r in _jsonl(self.questions / "questions.jsonl")}
        orows = {r["id"]: r for r in _jsonl(self.questions / "out_of_domain.jsonl")}
        return [qrows[i] for i in split[f"{kind}_needles"]], [
            orows[i] for i in split[f"{kind}_ood"]
        ]

    def index_a(self) -> dict[str, Any]:
        (self.work / "no-questions").mkdir(exist_ok=True)
        env = self.env("a-work", self.work / "no-questions")
        out = self.cli(
            ["index", "--documents", str(self.corpus), "--index", str(self.index), "--quiet"], env
        )
        shutil.rmtree(self.index_b, ignore_errors=True)
        shutil.copytree(self.index, self.index_b)  # (b) starts from the same table, no traffic
        return self._published(self.index) | {"summary": out.strip().splitlines()[-3:]}

    def hand(self) -> dict[str, Any]:
        folder = self.work / "hand-written"
        questions, ood = self._rows("traffic")
        _write_jsonl(folder / "questions.jsonl", questions)
        _write_jsonl(folder / "out_of_domain.jsonl", ood)
        env = self.env("b-work", folder)
        self.cli(
            ["index", "--documents", str(self.corpus), "--index", str(self.index_b), "--quiet"], env
        )
        return self._published(self.index_b)

    def traffic(self) -> dict[str, Any]:
        import httpx

        questions, ood = self._rows("traffic")
        asks: list[tuple[str, str, dict[str, Any] | None]] = []
        inside: list[tuple[str, str, dict[str, Any] | None]] = [
            (f"{q['id']}/{p}", q["queries"][p], q) for q in questions for p in sorted(q["queries"])
        ]
        outside: list[tuple[str, str, dict[str, Any] | None]] = [
            (o["id"], o["query"], None) for o in ood
        ]
        for i in range(max(len(inside), len(outside))):  # a steady mix, not blocks
            asks += inside[i : i + 1] + outside[i : i + 1]
        done_file = self.work / "traffic.jsonl"
        done = {r["key"] for r in _jsonl(done_file)}
        token = secrets.token_urlsafe(16)
        url, proc = self._serve(token)
        headers = {"Authorization": f"Bearer {token}"}
        try:
            with (
                httpx.Client(base_url=url, headers=headers, timeout=300) as c,
                done_file.open("a") as out,
            ):
                for key, text, truth in asks:
                    if key in done:
                        continue
                    answer = c.post("/ask", json={"question": text})
                    answer.raise_for_status()
                    body = answer.json()
                    verdict = _verdict(body, truth)
                    fb = c.post("/feedback", json={"query_id": body["query_id"], **verdict})
                    if fb.status_code != 200:
                        raise SystemExit(f"POST /feedback refused {key}: {fb.text}")
                    row = {
                        "key": key,
                        "query_id": body["query_id"],
                        "no_answer": body["no_answer"],
                        **verdict,
                    }
                    out.write(json.dumps(row) + "\n")
                    out.flush()
        finally:
            self._stop(proc)  # the log's queue is written on shutdown
        env = self.env("a-work", self.work / "no-questions")
        status = json.loads(self.cli(["status", "--index", str(self.index), "--json"], env))
        rows = _jsonl(done_file)
        from collections import Counter

        return {
            "asked": len(rows),
            "verdicts": dict(Counter(r["verdict"] for r in rows)),
            "calibration": status["query_log"]["calibration"],
            "entries": status["query_log"]["entries"],
        }

    def calibrate(self) -> dict[str, Any]:
        env = self.env("a-work", self.work / "no-questions")
        out = self.cli(
            ["index", "--documents", str(self.corpus), "--index", str(self.index), "--quiet"], env
        )
        status = json.loads(self.cli(["status", "--index", str(self.index), "--json"], env))
        return self._published(self.index) | {
            "calibration": status["query_log"]["calibration"],
            "summary": out.strip().splitlines()[-4:],
        }

    def score(self) -> dict[str, Any]:
        from rag_assets.lib.evaluate import calibrate
        from rag_assets.lib.evaluate.evaluate import evaluate_needles
        from rag_assets.lib.evaluate.questions import NeedleSet, OODQuery, Question
        from rag_assets.lib.index.embed import Embedder, resolve_model
        from rag_assets.lib.index.store import IndexStore
        from rag_assets.lib.query.cite import MAX_SOURCES
        from rag_assets.lib.query.retrieve import Index

        questions, ood = self._rows("heldout")
        qset = NeedleSet(
            [
                Question(q["id"], q["document"], q["needle"], dict(q["queries"]), q.get("page"))
                for q in questions
            ],
            [OODQuery(o["id"], o["kind"], o["query"]) for o in ood],
        )
        store = IndexStore(self.index)
        published = store.published()
        assert published is not None
        index = Index(store, published, Embedder(resolve_model(None)))
        _, refusal = evaluate_needles(index, qset, retrievers=("hybrid",))
        assert refusal is not None
        gates = {
            "a": ("(a) model-free cut", self.state["index"]["threshold"]),
            "b": ("(b) hand-written set of the traffic questions", self.state["hand"]["threshold"]),
            "t": ("traffic-calibrated (published)", self.state["calibrate"]["threshold"]),
        }
        rows = {}
        for key, (name, cut) in gates.items():
            r = calibrate.sweep(refusal.answerable, refusal.ood, cuts=[cut], keep=MAX_SOURCES)[0]
            rows[key] = {
                "gate": name,
                "cut": cut,
                "answered": r.answered_correct,
                "answered_wrong": r.answered_wrong,
                "refused": r.refused_answerable,
                "bluffs": r.bluffs_near + r.bluffs_unrelated,
                "queries": r.n_answerable,
                "ood": r.n_near + r.n_unrelated,
            }
        a, b, t = rows["a"], rows["b"], rows["t"]
        cond1 = abs(t["answered"] - b["answered"]) <= 2 and abs(t["bluffs"] - b["bluffs"]) <= 2
        cond2 = t["answered"] > a["answered"] and t["bluffs"] <= a["bluffs"] + 2
        return {"rows": rows, "within_2_of_hand_written": cond1, "beats_model_free": cond2}

    def drift(self) -> dict[str, Any]:
        import httpx

        from rag_assets.lib.evaluate.questions_gen import unrelated_questions
        from rag_assets.lib.evaluate.traffic_watch import DRIFT_WINDOW, MIN_TRAILING

        questions, ood = self._rows("traffic")
        held_q, held_o = self._rows("heldout")
        steady = [t for q in questions + held_q for t in q["queries"].values()]
        steady_ood = [o["query"] for o in ood + held_o]
        mix = []
        for i in range(max(len(steady), len(steady_ood))):
            mix += steady[i : i + 1] + steady_ood[i : i + 1]
        token = secrets.token_urlsafe(16)
        url, proc = self._serve(token)
        headers = {"Authorization": f"Bearer {token}"}
        try:
            with httpx.Client(base_url=url, headers=headers, timeout=300) as c:
                asked = c.get("/log", params={"limit": 500}).json()
                have = sum(1 for e in asked if e.get("decision"))
                need = max(0, (MIN_TRAILING + 1) * DRIFT_WINDOW - have)
                for i in range(need):
                    c.post("/ask", json={"question": mix[i % len(mix)]}).raise_for_status()
        finally:
            self._stop(proc)
        before = self._run_check()
        url, proc = self._serve(token)
        try:
            with httpx.Client(base_url=url, headers=headers, timeout=300) as c:
                for text in unrelated_questions()[-DRIFT_WINDOW:]:
                    c.post("/ask", json={"question": text}).raise_for_status()
        finally:
            self._stop(proc)
        after = self._run_check()
        return {"steady_asks_added": need, "before_burst": before, "after_burst": after}

    def gaps(self) -> dict[str, Any]:
        from rag_assets.defs.traffic_set import GAPS_MD
        from rag_assets.lib.index.store import IndexStore

        self._job({"content_gaps"}, set())
        store = IndexStore(self.index)
        report = store.read_text(GAPS_MD) or ""
        return {"report": store.file_location(GAPS_MD), "head": report.splitlines()[:30]}

    def upgrade(self) -> dict[str, Any]:
        from rag_assets.lib.index.store import IndexStore

        if not self.args.upgrade_model:
            raise SystemExit("--upgrade-model DIR is needed for the upgrade step")
        extra = {"RAG_EMBEDDING_MODEL": str(Path(self.args.upgrade_model).expanduser())}
        if self.args.upgrade_fusion:
            extra["RAG_FUSION"] = self.args.upgrade_fusion
        env = self.env("a-work", self.work / "no-questions", **extra)
        cmd = [sys.executable, "-m", "rag_assets.cli", "index", "--documents", str(self.corpus)]
        cmd += ["--index", str(self.index), "--quiet"]
        self.log("$ " + " ".join(f"{k}={v}" for k, v in extra.items()) + " rag-assets index …")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        store = IndexStore(self.index)
        staged = store.staging()
        table = store.read_text(f"evaluation/{staged.table}@{staged.version}.replay.md")
        return {
            "exit": r.returncode,
            "summary": (r.stdout or r.stderr).strip().splitlines()[-8:],
            "staged": f"{staged.table}@{staged.version}",
            "published": self._published(self.index),
            "replay": table or "no replay report (see the summary)",
        }

    # -- helpers --------------------------------------------------------------------------
    def _published(self, index: Path) -> dict[str, Any]:
        from rag_assets.lib.index.store import IndexStore

        pub = IndexStore(index).published()
        assert pub is not None
        return {
            "table": pub.table,
            "version": pub.version,
            "threshold": pub.threshold,
            "threshold_source": pub.threshold_source,
            "evaluation_source": pub.evaluation_source,
            "evaluation_counts": pub.evaluation_counts,
        }

    def _serve(self, token: str) -> tuple[str, subprocess.Popen[bytes]]:
        import httpx

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = self.env("a-work", self.work / "no-questions", RAG_API_TOKEN=token)
        log = (self.work / "serve.log").open("ab")
        cmd = [sys.executable, "-m", "rag_assets.cli", "serve", "--index", str(self.index)]
        proc = subprocess.Popen(cmd + ["--port", str(port)], env=env, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(
                    f"serve exited with {proc.returncode}: see {self.work / 'serve.log'}"
                )
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return url, proc
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        proc.kill()
        raise SystemExit("serve did not become healthy in 600 s")

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGINT)  # a clean shutdown writes the log's queue
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _settings(self) -> Any:
        from dataclasses import replace

        from rag_assets.settings import Settings

        env = self.env("a-work", self.work / "no-questions")
        return replace(
            Settings.from_env(env),
            documents_dir=str(self.corpus),
            index_uri=str(self.index),
        )

    def _job(self, assets: set[str], checks: set[tuple[str, str]]) -> Any:
        import dagster as dg

        from rag_assets.defs.build import build_definitions
        from rag_assets.defs.run import index_instance

        settings = self._settings()
        defs = build_definitions(settings)
        job = defs.resolve_implicit_global_asset_job_def().get_subset(
            asset_selection={dg.AssetKey(a) for a in assets},
            asset_check_selection={dg.AssetCheckKey(dg.AssetKey(a), c) for a, c in checks},
        )
        res = job.execute_in_process(instance=index_instance(settings), raise_on_error=False)
        if not res.success:
            raise SystemExit(f"the Dagster run of {sorted(assets)} failed")
        return res

    def _run_check(self) -> dict[str, Any]:
        res = self._job({"query_log"}, {("query_log", "query_log_drift")})
        (check,) = res.get_asset_check_evaluations()
        meta = {k: getattr(v, "value", v) for k, v in check.metadata.items()}
        return {"passed": check.passed, "severity": check.severity.value, **meta}


def _verdict(answer: dict[str, Any], truth: dict[str, Any] | None) -> dict[str, Any]:
    """The verdict a question's truth implies (see the module docstring)."""
    from rag_assets.lib.types import normalize_ws

    if truth is None:
        return {"verdict": "right_refusal" if answer["no_answer"] else "should_refuse"}
    needle = normalize_ws(truth["needle"])
    for c in answer["citations"]:
        if needle in normalize_ws(c["quote"]):
            return {"verdict": "answered", "source": c["index"]}
    return {"verdict": "missed", "document": truth["document"], "quote": truth["needle"]}


def markdown(state: dict[str, Any]) -> str:
    lines = []
    if "score" in state:
        s = state["score"]
        lines += [
            "| gate | cut | answered (correct source) | answered wrong | refused | bluffs |",
            "|---|---|---|---|---|---|",
        ]
        for r in s["rows"].values():
            lines.append(
                f"| {r['gate']} | {r['cut']:.3f} | {r['answered']}/{r['queries']} | "
                f"{r['answered_wrong']} | {r['refused']} | {r['bluffs']}/{r['ood']} |"
            )
        ok = {True: "holds", False: "DOES NOT HOLD"}
        lines += [
            "",
            "- traffic gate within 2 answered and 2 bluffs of (b): "
            + ok[s["within_2_of_hand_written"]],
            "- answers more than (a) at no more than (a)'s bluffs + 2: "
            + ok[s["beats_model_free"]],
        ]
    if "calibrate" in state:
        c = state["calibrate"]
        lines.append(
            f"- published after the traffic: evaluation_source {c['evaluation_source']!r}, cut "
            f"{c['threshold']} ({c['threshold_source']}), counts {c['evaluation_counts']}"
        )
    if "drift" in state:
        d = state["drift"]
        for when in ("before_burst", "after_burst"):
            x = d[when]
            verdict = "passed" if x["passed"] else "WARN"
            lines.append(f"- drift check {when.replace('_', ' ')}: {verdict} ({x.get('reasons')})")
    if "gaps" in state:
        lines += ["", f"Content gaps ({state['gaps']['report']}):", "", *state["gaps"]["head"][:20]]
    if "upgrade" in state:
        lines += [
            "",
            f"Upgrade replay ({state['upgrade']['staged']}):",
            "",
            state["upgrade"]["replay"],
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m rag_assets.bench.traffic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--corpus", required=True, help="the documents folder")
    p.add_argument("--questions", required=True, help="a needle-format question set for it")
    p.add_argument("--work", required=True, help="where indexes, logs and state.json go")
    p.add_argument("--needles", type=int, default=16, help="traffic needles (as many held out)")
    p.add_argument("--ood", type=int, default=25, help="traffic out-of-domain (as many held out)")
    p.add_argument("--seed", type=int, default=0, help="the split's seed")
    p.add_argument("--drift", action="store_true", help="also: a burst of off-topic traffic")
    p.add_argument("--gaps", action="store_true", help="also: the content-gap report")
    p.add_argument("--upgrade-model", default=None, help="also: upgrade to this model directory")
    p.add_argument("--upgrade-fusion", default=None, help="… with this RAG_FUSION")
    p.add_argument("--redo", action="append", default=[], choices=STEPS, help="run a step again")
    p.add_argument("--json", action="store_true", help="the whole state as JSON")
    args = p.parse_args(argv)
    sim = Sim(args)
    wanted = ["split", "index", "hand", "traffic", "calibrate", "score"]
    wanted += ["drift"] * args.drift + ["gaps"] * args.gaps + ["upgrade"] * bool(args.upgrade_model)
    for step in args.redo:
        sim.state.pop(step, None)
        if step == "traffic":
            (sim.work / "traffic.jsonl").unlink(missing_ok=True)
    run = {"index": sim.index_a, "split": sim.split, "hand": sim.hand, "traffic": sim.traffic,
           "calibrate": sim.calibrate, "score": sim.score, "drift": sim.drift, "gaps": sim.gaps,
           "upgrade": sim.upgrade}  # fmt: skip
    for step in wanted:
        if step in sim.state:
            sim.log(f"{step}: done before (state.json)")
            continue
        t0 = time.perf_counter()
        sim.state[step] = run[step]() | {"seconds": round(time.perf_counter() - t0, 1)}
        sim.save()
        sim.log(f"{step}: {time.perf_counter() - t0:.0f} s")
    print(json.dumps(sim.state, indent=2) if args.json else markdown(sim.state))
    if "score" in sim.state:
        s = sim.state["score"]
        return 0 if s["within_2_of_hand_written"] and s["beats_model_free"] else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
