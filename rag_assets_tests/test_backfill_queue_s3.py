"""`rag-assets backfill` through Dagster's run queue into one table on a real S3 server (issue
23): the same check as ``test_backfill_queue.py`` (two batch runs at a time, one killed with
SIGKILL and retried, the result equal to the single run's), with ``RAG_INDEX_URI=s3://…`` and the
credentials only in ``AWS_*`` for the CLI, the daemon and every batch run."""

from __future__ import annotations

import pytest

from rag_assets_tests.test_backfill_queue import backfill_through_the_queue


@pytest.mark.slow
def test_backfill_through_the_queue_into_one_table_on_s3(
    tmp_path, real_embedder, monkeypatch, s3_env
):
    backfill_through_the_queue(tmp_path, real_embedder, monkeypatch, f"s3://rag/{tmp_path.name}")
