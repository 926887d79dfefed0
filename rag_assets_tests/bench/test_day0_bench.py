"""Issue 53: the cross-folder benchmark on the real model. The 18-page libffi manual (Debian's
libffi8 package; skipped with the reason where it is absent or another version) and a second,
small folder written here, each asked its own questions and the other's; the figures are checked
against the calibration functions themselves, and the manual, whose old day-0 cut answered half
of every other folder's questions, stays under the goal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_assets.bench import day0, day0_folders
from rag_assets.lib.evaluate import calibrate
from rag_assets.lib.evaluate.day0 import other_topics_distances
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.query.retrieve import Index

pytestmark = pytest.mark.slow

BREAD = {
    "starter.md": "# The starter\n\nFeed the sourdough starter with equal weights of flour and "
    "water twelve hours before baking. A ripe starter doubles in volume and smells sour.\n",
    "bake.md": "# Baking\n\nBake the loaf in a covered cast-iron pot at 250 degrees for twenty "
    "minutes, then uncover it and bake for twenty-five more until the crust is dark brown.\n",
}


def _bread_folder(root: Path) -> day0.FolderSpec:
    docs, qdir = root / "bread", root / "bread-questions"
    docs.mkdir(parents=True)
    qdir.mkdir(parents=True)
    for name, text in BREAD.items():
        (docs / name).write_text(text)
    rows = [
        {
            "id": "b01",
            "document": "starter.md",
            "needle": "A ripe starter doubles in volume and smells sour.",
            "queries": {
                "course": "How can I tell that my starter is ready?",
                "ticket": "starter sitting on the counter all day, no idea if it's ready to use",
            },
        },
        {
            "id": "b02",
            "document": "bake.md",
            "needle": "Bake the loaf in a covered cast-iron pot at 250 degrees for twenty "
            "minutes, then uncover it and bake for twenty-five more until the crust is dark "
            "brown.",
            "queries": {
                "course": "How long is the loaf baked with the lid on?",
                "ticket": "crust pale and soft every time, how long should the pot stay covered",
            },
        },
    ]
    (qdir / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    near = [f"How do I make a gluten-free pizza dough number {i}?" for i in range(20)]
    (qdir / "out_of_domain.jsonl").write_text(
        "".join(
            json.dumps({"id": f"bo{i:02d}", "kind": "near", "query": q}) + "\n"
            for i, q in enumerate(near)
        )
    )
    return day0.FolderSpec("bread", docs, qdir)


def test_the_day0_table_on_a_real_manual_and_a_small_folder(tmp_path, real_embedder):
    specs, skipped = day0.prepare(tmp_path, ["libffi-manual"])
    if not specs:
        pytest.skip(skipped["libffi-manual"])
    specs.append(_bread_folder(tmp_path))
    unrelated = day0_folders.unrelated_test()
    report = day0.run(specs, tmp_path, unrelated, real_embedder, before=False)
    by = {f["name"]: f for f in report["folders"]}
    libffi, bread = by["libffi-manual"], by["bread"]
    assert libffi["documents"] == 18 and bread["documents"] == 2
    # the day-0 cut is the graph's own: choose_day0_cut on the questions about other topics
    store = IndexStore(tmp_path / "indexes" / "libffi-manual")
    index = Index(store, store.published(), real_embedder)
    want = calibrate.choose_day0_cut(other_topics_distances(index, day0.VECTORS))
    assert libffi["cuts"]["day-0"]["cut"] == want.cut and want.satisfied
    # off-topic: the other folder's 4 queries and 20 near misses, and the 150 unrelated
    assert libffi["off_topic_questions"] == 4 + 20 + len(unrelated)
    assert bread["off_topic_questions"] == 2 * 29 + 31 + len(unrelated)
    # the goal on the manual the issue found failing open (0.835 answered half of the others)
    assert libffi["off_topic_share"] <= day0.MAX_OFF_TOPIC and libffi["meets_goal"]
    assert libffi["cuts"]["day-0"]["own"] >= 0.85 * libffi["cuts"]["hand"]["own"]
    table = day0.markdown(report)
    assert "| libffi-manual | 18 |" in table and "| bread | 2 |" in table
