"""Every format through the real graph: a Dagster materialisation of a folder holding the sample
corpus plus one small real file per format, then questions asked of the published index. Each
citation's quote must be the canonical text at its offsets, and its locator must point where
the words are (the time range holds the cue, the A1 range holds the row, the text fragment's
words are on the page, the OCR page is flagged with its confidence)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import unquote

import dagster as dg
import pytest

from rag_assets.defs.run import materialize_graph
from rag_assets.lib.ingest.formats import sheets
from rag_assets.lib.query.cite import Citation
from rag_assets.lib.query.retrieve import Index
from rag_assets.lib.types import ExtractedDocument, locators_from_json
from rag_assets.serve.status import status_report
from rag_assets.settings import Settings
from rag_assets_tests.helpers import SAMPLE_EVAL
from rag_assets_tests.lib import format_files as ff

pytestmark = pytest.mark.slow


#: (document, needle, question) per format: the eval set of this folder and the questions asked.
NEEDLES = [
    ("lecture.vtt", "The walrus index stores every embedding twice, once per disk.",
     "How many times does the walrus index store each embedding?"),
    ("talk.srt", "The pelican scheduler starts every batch job at dawn.",
     "When does the pelican scheduler start batch jobs?"),
    ("prices.csv", "sku: B2; product: marmalade jar; price: 3.5",
     "What is the price of the marmalade jar?"),
    ("budget.xlsx", "item: walrus licences; owner: legal; cost: 300; doubled: 600",
     "Who owns the walrus licences cost in the budget?"),
    ("garden.html", "Tomatoes need six hours of direct sun every day to ripen well on the vine.",
     "How many hours of sun do tomatoes need?"),
    ("handbook.docx", "visitor | orange", "What colour is a visitor badge?"),
    ("report.pdf", "Finding 2. The quarterly audit found 4 unlabelled cable drums",
     "How many unlabelled cable drums did the audit find in warehouse 2?"),
    ("scan.pdf", ff.OCR_SENTENCE, "What does the lighthouse keeper log every night?"),
    ("shop.pdf", "sku: E5; product: tea towel; price: 4",
     "How much does a tea towel cost in the gift shop?"),
]  # fmt: skip
QUESTION = {doc: q for doc, _, q in NEEDLES}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    docs, evals = root / "documents", root / "eval"
    docs.mkdir()
    evals.mkdir()
    for write in (ff.write_vtt, ff.write_srt, ff.write_csv, ff.write_xlsx, ff.write_html,
                  ff.write_docx, ff.write_report_pdf, ff.write_scan_pdf,
                  ff.write_table_pdf):  # fmt: skip
        write(docs)
    with (docs / "ledger.csv").open("w") as fh:  # 5 data rows: over the limit set below
        fh.write("entry,amount\n" + "".join(f"line {i},{i}\n" for i in range(5)))
    with (evals / "questions.jsonl").open("w") as fh:
        for i, (doc, needle, question) in enumerate(NEEDLES):
            queries = {"course": question, "ticket": question.lower().rstrip("?")}
            fh.write(json.dumps({"id": f"f{i}", "document": doc, "needle": needle,
                                 "queries": queries}) + "\n")  # fmt: skip
    shutil.copy(SAMPLE_EVAL / "out_of_domain.jsonl", evals / "out_of_domain.jsonl")
    settings = Settings(
        adapt="off",  # the tests' default (conftest); issue 44's auto is tested on its own
        documents_dir=str(docs),
        index_uri=str(root / "index"),
        work_dir=str(root / "work"),
        eval_dir=str(evals),
        recall_floor=0.3,
        distance_cut="0.9",  # a tiny corpus: no calibrated cut is meaningful here
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sheets, "MAX_ROWS", 3)
        outcome = materialize_graph(
            settings, progress=False, instance=dg.DagsterInstance.ephemeral()
        )
    assert outcome.success, outcome.error
    index = Index.open(settings.index_uri)
    return settings, outcome, index


def _cite(index: Index, question: str, document: str) -> tuple[Citation, dict]:
    ctx = index.ask(question, rerank=False)
    assert not ctx.no_answer, ctx.message
    got = [c for c in ctx.citations if c.document_id == document]
    assert got, f"{document} not cited for {question!r}: {[c.document_id for c in ctx.citations]}"
    c = got[0]
    row = index.documents[document]
    assert row["text"][c.start : c.end] == c.quote  # the quote is canonical text at its offsets
    return c, row


def _doc(row: dict) -> ExtractedDocument:
    return ExtractedDocument(
        row["document_id"], row["path"], row["kind"], "ok", None, "", "", "", text=row["text"],
        locators=locators_from_json(row.get("locators_json")),
    )  # fmt: skip


def test_graph_extracts_every_format(built) -> None:
    settings, outcome, _ = built
    ext = outcome.metadata["extracted_documents"]
    assert ext["failed"] == 0 and ext["partial"] == 1  # ledger.csv, cut at its row limit
    manifest = json.loads((Path(settings.work_dir) / "extracted" / "manifest.json").read_text())
    status = {r["document_id"]: r["status"] for r in manifest}
    for name in ("lecture.vtt", "talk.srt", "prices.csv", "budget.xlsx", "garden.html",
                 "handbook.docx", "report.pdf", "scan.pdf", "shop.pdf"):  # fmt: skip
        assert status[name] == "ok", name
    assert status["lecture.mp4"] == "skipped" and status["ledger.csv"] == "partial"
    assert ext["skipped"] == 1  # lecture.mp4, cited through its transcript
    summary = outcome.summary()
    assert f"({ext['ok'] - 1} ok, 1 partial, 1 skipped, 0 failed)" in summary
    assert "  PARTIAL ledger.csv: sheet 'ledger': rows from 5 on not read" in summary


def test_vtt_citation_time_range_holds_the_cue(built) -> None:
    _, _, index = built
    c, row = _cite(index, "How many times does the walrus index store each embedding?",
                   "lecture.vtt")  # fmt: skip
    m = re.fullmatch(r"#t=([\d.]+),([\d.]+)", c.fragment)
    assert m, c.fragment
    t0, t1 = float(m.group(1)), float(m.group(2))
    doc = _doc(row)
    cue = next(loc for loc in doc.locators if loc.kind == "cue" and "twice" in
               row["text"][loc.start : loc.end])  # fmt: skip
    assert cue.t_start is not None and cue.t_end is not None
    assert t0 <= cue.t_start and cue.t_end <= t1  # the time range contains the cue
    assert c.start <= cue.start and cue.end <= c.end  # ... and the quote contains its words
    assert c.url.endswith("/lecture.mp4" + c.fragment)  # on the media file
    assert ", " in c.locator_label and "–" in c.locator_label


def test_srt_citation(built) -> None:
    _, _, index = built
    c, _ = _cite(index, "When does the pelican scheduler start batch jobs?", "talk.srt")
    assert c.fragment == "#t=1,67" and c.url.endswith("/talk.srt#t=1,67")


def test_xlsx_citation_a1_range_holds_the_row(built) -> None:
    _, _, index = built
    c, row = _cite(index, "Who owns the walrus licences cost in the budget?", "budget.xlsx")
    assert c.locator_label == "Budget!A2:D3" and c.fragment == "#Budget!A2:D3"
    doc = _doc(row)
    walrus = next(loc for loc in doc.locators if loc.kind == "row" and loc.row == 3)
    assert "walrus licences" in row["text"][walrus.start : walrus.end]
    assert c.start <= walrus.start and walrus.end <= c.end


def test_csv_citation(built) -> None:
    _, _, index = built
    c, _ = _cite(index, "What is the price of the marmalade jar?", "prices.csv")
    assert c.locator_label == "prices!A2:C4" and "marmalade jar" in c.quote


def test_html_citation_text_fragment_words_are_on_the_page(built) -> None:
    from selectolax.lexbor import LexborHTMLParser

    settings, _, index = built
    c, _ = _cite(index, "How many hours of sun do tomatoes need?", "garden.html")
    assert c.fragment.startswith("#:~:text=")
    html = (Path(settings.documents_dir) / "garden.html").read_text()
    body = LexborHTMLParser(html).body
    assert body is not None
    page = " ".join(body.text(deep=True).split())
    parts = [unquote(p) for p in c.fragment.removeprefix("#:~:text=").split(",")]
    at = page.index(parts[0])  # the start words are on the page ...
    assert page.index(parts[-1], at) >= at  # ... and the end words after them
    assert c.locator_label == "Garden guide > Tomatoes"


def test_docx_citation(built) -> None:
    _, _, index = built
    c, _ = _cite(index, "What colour is a visitor badge?", "handbook.docx")
    assert "visitor | orange" in c.quote and c.locator_label == "Onboarding handbook > Badges"
    assert c.fragment == f"#char={c.start},{c.end}"


def test_pdf_table_row_is_quoted_whole_with_its_header_names(built) -> None:
    _, _, index = built
    c, row = _cite(index, QUESTION["shop.pdf"], "shop.pdf")
    # page 2 continues page 1's table without a header row: the row still names its columns
    assert "sku: E5; product: tea towel; price: 4" in c.quote
    assert c.page == 2 and c.fragment == "#page=2"
    assert row["text"].count("tea towel") == 1  # the table is not also there as word soup


def test_pdf_running_header_is_never_quoted(built) -> None:
    _, _, index = built
    c, row = _cite(index, "How many unlabelled cable drums did the audit find in warehouse 2?",
                   "report.pdf")  # fmt: skip
    assert ff.HEADER not in c.quote and c.fragment == f"#page={c.page}"
    assert row["text"].count(ff.HEADER) == 4
    assert not any(ff.HEADER in q for q in index.chunk_contents())


def test_ocr_citation_in_ask_json(built) -> None:
    from rag_assets.lib.query.output import ask_json

    _, _, index = built
    c, _ = _cite(index, "What does the lighthouse keeper log every night?", "scan.pdf")
    assert c.ocr and c.ocr_confidence is not None and c.ocr_confidence >= 0.8
    assert c.page == 2 and c.locator_label.endswith(f"(OCR, confidence {c.ocr_confidence:.2f})")
    ctx = index.ask("What does the lighthouse keeper log every night?", rerank=False)
    out = ask_json(ctx, None, index.published)
    cited = next(x for x in out["citations"] if x["document_id"] == "scan.pdf")
    assert cited["ocr"] is True and cited["ocr_confidence"] == c.ocr_confidence


def test_status_lists_partial_documents(built) -> None:
    settings, _, index = built
    report = status_report(settings)
    assert report["documents"]["partial"] == [
        {"document": "ledger.csv", "reason": "sheet 'ledger': rows from 5 on not read (limit 3)"}
    ]
    assert "line 1" in index.documents["ledger.csv"]["text"]  # indexed, with what it has
    assert "line 3" not in index.documents["ledger.csv"]["text"]
