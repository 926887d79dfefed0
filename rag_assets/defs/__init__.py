"""Thin Dagster assets over ``rag_assets.lib``; ``build_definitions`` assembles them."""
