"""Models: the OpenAI-compatible LLM client (:mod:`.llm`) and its on-disk reply cache
(:mod:`.llm_cache`, keyed by the served model). No weights are fetched at run time."""
