"""Issue 31: the run summary says what happened, in words a newcomer can check: an edit by its
texts (not by shifted chunk ids), a first index as a new table (issue 39: published as version
1; issue 51: no LanceDB version at all; repeated texts not called "reused"), one refusal
cut per run, each non-blocking warning with what it found and the setting that changes it, and
skipped files named as ``chunk`` names them.

These build :class:`Outcome` from metadata as the assets record it (hand-written values); the
same lines on a real run are checked in ``rag_assets_tests/test_ui.py``."""

from __future__ import annotations

from rag_assets.defs.run import Outcome

TABLE = "chunks_all-minilm-l6-v2_384d_chunk1-e-t512"


def _embeddings(**over: int) -> dict:
    m = {
        "table": TABLE,
        "table_version": 3,
        "dagster/row_count": 79,
        "embedded": 1,
        "reused": 8,
        "reused_from_history": 0,
        "documents_new": 0,
        "documents_changed": 1,
        "documents_unchanged": 7,
        "documents_deleted": 0,
        "chunks_new": 8,  # by id: the edit moved every later chunk of the document
        "chunks_changed": 0,
        "chunks_unchanged": 70,
        "chunks_removed": 8,
        "commits": 1,
        "rows_before": 79,
        "version_before": 2,
        "reused_from_table": 8,
        "reused_in_run": 0,
        "chunks_in_new_documents": 0,
        "changed_documents_reembedded": 1,
        "changed_documents_from_history": 0,
        "changed_documents_reused": 8,
        "changed_documents_dropped": 1,
        "chunks_in_unchanged_documents": 70,
        "chunks_of_deleted_documents": 0,
    }
    return m | over


def _outcome(m: dict, **more: dict) -> Outcome:
    md = {"chunks": {"dagster/row_count": m["dagster/row_count"], "strategy": "E"}}
    return Outcome(success=True, metadata={"chunk_embeddings": m, **md, **more})


def _line(text: str, start: str) -> str:
    return next(x for x in text.splitlines() if x.startswith(start))


def test_a_one_paragraph_edit_reads_as_what_happened():
    text = _outcome(_embeddings()).summary()
    assert _line(text, "chunks: ") == (
        "chunks: 79 (E): 1 document changed: 1 chunk re-embedded, 8 reused; 70 unchanged"
    )
    embedded = _line(text, "embedded: ")
    assert embedded.startswith("embedded: 1 text (8 vectors the table already had); ")
    # issue 51: no LanceDB version in the summary (the published line gives the index's own)
    assert embedded.endswith(f"(table {TABLE}: 1 write by this run)")
    assert "LanceDB version" not in text and " v3" not in text
    assert "8 new" not in text and "8 removed" not in text


def test_a_first_index_is_a_new_table_and_repeats_are_not_reuse():
    m = _embeddings(
        table_version=6,
        embedded=60,
        reused=19,
        documents_new=20,
        documents_changed=0,
        documents_unchanged=0,
        chunks_new=79,
        chunks_unchanged=0,
        chunks_removed=0,
        commits=5,
        rows_before=0,
        version_before=1,
        reused_from_table=0,
        reused_in_run=19,
        chunks_in_new_documents=79,
        changed_documents_reembedded=0,
        changed_documents_reused=0,
        changed_documents_dropped=0,
        chunks_in_unchanged_documents=0,
    )
    outcome = _outcome(m)
    outcome.published = {  # as read back from the pointer (LanceDB's version: 6)
        "table": TABLE, "index_version": 1, "version": 6, "rows": 79, "evaluation": "evaluated"
    }  # fmt: skip
    text = outcome.summary()
    assert _line(text, "chunks: ") == "chunks: 79 (E): 79 chunks in 20 new documents"
    embedded = _line(text, "embedded: ")
    assert "19 chunks repeat a text embedded in this run" in embedded
    assert "reused" not in embedded and "vectors the table" not in embedded
    assert embedded.endswith(f"(a new table {TABLE})")  # issue 39: not "at version 6"
    assert _line(text, "published: ") == f"published: {TABLE} version 1 (79 rows, evaluated)"


