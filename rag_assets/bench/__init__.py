"""Measurement harnesses. Nothing in the product imports this package (the CLI's ``bench``
command loads it on demand).

- :mod:`.speed`: ``rag-assets bench`` (speed ratios side by side: index, query, serve, scale).
- :mod:`.compare`: ``python -m rag_assets.bench.compare`` (fusions, models, paired tests, cost).
- :mod:`.formats`: ``python -m rag_assets.bench.formats`` (PDF needles, OCR CER).
- :mod:`.upgrade_walkthrough`: a timed model upgrade through the graph.
"""
