"""The Dagster code location. The one place (with cli.py) that reads the environment."""

import os

from rag_assets.defs.build import build_definitions
from rag_assets.settings import Settings

defs = build_definitions(Settings.from_env(os.environ))
