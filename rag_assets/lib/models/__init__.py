"""Models: the OpenAI-compatible LLM client (:mod:`.llm`) and its on-disk reply cache
(:mod:`.llm_cache`, keyed by the served model); :mod:`.http`, the plumbing every model-server
client shares (redaction, one-line errors, retries). No weights are fetched at run time."""
