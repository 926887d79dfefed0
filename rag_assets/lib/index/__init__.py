"""Index: chunks → embedded, stamped rows in LanceDB, BM25, versions and the publish pointer.

- :mod:`.embed`: ``Embedder``, ``EmbeddingModel``, ``configured_model`` (sentence-transformers).
- :mod:`.onnx_encoder`: the query encoder exported to ONNX (fp32 rank-identical, int8).
- :mod:`.endpoint`: ``EndpointEmbedder``, embeddings from an OpenAI-compatible server
  (``RAG_EMBED_URL``); :mod:`.fingerprint`: what tells one served model from another, and the
  index's record of them.
- :mod:`.versioning`: ``Stamps`` (model, revision, dims, prompts, pipeline, extractor).
- :mod:`.store`: ``IndexStore`` (chunk tables and documents; pointer, history and rollback;
  object-store meta rows; BM25 persistence; one-line object-store errors; API tokens).
- :mod:`.metadata`: the metadata columns of chunk and document rows, their ``LabelList`` indexes.
- :mod:`.indexer`: ``update_table``, incremental by content hash, one commit per change.
- :mod:`.lexical`: BM25 (bm25s) built per table version, and LanceDB's own full-text index
  (``NativeFTS``) from ``NATIVE_FTS_MIN_ROWS`` rows.
- :mod:`.ann`: when and how to build LanceDB's IVF-SQ index, and how many partitions to probe.
- :mod:`.due`: ``index_due``, when a table's own index (ANN, full text) is (re)built.
- :mod:`.expand`, :mod:`.views`: doc2query questions and the views embedded from them.
- :mod:`.pipeline`: ``index_folder``, the whole stage without Dagster.
- :mod:`.maintenance`: ``compact_index``; :mod:`.backfill`: fan-out batches for a re-embed.
"""
