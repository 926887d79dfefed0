"""OCR of PDF pages without a text layer: RapidOCR (PP-OCRv4 ONNX models shipped inside the
``rapidocr-onnxruntime`` wheel, run by onnxruntime on the CPU; nothing is downloaded).

A page is rendered at :data:`OCR_DPI`, recognised line by line, and the lines are put in
reading order: sorted by their top edge, boxes whose vertical centres lie within half a line
height of each other form one text line (left to right, joined by a space). The page's
confidence is the recogniser's per-line score averaged with the lines' character counts as
weights.

Word spaces: PP-OCRv4 drops some word spaces in small print ("wordspacesbetweenwords"), which
was every error measured on typeset pages. RapidOCR's ``return_word_box`` gives each
recognised character's box; between two adjacent characters with no space, a space is put
back when the image has a blank (ink-free) run of pixel columns across the line's box wider
than the line's space threshold: :data:`SPACE_FROM_SPACES` of the median blank run at the
spaces the recogniser did keep on that line (when it kept at least :data:`MIN_SPACES` of
them), else :data:`SPACE_FROM_HEIGHT` of the line box's height. (Measured at 150 and 300 dpi
on 10 pt text: blank runs inside words <= 0.13 box heights, at word spaces >= 0.26.)
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

#: Render resolution for OCR. At 150 dpi and below, PP-OCRv4 drops the spaces of short lines of
#: 12 pt text ("thatstaytrue."); 200 dpi keeps them.
OCR_DPI = 200
#: Default floor (``RAG_OCR_MIN_CONFIDENCE``): a page recognised with a lower confidence is not
#: indexed; its document is *partial* and names the page.
DEFAULT_MIN_CONFIDENCE = 0.80
#: The text detector sees the rendered page scaled down to at most this many pixels a side
#: (a 200 dpi A4 page, 1654 x 2339, is scaled by 0.86; smaller images are not scaled).
DET_MAX_SIDE = 2000
#: Threads onnxruntime may use per OCR model (the machine this runs on has 2 shared cores).
OCR_THREADS = 2
#: A blank run this share of the line's median kept-space run (or wider) is a dropped space.
SPACE_FROM_SPACES = 0.6
#: ... the kept spaces a line needs for that; with fewer, the line box height is the scale:
MIN_SPACES = 3
#: a blank run this share of the line box's height (or wider) is a dropped space.
SPACE_FROM_HEIGHT = 0.2
#: Grey level (0..255) below which a pixel is ink (black text on a light page).
INK_LEVEL = 128


@dataclass(frozen=True)
class OcrPage:
    text: str  # recognised lines joined with LF ("" when nothing was found), spaces restored
    confidence: float  # 0..1, character-weighted mean line score (0.0 when nothing was found)
    lines: int
    raw_text: str = ""  # the same lines as the recogniser wrote them (no space put back)
    spaces_restored: int = 0


def engine_version() -> str:
    """``rapidocr-onnxruntime-<version>`` or ``rapidocr-missing`` (part of the extractor stamp)."""
    try:
        return f"rapidocr-onnxruntime-{importlib.metadata.version('rapidocr-onnxruntime')}"
    except importlib.metadata.PackageNotFoundError:
        return "rapidocr-missing"


@lru_cache(maxsize=1)
def _engine() -> Any:
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR(
        intra_op_num_threads=OCR_THREADS,
        inter_op_num_threads=1,
        det_limit_type="max",  # the default ("min", 736) upscales a short strip 3x or more
        det_limit_side_len=DET_MAX_SIDE,
    )


def ocr_image(png: bytes, restore_spaces: bool = True) -> OcrPage:
    """Recognise the text of one PNG image (word spaces restored, see the module doc, unless
    ``restore_spaces`` is False: then the text is the recogniser's, as before issue 14)."""
    import cv2
    import numpy as np

    gray = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_GRAYSCALE)
    result, _ = _engine()(png, use_cls=False, return_word_box=restore_spaces)
    # top, bottom, left, text, score, text as recognised
    boxes: list[tuple[float, float, float, str, float, str]] = []
    restored = 0
    for box, text, score, *word in result or []:
        raw = " ".join(str(text).split())
        spaced, n = _restore_spaces(str(text), box, word, gray)
        text = " ".join(spaced.split())
        if text:
            ys = [p[1] for p in box]
            boxes.append((min(ys), max(ys), min(p[0] for p in box), text, float(score), raw))
            restored += n
    boxes.sort(key=lambda b: (b[0], b[2]))
    rows: list[list[tuple[float, float, float, str, float, str]]] = []
    for b in boxes:
        if rows:
            last = rows[-1][0]
            if abs((b[0] + b[1]) / 2 - (last[0] + last[1]) / 2) <= (last[1] - last[0]) / 2:
                rows[-1].append(b)
                continue
        rows.append([b])
    lines = [" ".join(b[3] for b in sorted(row, key=lambda b: b[2])) for row in rows]
    raw_lines = [" ".join(b[5] for b in sorted(row, key=lambda b: b[2])) for row in rows]
    chars = sum(len(b[5]) for b in boxes)
    confidence = sum(len(b[5]) * b[4] for b in boxes) / chars if chars else 0.0
    return OcrPage(
        "\n".join(lines), round(confidence, 4), len(lines), "\n".join(raw_lines), restored
    )


def _restore_spaces(text: str, box: Any, word: list[Any], gray: Any) -> tuple[str, int]:
    """``text`` with dropped word spaces put back, and how many (see the module doc).

    ``word`` is RapidOCR's ``[char boxes, chars, char scores]`` for the line (empty when the
    engine gave none: the text is returned as it is)."""
    if len(word) < 2 or gray is None:
        return text, 0
    char_boxes, chars = word[0], word[1]
    if not char_boxes or len(char_boxes) != len(chars) or "".join(chars) != text:
        return text, 0
    ys = [p[1] for p in box]
    y0, y1 = max(0, int(min(ys))), min(gray.shape[0], int(max(ys)) + 1)
    if y1 - y0 < 2:
        return text, 0
    ink = (gray[y0:y1] < INK_LEVEL).any(axis=0)
    centres = [(b[0][0] + b[1][0]) / 2 for b in char_boxes]

    def blank_run(a: float, b: float) -> int:
        best = cur = 0
        for has_ink in ink[max(0, int(a)) : int(b) + 1]:
            cur = 0 if has_ink else cur + 1
            best = max(best, cur)
        return best

    kept = [
        blank_run(centres[i - 1], centres[i + 1])
        for i in range(1, len(chars) - 1)
        if chars[i] == " " and chars[i - 1] != " " and chars[i + 1] != " "
    ]
    if len(kept) >= MIN_SPACES:
        threshold = SPACE_FROM_SPACES * sorted(kept)[len(kept) // 2]
    else:
        threshold = SPACE_FROM_HEIGHT * (y1 - y0)
    out = [chars[0]]
    added = 0
    for i in range(1, len(chars)):
        gap = chars[i] != " " and chars[i - 1] != " "
        if gap and blank_run(centres[i - 1], centres[i]) >= max(threshold, 1):
            out.append(" ")
            added += 1
        out.append(chars[i])
    return "".join(out), added


def ocr_pdf_page(
    page: Any, clip: Any = None, dpi: int = OCR_DPI, restore_spaces: bool = True
) -> OcrPage:
    """Render a pymupdf page (only ``clip``, a rectangle, when given) at ``dpi``; recognise it."""
    return ocr_image(page.get_pixmap(dpi=dpi, clip=clip).tobytes("png"), restore_spaces)
