"""OCR of PDF pages without a text layer: RapidOCR (PP-OCRv4 ONNX models shipped inside the
``rapidocr-onnxruntime`` wheel, run by onnxruntime on the CPU; nothing is downloaded).

A page is rendered at :data:`OCR_DPI`, recognised line by line, and the lines are put in
reading order: sorted by their top edge, boxes whose vertical centres lie within half a line
height of each other form one text line (left to right, joined by a space). The page's
confidence is the recogniser's per-line score averaged with the lines' character counts as
weights.
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


@dataclass(frozen=True)
class OcrPage:
    text: str  # recognised lines joined with LF ("" when nothing was found)
    confidence: float  # 0..1, character-weighted mean line score (0.0 when nothing was found)
    lines: int


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


def ocr_image(png: bytes) -> OcrPage:
    """Recognise the text of one PNG image."""
    result, _ = _engine()(png, use_cls=False)
    boxes: list[tuple[float, float, float, str, float]] = []  # top, bottom, left, text, score
    for box, text, score in result or []:
        text = " ".join(str(text).split())
        if text:
            ys = [p[1] for p in box]
            boxes.append((min(ys), max(ys), min(p[0] for p in box), text, float(score)))
    boxes.sort(key=lambda b: (b[0], b[2]))
    rows: list[list[tuple[float, float, float, str, float]]] = []
    for b in boxes:
        if rows:
            last = rows[-1][0]
            if abs((b[0] + b[1]) / 2 - (last[0] + last[1]) / 2) <= (last[1] - last[0]) / 2:
                rows[-1].append(b)
                continue
        rows.append([b])
    lines = [" ".join(b[3] for b in sorted(row, key=lambda b: b[2])) for row in rows]
    chars = sum(len(b[3]) for b in boxes)
    confidence = sum(len(b[3]) * b[4] for b in boxes) / chars if chars else 0.0
    return OcrPage("\n".join(lines), round(confidence, 4), len(lines))


def ocr_pdf_page(page: Any, clip: Any = None, dpi: int = OCR_DPI) -> OcrPage:
    """Render a pymupdf page (only ``clip``, a rectangle, when given) at ``dpi``; recognise it."""
    return ocr_image(page.get_pixmap(dpi=dpi, clip=clip).tobytes("png"))
