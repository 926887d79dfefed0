"""Measurement harnesses. Nothing in the product imports this package (the CLI's ``bench``
command loads it on demand).

- :mod:`.speed`: ``rag-assets bench`` (speed ratios side by side: index, query, serve).
- :mod:`.scale`: ``rag-assets bench --scale N`` (ANN and the lexical index at 100 k / 1 M
  synthetic chunks, peak memory).
- :mod:`.cold`: ``rag-assets bench --cold`` (a fresh process per query command).
- :mod:`.compare`: ``python -m rag_assets.bench.compare`` (fusions, models, paired tests, cost).
- :mod:`.formats`: ``python -m rag_assets.bench.formats`` (PDF needles, OCR CER).
- :mod:`.spans`: ``python -m rag_assets.bench.spans`` (how often the pinpoint span holds the
  needle, by the question's words and by the written answer's).
- :mod:`.ann`: ``python -m rag_assets.bench.ann`` (ANN recall@10 and latency per nprobes and
  refine factor, synthetic and real vectors).
- :mod:`.fts`: LanceDB's native full-text index against the bm25s oracle.
- :mod:`.concurrent`: concurrent index runs on one index, rounds of them.
- :mod:`.transfer`: whether a generated question set ranks configurations as a hand-written one.
- :mod:`.upgrade_walkthrough`: a timed model upgrade through the graph.
- :mod:`.endpoint`: model servers (issue 35): index throughput at 1/2/4 requests in flight, the
  latency an embedding server adds to ``/search``, the fingerprint-change walkthrough.
"""
