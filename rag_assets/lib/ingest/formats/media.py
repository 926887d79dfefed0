"""WebVTT and SRT transcripts (webvtt-py reads both): canonical text = the cue texts.

Canonical text: each cue's text (markup tags removed by webvtt-py, lines joined with LF), cues
separated by a blank line, so every cue is a paragraph for the chunker and a chunk maps to its
first and last cue. Each cue becomes a ``"cue"`` locator with its start/end in seconds; a
citation then carries a W3C Media Fragment ``#t=start,end`` on the media file the transcript
belongs to: the first file next to it with the same stem and one of :data:`MEDIA_SUFFIXES`
(recorded as a ``"media"`` locator), else the transcript itself.
"""

from __future__ import annotations

import io
from pathlib import Path

import webvtt
from webvtt.errors import MalformedCaptionError, MalformedFileError

from rag_assets.lib.ingest.formats import Extraction, FormatError, TextBuilder
from rag_assets.lib.types import Locator

VTT_SUFFIXES = (".vtt",)
SRT_SUFFIXES = (".srt",)
#: Media files a transcript may belong to, in the order they are looked for.
MEDIA_SUFFIXES = (".mp4", ".webm", ".mkv", ".mov", ".m4a", ".mp3", ".ogg", ".opus", ".wav")
CUE_SEPARATOR = "\n\n"


def extract_transcript(text: str, fmt: str, path: Path, root: Path) -> Extraction:
    """Cue texts of a ``fmt`` ("vtt" or "srt") transcript already decoded to ``text``."""
    try:
        if fmt == "vtt":
            captions = webvtt.from_string(text).captions
        else:
            captions = webvtt.WebVTT.from_buffer(io.StringIO(text), format="srt").captions
    except (MalformedFileError, MalformedCaptionError) as exc:
        raise FormatError(f"malformed {fmt.upper()} transcript: {exc}") from None
    builder = TextBuilder()
    locators: list[Locator] = []
    for caption in captions:
        cue = "\n".join(line.strip() for line in caption.text.split("\n") if line.strip())
        if not cue:
            continue
        if locators:
            builder.add(CUE_SEPARATOR)
        start, end = builder.add(cue)
        t0 = caption.start_time.in_milliseconds() / 1000
        t1 = caption.end_time.in_milliseconds() / 1000
        locators.append(Locator(start, end, "cue", t_start=t0, t_end=t1))
    if not locators:
        raise FormatError(f"{fmt.upper()} transcript has no cue with text")
    canonical = builder.text()
    media = media_for(path, root)
    if media is not None:
        locators.insert(0, Locator(0, len(canonical), "media", target=media))
    return Extraction(text=canonical, title=path.stem, locators=locators)


def transcript_for(path: Path) -> str | None:
    """For a media file: the name of its transcript (same stem, .vtt or .srt) if one exists."""
    if path.suffix.lower() not in MEDIA_SUFFIXES:
        return None
    for suffix in VTT_SUFFIXES + SRT_SUFFIXES:
        if path.with_suffix(suffix).is_file():
            return path.with_suffix(suffix).name
    return None


def media_for(path: Path, root: Path) -> str | None:
    """Relative path (POSIX) of the media file next to ``path`` with the same stem, if any."""
    for suffix in MEDIA_SUFFIXES:
        candidate = path.with_suffix(suffix)
        if candidate.is_file():
            return candidate.relative_to(root).as_posix()
    return None
