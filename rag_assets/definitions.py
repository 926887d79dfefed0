"""The Dagster code location. The one place (with cli.py) that reads the environment."""

import os

from rag_assets.defs.build import build_definitions, given_in, resolve_source
from rag_assets.settings import Settings

# the index's recorded folder and strategy fill in what the environment leaves unset, exactly as
# for `rag-assets index` (issue 22: one configuration for the code location and the CLI)
defs = build_definitions(resolve_source(Settings.from_env(os.environ), given_in(os.environ)))
