"""The Dagster-free core, one stage package per step of the graph.

- :mod:`rag_assets.lib.ingest`: files → canonical text + locator map → chunks.
- :mod:`rag_assets.lib.index`: chunks → vectors and BM25 in LanceDB, versions, the publish pointer.
- :mod:`rag_assets.lib.query`: a question → hits → refusal gate → citations → an answer.
- :mod:`rag_assets.lib.evaluate`: question sets, recall/MRR with intervals, calibration.
- :mod:`rag_assets.lib.models`: the OpenAI-compatible LLM client and its on-disk reply cache.

:mod:`rag_assets.lib.types` holds the records that pass between stages. A stage imports only
from stages before it (models < ingest < index < query < evaluate); nothing here imports
Dagster, the service or the measurement harnesses (``rag_assets_tests/test_layers.py``).
"""
