"""The Dagster code location. The one place (with cli.py) that reads the environment.

It holds the single-run graph (``defs/build.py``) and, beside it, the fan-out embedding backfill
(``defs/backfill.py``, issue 23): ``rag-assets backfill`` or the UI's "Materialize all
partitions" of ``embedding_batch`` re-embed a large corpus one run per batch through the
instance's run queue (docs/scaling.md).
"""

import os

import dagster as dg

from rag_assets.defs.backfill import default_backfill_definitions
from rag_assets.defs.build import build_definitions
from rag_assets.lib.index.declaration import declared_settings
from rag_assets.settings import Settings

# issue 51: the index's declaration (the settings that shaped it, kept with it) wins over this
# process's environment, which fills only what it leaves unset: the UI and its sensors never
# start work the index was built without (a setting is changed by giving it to `rag-assets
# index`); an older index's recorded folder and strategy fill in the same way (issue 22)
settings = declared_settings(Settings.from_env(os.environ), legacy=True)
defs = dg.Definitions.merge(build_definitions(settings), default_backfill_definitions(settings))
