"""DOCX (and XLSX) on hostile real files (issue 30): nested tables at any depth, text the
reader cannot place, and zip bombs that must fail alone with bounded memory."""

from __future__ import annotations

import copy
import io
import json
import re
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import docx
import pytest

from rag_assets.lib.ingest.chunk import chunk_document, strategy
from rag_assets.lib.ingest.extract import extract_document
from rag_assets.lib.ingest.formats import MAX_EXPANDED_BYTES, office
from rag_assets_tests.lib import format_files as ff

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
INNER = "The inner nested cell says the walrus protocol uses port 4242."


def _nested_docx(path: Path, depth: int) -> Path:
    """A table whose second cell holds a table whose second cell holds ... ``depth`` levels,
    each level with its own sentence, the innermost cell with :data:`INNER`."""
    d = docx.Document()
    d.add_paragraph("Outer introduction paragraph.")
    table = d.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "outer cell"
    cell = table.cell(0, 1)
    for level in range(1, depth + 1):
        inner = cell.add_table(rows=1, cols=2)
        inner.cell(0, 0).text = f"level {level} of the walrus tables"
        cell = inner.cell(0, 1)
    cell.add_paragraph(INNER)
    d.save(str(path))
    return path


def _chunk_text(path: Path) -> tuple[str, str, str]:
    doc = extract_document(path, path.parent)
    chunks = chunk_document(doc, strategy("E")) if doc.ok else []
    return doc.status, doc.reason or "", "\n".join(c.content for c in chunks)


@pytest.mark.parametrize("depth", [1, 60])
def test_text_of_tables_nested_in_cells_reaches_the_chunks(tmp_path: Path, depth: int) -> None:
    status, reason, text = _chunk_text(_nested_docx(tmp_path / f"nested{depth}.docx", depth))
    assert status == "ok", reason
    assert INNER in text
    assert all(f"level {n} of the walrus tables" in text for n in range(1, depth + 1))
    # reading order: the outer row, then each nested level in turn
    positions = [text.index("outer cell")] + [
        text.index(f"level {n} of the walrus tables") for n in range(1, depth + 1)
    ]
    assert positions == sorted(positions) and text.index(INNER) > positions[-1]


@pytest.mark.slow
def test_tables_nested_3000_deep_are_read_without_recursion(tmp_path: Path) -> None:
    """3,000 levels: beyond libxml2's depth limit (256) and Python's recursion limit. The
    reader keeps its own stack, so it reads every level even with little Python stack left."""
    path = _nested_docx(tmp_path / "deep.docx", 3000)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # far fewer frames than levels: a recursive walk would fail
    try:
        status, reason, text = _chunk_text(path)
    finally:
        sys.setrecursionlimit(limit)
    assert status == "ok", reason
    assert INNER in text
    assert sum(f"level {n} of the walrus tables" in text for n in range(1, 3001)) == 3000


def test_merged_cells_read_as_before(tmp_path: Path) -> None:
    """A cell spanning two columns is one cell; a vertical merge repeats its text per row
    (what python-docx's row.cells gave the previous extractor)."""
    d = docx.Document()
    t = d.add_table(rows=3, cols=3)
    for r in range(3):
        for c in range(3):
            t.cell(r, c).text = f"r{r}c{c}"
    t.cell(0, 0).merge(t.cell(0, 1)).text = "wide"
    t.cell(1, 2).merge(t.cell(2, 2)).text = "tall"
    d.save(str(tmp_path / "m.docx"))
    got = office.extract_docx((tmp_path / "m.docx").read_bytes(), tmp_path / "m.docx")
    assert got.text.split("\n\n") == ["wide | r0c2", "r1c0 | r1c1 | tall", "r2c0 | r2c1 | tall"]
    assert got.partial is None


def test_text_the_reader_cannot_place_makes_it_partial(tmp_path: Path) -> None:
    """A run straight inside a table cell (no paragraph: malformed, but it holds text) is
    never dropped silently: the document is partial, naming how much was left out."""
    d = docx.Document()
    d.add_paragraph("A readable paragraph about the heron gateway.")
    cell = d.add_table(rows=1, cols=1).cell(0, 0)
    cell.text = "kept"
    stray = copy.deepcopy(cell.paragraphs[0].runs[0]._r)
    stray.find(f"{{{W_NS}}}t").text = "orphan words"
    cell._tc.append(stray)
    d.save(str(tmp_path / "odd.docx"))
    doc = extract_document(tmp_path / "odd.docx", tmp_path)
    assert doc.status == "partial"
    assert "12 characters of text outside any paragraph" in (doc.reason or "")
    assert "heron gateway" in doc.text and "kept" in doc.text


# -- zip bombs ---------------------------------------------------------------------------------
def _zip(members: list[tuple[str, bytes, int, int, int]]) -> bytes:
    """A ZIP written by hand: (name, deflated bytes, crc, compressed size, declared size)."""
    out, central = io.BytesIO(), io.BytesIO()
    for name, data, crc, csize, size in members:
        offset = out.tell()
        raw = name.encode()
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, csize, size,
                              len(raw), 0) + raw + data)  # fmt: skip
        central.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc,
                                  csize, size, len(raw), 0, 0, 0, 0, 0, offset) + raw)  # fmt: skip
    cd = central.getvalue()
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(cd),
                      out.tell(), 0)  # fmt: skip
    return out.getvalue() + cd + end


