"""Issue 34 through the graph: an access change (a ``.ragmeta`` line) takes effect on the next
``index_job`` run without re-embedding. The run reports it as its own kind of change, the
evaluation is carried over from the version it only relabels (not run again), the new version
is published with ``change: metadata`` in the pointer and the history, and what a token sees
follows it. Real model, real LanceDB directory, a real (SQLite) Dagster instance."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from rag_assets.defs.run import materialize_graph
from rag_assets.lib.index.store import IndexStore
from rag_assets.lib.query.filters import Scope
from rag_assets.lib.query.retrieve import Index
from rag_assets.settings import Settings

pytestmark = pytest.mark.slow


def _docs(root: Path) -> Path:
    (root / "hr").mkdir(parents=True)
    (root / "public").mkdir()
    for i in range(1, 4):
        (root / "public" / f"guide{i}.md").write_text(
            f"# Guide {i}\n\nThis guide explains how service {i} is configured and why its "
            f"setting {i} matters to operators on call.\n"
        )
    (root / "hr" / "salaries.md").write_text(
        "# Salary bands\n\nThe quokka salary bands for engineers are reviewed every spring.\n"
    )
    (root / ".ragmeta").write_text("hr/** access=hr\n")
    return root


def test_an_access_change_publishes_without_re_embedding(tmp_path, real_embedder):
    docs = _docs(tmp_path / "docs")
    settings = Settings(
        adapt="off",  # the tests' default (conftest); issue 44's auto is tested on its own
        documents_dir=str(docs),
        index_uri=str(tmp_path / "index"),
        work_dir=str(tmp_path / "work"),
        eval_dir=str(tmp_path / "no-questions"),  # an own folder: the unrelated-only cut
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        first = materialize_graph(settings, progress=False, instance=instance)
        assert first.success, first.summary()
        store = IndexStore(settings.index_uri)
        before = store.published()
        assert before is not None and before.change == "content"

        def finance_sees(entry) -> set[str]:
            index = Index(store, entry, real_embedder)
            hits = index.search(
                "quokka salary bands", k=10, scope=Scope(groups=frozenset({"finance"}))
            )
            return {h.document_id for h in hits}

        assert "hr/salaries.md" not in finance_sees(before)

        (docs / ".ragmeta").write_text("hr/** access=hr,finance\n")
        second = materialize_graph(settings, progress=False, instance=instance)
        assert second.success, second.summary()
        text = second.summary()
        assert "embedded: 0 texts" in text
        assert "; 0 new, 0 changed, 1 metadata only, 3 unchanged, 0 removed" in text
        assert f"evaluation carried over from {before.key}: only metadata changed" in text
        emb = instance.get_latest_materialization_event(dg.AssetKey("chunk_embeddings"))
        md = emb.asset_materialization.metadata
        assert md["embedded"].value == 0 and md["documents_metadata"].value == 1
        ev = instance.get_latest_materialization_event(dg.AssetKey("retrieval_eval"))
        carried = ev.asset_materialization.metadata["carried_over_from"].value
        assert carried == before.key  # the figures of the version it relabels, not re-run
        after = store.published()
        assert after.table == before.table and after.version > before.version
        assert after.change == "metadata" and after.threshold == before.threshold
        assert [e.change for e in store.history()][-2:] == ["content", "metadata"]
        assert "hr/salaries.md" in finance_sees(after)  # the new access, served
        assert "hr/salaries.md" not in finance_sees(before)  # the old version is unchanged
