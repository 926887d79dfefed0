"""Every setting is range-checked and named in its error (issue 30), generically over the
settings table: each entry of ``ENV`` has a rule, and bad values derived from that rule are
refused in one line naming the variable (a secret's value never shown)."""

from __future__ import annotations

import pytest

from rag_assets.cli import main
from rag_assets.settings import ENV, RULES, Rule, Settings


def _num(rule: Rule, value: float) -> str:
    return str(int(value)) if rule.kind == "int" else repr(float(value))


def _bad_values(rule: Rule) -> list[str]:
    """Values the rule must refuse, derived from the rule alone."""
    bad = ["a\nb", "x\x00y"]  # no setting holds a control character
    if rule.kind in ("int", "float", "cut"):
        assert rule.lo is not None and rule.hi is not None
        step = 1 if rule.kind == "int" else 0.5
        bad += ["abc", "nan", "inf", "-inf", _num(rule, rule.lo - step), _num(rule, rule.hi + step)]
        if rule.kind == "int":
            bad += ["1.5", _num(rule, rule.hi * 10)]
    elif rule.kind == "choice":
        bad += ["no-such-choice"] + ([] if "" in rule.choices else [""])
    elif rule.kind == "path":
        bad += ["", "   "]
    elif rule.kind == "url":
        bad += ["ftp://host/x", "not a url", "http://", "localhost:8080"]
    elif rule.kind == "cron":
        bad += ["every hour", "* * *", "0 * * * * * *"]
    elif rule.kind == "hosts":
        bad += ["example.com:8000", "bad host", "a.com,under_score!"]
    elif rule.kind == "device":
        bad += ["gpu", "cuda:x", "cpu:0", "tpu"]
    elif rule.kind == "fusion":
        bad += ["mean", "rrf:dense=-1", "rrf:k=x", "rrf:speed=2", "dense:k=3"]
    return bad


def _good_values(name: str, rule: Rule) -> list[str]:
    good = [ENV[name][1]]
    if rule.kind in ("int", "float", "cut"):
        good += [_num(rule, rule.lo), _num(rule, rule.hi)]
    elif rule.kind == "choice":
        good += [c.upper() for c in rule.choices]
    elif rule.kind == "url":
        good += ["", "http://127.0.0.1:8080/v1", "https://example.com"]
    elif rule.kind == "hosts":
        good += ["example.com", "rag.example.com, 10.0.0.5,::1"]
    elif rule.kind == "device":
        good += ["auto", "cpu", "cuda", "cuda:1", "mps"]
    elif rule.kind == "fusion":
        good += ["rrf", "rrf:dense=2", "rrf:dense=1.5,bm25=0,k=60,depth=50", "dense", "bm25"]
    return good


def test_every_setting_has_a_rule():
    assert set(RULES) == set(ENV)


CASES = [(name, value) for name in sorted(ENV) for value in _bad_values(RULES[name])]


@pytest.mark.parametrize("name,value", CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_a_bad_value_of_any_setting_is_refused_naming_it(name: str, value: str):
    var = ENV[name][0]
    with pytest.raises(ValueError) as exc:
        Settings.from_env({var: value})
    message = str(exc.value)
    assert message.startswith(var) and "\n" not in message
    if RULES[name].secret:
        assert value not in message and "hidden" in message


GOOD = [(name, value) for name in sorted(ENV) for value in _good_values(name, RULES[name])]


@pytest.mark.parametrize("name,value", GOOD, ids=[f"{n}={v!r}" for n, v in GOOD])
def test_a_good_value_of_any_setting_is_taken(name: str, value: str):
    Settings.from_env({ENV[name][0]: value})


@pytest.mark.parametrize("value", ["nan", "inf", "-3", "2.5"])
def test_the_distance_cut_is_a_finite_cosine_distance(value: str):
    with pytest.raises(ValueError, match=r"^RAG_DISTANCE_CUT='.*': not a cosine distance"):
        Settings.from_env({"RAG_DISTANCE_CUT": value})


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "stale assets", "--index", "/nonexistent/index"],
        ["ask", "how do I roll back", "--index", "/nonexistent/index"],
        ["serve", "--index", "/nonexistent/index"],
        ["mcp", "--index", "/nonexistent/index"],
        ["index", "--documents", "/nonexistent/docs", "--index", "/nonexistent/index"],
    ],
    ids=lambda a: a[0],
)
def test_cuda_without_one_is_refused_by_every_encoding_command(argv, monkeypatch, capsys):
    """The docs promise an explicit RAG_DEVICE=cuda on a machine without CUDA fails in one
    line, also where the ONNX query encoder would never touch torch (search, ask, serve)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: RAG_DEVICE=cuda is valid here")
    monkeypatch.setenv("RAG_DEVICE", "cuda")
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("rag-assets: error: RAG_DEVICE=cuda:") and "\n" not in err
    assert "no CUDA device" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "70000"],
        ["serve", "--port", "0"],
        ["chunk", "x.md", "--target", "0"],
        ["questions", "--n", "-1"],
        ["backfill", "--batch-rows", "abc"],
    ],
)
def test_a_flag_out_of_range_is_a_usage_error_naming_it(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    flag = next(a for a in argv if a.startswith("--"))
    assert flag in err and ("give a number" in err or "whole number" in err)
