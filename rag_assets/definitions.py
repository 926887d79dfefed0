"""The Dagster code location. The one place (with cli.py) that reads the environment.

It holds the single-run graph (``defs/build.py``) and, beside it, the fan-out embedding backfill
(``defs/backfill.py``, issue 23): ``rag-assets backfill`` or the UI's "Materialize all
partitions" of ``embedding_batch`` re-embed a large corpus one run per batch through the
instance's run queue (docs/scaling.md).
"""

import os

import dagster as dg

from rag_assets.defs.backfill import default_backfill_definitions
from rag_assets.defs.build import build_definitions, given_in, resolve_source
from rag_assets.settings import Settings

# the index's recorded folder and strategy fill in what the environment leaves unset, exactly as
# for `rag-assets index` (issue 22: one configuration for the code location and the CLI)
settings = resolve_source(Settings.from_env(os.environ), given_in(os.environ))
defs = dg.Definitions.merge(build_definitions(settings), default_backfill_definitions(settings))