def test_a_deleted_document_and_an_unchanged_rerun():
    gone = _embeddings(
        embedded=0,
        documents_changed=0,
        documents_deleted=1,
        changed_documents_reembedded=0,
        changed_documents_reused=0,
        changed_documents_dropped=0,
        chunks_of_deleted_documents=9,
        reused_from_table=0,
    )
    assert "; 9 removed with 1 deleted document" in _line(_outcome(gone).summary(), "chunks: ")
    same = _embeddings(
        embedded=0,
        documents_changed=0,
        changed_documents_reembedded=0,
        changed_documents_reused=0,
        changed_documents_dropped=0,
        chunks_in_unchanged_documents=79,
        reused_from_table=0,
        table_version=2,
    )
    text = _outcome(same).summary()
    assert _line(text, "chunks: ") == "chunks: 79 (E): 79 unchanged"
    assert _line(text, "embedded: ").endswith(f"(table {TABLE}: unchanged)")


def test_metadata_of_an_older_run_keeps_the_older_lines():
    old = {k: v for k, v in _embeddings().items() if "_in_" not in k and "before" not in k}
    old = {k: v for k, v in old.items() if not k.startswith(("changed_documents", "reused_"))}
    text = _outcome(old | {"reused_from_history": 0}).summary()
    assert _line(text, "chunks: ").endswith("8 new, 0 changed, 70 unchanged, 8 removed")


EVALUATION = (
    "12 needles, 0 destroyed by chunking; 79 chunks (E, all-MiniLM-L6-v2)\n\n"
    "| retriever | R@1 |\n|---|---|\n| hybrid | 0.458 |\n\n"
    "refusal (hybrid, cut 0.515, max_cut_under_bluff_rate): answered correctly 15, answered "
    "wrongly 3, refused answerable 6; bluffs 1/16 out-of-domain (1 near, 0 unrelated)\n\n"
    "rerank: no model configured"
)


def test_one_run_prints_one_refusal_cut():
    """A set with 16 out-of-domain questions: the sweep's own best cut (0.515) is not the one
    published (0.390, from the unrelated list); only the published cut is printed, with the
    set's outcome at it."""
    cut = {
        "cut": 0.39,
        "cut_source": "unrelated-only",
        "policy": "max_cut_under_unrelated_bluff_rate",
        "reason": "cut 0.390: answers 0/221 shipped unrelated questions (the question set has "
        "only 16 out-of-domain questions)",
        "answered_correct": 11,
        "answered_wrong": 2,
        "refused_answerable": 11,
        "bluffs": 0,
        "bluffs_near": 0,
        "bluffs_unrelated": 0,
        "answerable_questions": 24,
        "out_of_domain_questions": 16,
    }
    out = Outcome(success=True, evaluation=EVALUATION, metadata={"refusal_threshold": cut})
    text = out.summary()
    assert "0.515" not in text and "refusal (hybrid" not in text
    assert "| hybrid | 0.458 |" in text and "rerank: no model configured" in text
    cuts = [x for x in text.splitlines() if "cut" in x and "0.3" in x]
    assert cuts[0].startswith("refusal cut: 0.390 (unrelated-only, ")
    assert _line(text, "  at this cut") == (
        "  at this cut, the question set: 11/24 answerable answered correctly (2 wrongly, "
        "11 refused); 0/16 out-of-domain answered (bluffs: 0 near, 0 unrelated)"
    )
    # calibrated on the set: its reason already gives the outcome, said once
    calibrated = cut | {
        "cut": 0.515,
        "cut_source": "calibrated",
        "policy": "max_cut_under_bluff_rate",
        "reason": "largest cut with bluff rate <= 10%: 0.515 bluffs on 1/16 ... and answers "
        "15/24 answerable queries correctly (3 wrong, 6 refused)",
        "answered_correct": 15,
    }
    again = Outcome(success=True, evaluation=EVALUATION, metadata={"refusal_threshold": calibrated})
    assert "at this cut" not in again.summary()
    assert again.summary().count("0.515") == 2  # the cut line: the cut, and its reason


