"""Ingest: a folder of files → extracted documents (canonical text + locator map) → chunks.

- :mod:`.extract`: ``scan_folder``, ``extract_folder``, ``extract_document``; one file fails alone.
- :mod:`.formats`: one extractor per format (PDF + OCR, sheets, transcripts, HTML, DOCX) and
  ``locate`` (a chunk's locator and URL fragment).
- :mod:`.metadata`: document metadata (file-system facts, ``.ragmeta`` lines, front matter).
- :mod:`.chunk`: ``strategy``, ``chunk_document``; offsets found in the text, never accumulated.
"""
