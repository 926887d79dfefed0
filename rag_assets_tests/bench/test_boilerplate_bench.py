"""``python -m rag_assets.bench.boilerplate`` (issue 49) run small: a Texinfo-like manual of six
pages written to a folder, served by a real HTTP server and crawled by the website source; the
oracle counts the Next/Previous/Up chunks before and none after."""

from __future__ import annotations

from pathlib import Path

from rag_assets.bench.boilerplate import main, measure


def _manual(folder: Path) -> None:
    names = ["index.html", *(f"ch{n}.html" for n in range(1, 6))]
    for n, name in enumerate(names):
        nxt = names[(n + 1) % 6]
        nav = (
            f'<div class="header"><p>Next: <a href="{nxt}">Chapter {n + 1}</a>, Up: '
            '<a href="index.html">Top</a> [<a href="index.html">Index</a>]</p></div>'
        )
        text = " ".join(f"Chapter {n} sentence {i} counts {i * n} walruses." for i in range(8))
        page = (f"<html><head><title>Chapter {n}</title></head><body>{nav}<h2>Chapter {n}</h2>"
                f"<p>{text}</p></body></html>")  # fmt: skip
        (folder / name).write_text(page)


def test_the_boilerplate_bench_measures_before_and_after(tmp_path: Path, capsys):
    _manual(tmp_path)
    rows = {r["method"]: r for r in measure(tmp_path)}
    assert rows["before"]["pages"] == rows["after"]["pages"] == 6
    assert rows["before"]["boilerplate_chunks"] == 6  # one navigation line a page
    assert rows["after"]["boilerplate_chunks"] == 0
    assert rows["after"]["content_kept"] == rows["before"]["content_kept"] == 1.0
    assert main([str(tmp_path)]) == 0
    assert "before" in capsys.readouterr().out
