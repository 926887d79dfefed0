"""Evaluate: question sets, metrics with intervals, paired tests, threshold calibration.

- :mod:`.questions`: load needle sets and BEIR qrels; check needles against the corpus.
- :mod:`.questions_gen`: write a needle-format question set with a local model.
- :mod:`.metrics`: recall@k, MRR, destroyed answers, Wilson intervals, paired sign tests.
- :mod:`.evaluate`: ``evaluate_needles``, ``ablation``, the markdown tables.
- :mod:`.calibrate`: the refusal-threshold sweep and the chosen cut.
- :mod:`.beir`: BEIR corpora as documents and whole-document chunks.
"""
