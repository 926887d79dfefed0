"""Issue 31: progress on long work. The assets log ``progress:`` lines (throttled); the CLI turns
a run's events into one line per stage as it ends, with its own time, or into bars on a
terminal. Plumbing on hand-made events here; a real ``rag-assets index`` with stderr not a
terminal, and one under a pseudo-terminal, are in ``rag_assets_tests/test_ui.py``."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rag_assets.defs import progress as defs_progress
from rag_assets.defs.progress import StepProgress, parse_progress, progress_line
from rag_assets.defs.run import STAGES
from rag_assets.defs.run_progress import RunProgress
from rag_assets.lib.ingest.extract import extract_folder


def _ev(step: str, kind: str | None, at: float, message: str = "") -> SimpleNamespace:
    event = SimpleNamespace(event_type_value=kind) if kind else None
    return SimpleNamespace(step_key=step, dagster_event=event, user_message=message, timestamp=at)


def test_progress_lines_round_trip():
    line = progress_line("evaluate/self-queries", 12, 150, "searches")
    assert line == "progress: evaluate/self-queries 12/150 searches"
    p = parse_progress(line)
    assert p is not None and (p.stage, p.phase, p.done, p.total, p.unit) == (
        "evaluate", "self-queries", 12, 150, "searches"
    )  # fmt: skip
    p = parse_progress(progress_line("extract", 3, 9, "files", "a (b).md"))
    assert p is not None and (p.phase, p.what) == ("", "a (b).md")
    assert parse_progress("written 4/9 chunks to the table") is None


def test_step_progress_is_throttled_but_says_first_and_last(monkeypatch):
    said: list[str] = []
    context = SimpleNamespace(log=SimpleNamespace(info=said.append))
    clock = [100.0]
    monkeypatch.setattr(defs_progress.time, "monotonic", lambda: clock[0])
    report = StepProgress(context, "embed", "texts")
    for done in range(0, 11):
        report(done, 10)
        clock[0] += 0.3  # 0.3 s per step: one line a second gets through
    assert said[0] == "progress: embed 0/10 texts" and said[-1] == "progress: embed 10/10 texts"
    assert 3 <= len(said) <= 6
    report(10, 10)  # the last one is not repeated
    assert said[-2:] != ["progress: embed 10/10 texts"] * 2


def test_extract_folder_reports_each_file_before_reading_it(tmp_path):
    for name in ("a.md", "b.txt", "c.md"):
        (tmp_path / name).write_text(f"# {name}\n\nSome words.\n")
    seen: list[tuple[int, int, str]] = []
    extract_folder(tmp_path, progress=lambda i, n, doc: seen.append((i, n, doc)))
    assert seen == [(0, 3, "a.md"), (1, 3, "b.txt"), (2, 3, "c.md"), (3, 3, "")]


def _run(display: RunProgress) -> None:
    t = 1000.0
    for _, step in STAGES:
        display.on_event(_ev(step, "STEP_START", t))
        if step == "extracted_documents":
            display.on_event(_ev(step, None, t + 0.5, progress_line("extract", 4, 9, "files", "x")))
            display.on_event(_ev(step, None, t + 1, progress_line("extract", 9, 9, "files")))
        if step == "chunk_embeddings":
            display.on_event(_ev(step, None, t + 2, progress_line("embed", 79, 79, "texts")))
        if step == "retrieval_eval":
            for phase, n in (("questions", 64), ("other-topics", 3082)):
                line = progress_line(f"evaluate/{phase}", n, n, "searches")
                display.on_event(_ev(step, None, t + 3, line))
        if step in ("refusal_threshold", "published_index"):
            display.on_event(_ev(step, "STEP_SKIPPED", t))
            continue
        display.on_event(_ev("chunk_embeddings_index_matches_chunks", "STEP_START", t))
        if step != "retrieval_eval":
            display.on_event(_ev(step, "ASSET_MATERIALIZATION", t + 4))
        display.on_event(_ev(step, "STEP_SUCCESS", t + 4.25))
        t += 10


def test_one_line_per_stage_as_it_ends_with_its_own_time():
    out = io.StringIO()
    display = RunProgress(out, STAGES, lines=True)
    _run(display)
    display.close()
    lines = out.getvalue().splitlines()
    assert [x.split()[1] for x in lines] == [label for label, _ in STAGES]
    assert lines[1] == "index: extract      4.2 s  9 files"
    assert lines[3] == "index: embed        4.2 s  79 texts"
    assert lines[5] == "index: evaluate     4.2 s  not re-run (its inputs are unchanged)"
    assert lines[6] == "index: calibrate skipped (nothing changed)"
    assert "\r" not in out.getvalue()  # no bar frames in a log file


def test_on_a_terminal_bars_move_and_the_stage_lines_stay():
    out = io.StringIO()
    display = RunProgress(out, STAGES, live=True)
    _run(display)
    display.close()
    text = out.getvalue()
    assert "\r" in text and "stages |" in text  # tqdm frames of the stage bar
    assert "extract: 4/9" not in text or "files" in text
    assert "embed" in text and "79/79" in text  # the work bar of the embedding
    assert "index: embed        4.2 s  79 texts" in text


def test_adapt_training_says_each_tenth_off_a_terminal_with_its_time():
    """Issue 44: ``rag-assets adapt`` (and ``index`` with RAG_ADAPT=on) off a terminal: the
    training says where it is each tenth of its steps, with the time so far and what is left,
    not only when the stage ends (149 steps took 28 minutes in silence)."""
    from rag_assets.defs.run import ADAPT_STAGES

    out = io.StringIO()
    display = RunProgress(out, ADAPT_STAGES, lines=True, name="adapt")
    t = 1000.0
    display.on_event(_ev("adapted_encoder", "STEP_START", t))
    for step in range(1, 21):  # 20 steps, 3 s each, a line each (StepProgress throttles to 1 s)
        line = progress_line("adapt/training", step, 20, "steps", f"loss {2 - step / 20:.3f}")
        display.on_event(_ev("adapted_encoder", None, t + 3 * step, line))
    display.on_event(_ev("adapted_encoder", "ASSET_MATERIALIZATION", t + 70))
    display.on_event(_ev("adapted_encoder", "STEP_SUCCESS", t + 70))
    display.close()
    lines = out.getvalue().splitlines()
    # issue 51: no estimate from one step (its time would include the training's setup)
    assert lines[0] == "adapt: adapt      3.0 s  training 1/20 steps (loss 1.950)"
    assert lines[1] == "adapt: adapt      6.0 s  training 2/20 steps (loss 1.900), about 54 s left"
    assert len(lines) == 12  # steps 1, 2, 4, ..., 20: one a tenth, and the stage's end
    assert lines[-2] == "adapt: adapt     60.0 s  training 20/20 steps (loss 1.000)"
    assert lines[-1] == "adapt: adapt     70.0 s  20 steps"
    # the other stages' counts stay quiet until they end, as before
    quiet = io.StringIO()
    other = RunProgress(quiet, ADAPT_STAGES, lines=True, name="adapt")
    other.on_event(_ev("chunks", "STEP_START", t))
    other.on_event(_ev("chunks", None, t + 1, progress_line("chunk", 1, 9, "files")))
    assert quiet.getvalue() == ""


def test_the_training_estimate_holds_when_steps_slow_down_and_ignores_the_setup():
    """Issue 51: the estimate seen said 14 minutes at step 1 and 2 minutes at step 90 of 100,
    and the last 10 steps took 144 s. The rate is measured from the training's first step (80 s
    of setup before it are not a step) and follows the last tenth when steps get slower."""
    from rag_assets.defs.run import ADAPT_STAGES
    from rag_assets.defs.run_progress import time_left

    out = io.StringIO()
    display = RunProgress(out, ADAPT_STAGES, lines=True, name="adapt")
    t = 1000.0
    display.on_event(_ev("adapted_encoder", "STEP_START", t))
    at = t + 80.0  # model load and pairs: no step yet
    for step in range(1, 101):  # 1 s a step up to 50, then 14.4 s a step (the cores got busy)
        at += 1.0 if step <= 50 else 14.4
        line = progress_line("adapt/training", step, 100, "steps", "loss 1.000")
        display.on_event(_ev("adapted_encoder", None, at, line))
    said = {
        int(m[1]): m[2]
        for m in (
            re.search(r"training (\d+)/100 .*about (.+) left", x)
            for x in out.getvalue().splitlines()
        )
        if m
    }
    # 80 steps at 1 s, from the first step: not (80 s setup + 20 s) / 20 steps = 400 s
    assert said[20] == "80 s"
    assert said[90] == "2 min"  # 10 steps at the last tenth's 14.4 s: 144 s, what they took
    # the rule itself, hand-computed: 5 steps of 2 s, then 2 of 10 s: the last tenth (2 units)
    points = [(0.0, 1), (2.0, 2), (4.0, 3), (6.0, 4), (8.0, 5), (18.0, 6), (28.0, 7)]
    assert time_left(points, 20) == 13 * 10.0  # slower of 27/6 = 4.5 s and (28-8)/2 = 10 s
    assert time_left(points[:1], 20) is None
