"""Query: a question → hits → refusal gate → citations → an answer.

- :mod:`.retrieve`: ``Index`` / ``PublishedIndex`` (dense, BM25, hybrid, rerank; ``ask``).
- :mod:`.filters`: metadata filters and the caller's groups (``Filter``, ``Scope``), applied
  during the search.
- :mod:`.fusion`: reciprocal rank fusion and its weighted variants.
- :mod:`.rerank`: cross-encoder and LLM rerankers; :mod:`.judge`: the LLM relevance gate.
- :mod:`.rerank_http`: a ``/rerank`` server (``RAG_RERANK_URL``) that never fails a query.
- :mod:`.rewrite`: query rewriting fused with the original.
- :mod:`.cite`: sources with document, locator, fragment and quote; the ``[n]`` contract.
- :mod:`.generate`: the answer from the local model, citations verified.
- :mod:`.output`: the JSON shapes of ``ask``/``search`` shared by the CLI and the service.
- :mod:`.log`: the query log's entries and their background writer; :mod:`.feedback`: verdicts
  on logged answers, checked (issue 33; the tables are :mod:`rag_assets.lib.index.store.querylog`).
"""