def test_a_warning_names_what_it_found_and_the_setting_to_change():
    window = {
        "window": 256,
        "chunks_over_window": 2,
        "characters_dropped": 410,
        "worst_chunks": [
            {"document": "guide.md", "section": "Setup > Proxy", "word_pieces": 402,
             "dropped_chars": 380},
            {"document": "notes.txt", "section": "", "word_pieces": 270, "dropped_chars": 30},
        ],
        "chunk_target": 2000,
        "model": "sentence-transformers/all-MiniLM-L6-v2",
    }  # fmt: skip
    out = Outcome(
        success=True,
        checks=[("chunks_within_encoder_window", False, "WARN")],
        check_metadata={"chunks_within_encoder_window": window},
    )
    text = out.summary()
    lines = text.splitlines()
    i = lines.index("check chunks_within_encoder_window: WARNING (non-blocking)")
    assert lines[i + 1].startswith("  2 chunks longer than the encoder's window of 256 word-pie")
    assert lines[i + 2] == "    guide.md > Setup > Proxy: 402 word-pieces, 380 characters unseen"
    assert lines[i + 3] == "    notes.txt > (no section): 270 word-pieces, 30 characters unseen"
    assert "RAG_CHUNK_TARGET (now 2000 characters)" in lines[i + 4]
    assert "RAG_EMBEDDING_MODEL" in lines[i + 4]


def test_skipped_files_are_named_with_the_word_chunk_uses():
    e = {
        "documents": 3,
        "ok": 1,
        "partial": 0,
        "skipped": 1,
        "failed": 1,
        "failed_list": [{"document": "empty.txt", "reason": "file is empty (0 bytes)"}],
        "skipped_list": [{"document": "blob.bin", "reason": "unsupported file type '.bin'"}],
    }
    text = Outcome(success=True, metadata={"extracted_documents": e}).summary()
    assert "  FAILED empty.txt: file is empty (0 bytes)" in text
    assert "  SKIPPED blob.bin: unsupported file type '.bin'" in text


def test_a_blocking_check_that_raises_names_its_cause_in_the_one_line():
    """Issue 44: a blocking check that raised (the replay asked an adapted table with the base
    model) left ``blocking check not_worse_on_traffic failed: `` with nothing after the colon;
    the line now carries the exception's own words. A real Dagster run, no model."""
    import dagster as dg

    from rag_assets.defs.run import _failure
    from rag_assets.lib.index.store import StampMismatch

    @dg.asset
    def refusal_threshold():  # no annotations: the module's are strings to Dagster
        return 1

    @dg.asset_check(asset=refusal_threshold, blocking=True)
    def not_worse_on_traffic():
        raise StampMismatch("table t was embedded with m@adapted-x but queries would be with m")

    @dg.asset_check(asset=refusal_threshold, blocking=True)
    def said_no():
        return dg.AssetCheckResult(passed=False, metadata={"reason": "worse on traffic"})

    for check, want in (
        (not_worse_on_traffic, "blocking check not_worse_on_traffic failed: StampMismatch: "
         "table t was embedded with m@adapted-x but queries would be with m"),
        (said_no, "blocking check said_no failed: worse on traffic"),
    ):  # fmt: skip
        res = dg.materialize(
            [refusal_threshold, check], raise_on_error=False,
            instance=dg.DagsterInstance.ephemeral(),
        )  # fmt: skip
        outcome = Outcome(success=res.success)
        for ce in res.get_asset_check_evaluations():
            outcome.check_metadata[ce.check_name] = {
                k: getattr(v, "value", v) for k, v in ce.metadata.items()
            }
        assert not res.success
        assert _failure(res, outcome) == ("refusal_threshold", want)
