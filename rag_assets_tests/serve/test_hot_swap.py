"""Publishing a new table version under a live server: no restart, no half state, 0 errors."""

from __future__ import annotations

import threading
import time

import pytest

from rag_assets.lib.index.store import IndexStore

pytestmark = pytest.mark.slow

QUESTION = "How do I roll back to the previous embedding model?"


def test_publish_swaps_the_version_under_a_looping_client(served, real_embedder):
    from rag_assets.lib.index.pipeline import index_folder
    from rag_assets.lib.ingest.chunk import strategy

    store = IndexStore(served.index)
    before = store.published()
    assert before is not None
    responses: list[tuple[int, dict, str]] = []
    errors: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        with served.client() as c:
            while not stop.is_set():
                try:
                    r = c.post("/ask", json={"question": QUESTION})
                    responses.append((r.status_code, r.json(), r.headers["X-RAG-Version"]))
                except Exception as e:  # counted, not raised: the assertion reports them
                    errors.append(f"{type(e).__name__}: {e}")

    client = threading.Thread(target=loop)
    client.start()
    try:
        time.sleep(1.0)
        doc = served.docs / "06-operations-runbook.md"
        doc.write_text(
            doc.read_text(encoding="utf-8")
            + "\n## Rolling back in one step\n\nTo roll back to the previous embedding model, run "
            "`rag-assets rollback` and set the model setting back to the old directory.\n",
            encoding="utf-8",
        )
        index_folder(served.docs, served.index, strategy("E"), real_embedder)
        after = store.published()
        assert after is not None and (after.table, after.version) != (
            before.table,
            before.version,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the new version has answered a few times
            if sum(1 for _, o, _ in responses if o["published"]["version"] == after.version) >= 3:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        client.join(timeout=120)

    versions = {
        (before.table, before.version, before.documents_version),
        (after.table, after.version, after.documents_version),
    }
    seen: dict[int, int] = {}
    texts = {
        v: store.canonical_texts(v) for v in (before.documents_version, after.documents_version)
    }
    for status, out, header in responses:
        assert status == 200, out
        pub = out["published"]
        assert (pub["table"], pub["version"], pub["documents_version"]) in versions
        assert header == str(pub["version"])
        docs = texts[pub["documents_version"]]
        for cit in out["citations"]:  # every quote is that version's text at its offsets
            assert docs[cit["document_id"]]["text"][cit["from"] : cit["to"]] == cit["quote"]
        seen[pub["version"]] = seen.get(pub["version"], 0) + 1
    print(f"hot swap: {len(responses)} responses, versions seen {seen}, errors {len(errors)}")
    assert errors == []
    assert set(seen) == {before.version, after.version}
    # once the new version answered, the old one never did again
    order = [o["published"]["version"] for _, o, _ in responses]
    first_new = order.index(after.version)
    assert all(v == after.version for v in order[first_new:])