def _deflated(data: bytes) -> tuple[bytes, int, int, int]:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed = c.compress(data) + c.flush()
    return packed, zlib.crc32(data), len(packed), len(data)


def _bomb(base: bytes, member: str, head: bytes, unit: bytes, tail: bytes, mib: int,
          declared: int | None = None) -> bytes:  # fmt: skip
    """``base`` (a real DOCX/XLSX) with ``member`` replaced by ``head + unit*... + tail``
    expanding to ``mib`` MiB: each 1 MiB block is deflated once after a full flush (so its
    compressed bytes repeat), which makes a 2 GiB member a few MB, as in the probe."""
    block = (unit * (1 << 20))[: 1 << 20]
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    one = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    end = c.compress(tail) + c.flush()
    crc = zlib.crc32(head)
    for _ in range(mib):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(tail, crc)
    data = start + one * mib + end
    size = len(head) + mib * len(block) + len(tail)
    members = []
    with zipfile.ZipFile(io.BytesIO(base)) as zf:
        for info in zf.infolist():
            if info.filename == member:
                members.append((member, data, crc, len(data), declared or size))
            else:
                members.append((info.filename, *_deflated(zf.read(info.filename))))
    return _zip(members)


def _docx_bomb(folder: Path, mib: int, declared: int | None = None) -> Path:
    d = docx.Document()
    d.add_paragraph("A short visible paragraph.")
    buf = io.BytesIO()
    d.save(buf)
    head = (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{W_NS}">'
        "<w:body>"
    ).encode()
    unit = b"<w:p><w:r><w:t>walrus walrus walrus walrus walrus</w:t></w:r></w:p>"
    tail = b"</w:body></w:document>"
    path = folder / "bomb.docx"
    path.write_bytes(_bomb(buf.getvalue(), "word/document.xml", head, unit, tail, mib, declared))
    return path


def _xlsx_bomb(folder: Path, mib: int) -> Path:
    base = ff.write_xlsx(folder).read_bytes()
    ns = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    head = f'<?xml version="1.0" encoding="UTF-8"?><sst xmlns="{ns}">'.encode()
    path = folder / "bomb.xlsx"
    unit = b"<si><t>walrus walrus walrus</t></si>"
    with zipfile.ZipFile(io.BytesIO(base)) as zf:
        member = next(n for n in zf.namelist() if n.endswith(".xml") and "sheet1" in n)
    path.write_bytes(_bomb(base, member, head, unit, b"</sst>", mib))
    return path


MEMORY_LIMIT = 1 << 30
"""Address space the extraction subprocess may use: ~550 MB once extract.py is imported, so a
bomb that is decompressed (2 GiB) cannot fit, and a refused one easily does."""

_CHILD = """
import json, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from rag_assets.lib.ingest.extract import extract_folder
docs = extract_folder(Path(sys.argv[1])).documents
# VmHWM is this program's own high-water mark: ru_maxrss would also count the forking parent's
# (a pytest worker that loaded models), which execve carries over on Linux
hwm = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM"))
peak = int(hwm.split()[1]) * 1024
print(json.dumps({{"docs": {{d.document_id: [d.status, d.reason] for d in docs}}, "peak": peak}}))
"""


def _extract_limited(folder: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(limit=MEMORY_LIMIT), str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["docx", "xlsx"])
def test_a_zip_bomb_fails_alone_with_bounded_memory(tmp_path: Path, kind: str) -> None:
    """A few-MB file expanding to 2 GiB of XML fails alone, by its declared sizes, before any
    decompression: the other file of the folder is ok, and the process stays inside 1 GiB of
    address space (decompressing the bomb would not fit)."""
    folder = tmp_path / "docs"
    folder.mkdir()
    bomb = _docx_bomb(folder, 2048) if kind == "docx" else _xlsx_bomb(folder, 2048)
    assert bomb.stat().st_size < 10_000_000  # over 200:1
    (folder / "fine.md").write_text("# Fine\n\nA normal page about herons.\n")
    got = _extract_limited(folder)
    status, reason = got["docs"][bomb.name]
    assert status == "failed"
    assert re.search(r"expands to 2,14\d,\d{3},\d{3} bytes", reason)
    assert f"over the limit of {MAX_EXPANDED_BYTES:,}" in reason
    assert got["docs"]["fine.md"][0] == "ok"
    assert got["peak"] < MEMORY_LIMIT


@pytest.mark.slow
def test_a_bomb_that_understates_its_size_reads_no_more_than_it_declares(tmp_path: Path) -> None:
    """Declared sizes cannot be trusted blindly: a member declaring 1 MB that inflates to 2 GiB
    is read only up to what it declares (Python's zipfile stops there), then fails its CRC."""
    folder = tmp_path / "docs"
    folder.mkdir()
    _docx_bomb(folder, 2048, declared=1_000_000)
    got = _extract_limited(folder)
    status, reason = got["docs"]["bomb.docx"]
    assert status == "failed" and "corrupt DOCX" in reason
    assert got["peak"] < MEMORY_LIMIT
