"""``python -m rag_assets.bench …``: the same as ``rag-assets bench …``."""

from rag_assets.bench.speed import main

raise SystemExit(main())
