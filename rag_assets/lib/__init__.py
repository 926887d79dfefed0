"""Dagster-free core: extract, chunk, embed, store, lexical, fusion, rerank, retrieve, cite,
metrics, calibrate, versioning. Usable from a notebook or the CLI without Dagster."""
