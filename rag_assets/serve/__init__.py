"""The published index as a service: HTTP API + page (``app``), MCP tools (``tools``)."""
