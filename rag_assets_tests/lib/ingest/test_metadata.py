"""Document metadata (issue 34): front matter, .ragmeta lines, file-system facts, their order
and how bad metadata fails (closed, alone, naming the file and line)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rag_assets.lib.ingest.extract import extract_folder
from rag_assets.lib.ingest.metadata import (
    MetadataError,
    front_matter,
    labels,
    metadata_digest,
    parse_ragmeta,
    read_rules,
)


def _docs(root: Path) -> dict[str, object]:
    return {d.document_id: d for d in extract_folder(root).documents}


def test_front_matter_fields_become_metadata_and_leave_the_text(tmp_path):
    body = "# Leave policy\n\nStaff take 25 days of leave a year.\n"
    (tmp_path / "leave.md").write_text(
        "---\ntitle: The leave policy\ntags: [policy, hr]\naccess: hr, legal\n"
        "reviewed: 2025-03-01\ndraft: false\nformat: html\nnested: {a: 1}\n---\n" + body
    )
    doc = _docs(tmp_path)["leave.md"]
    assert doc.status == "ok"
    assert doc.text == body  # the canonical text starts at the body: offsets of the body
    assert doc.title == "The leave policy"  # the owner's title wins over the first heading
    md = doc.metadata
    assert md["tags"] == ["policy", "hr"]
    assert md["access"] == ["hr", "legal"]  # a scalar with commas is split for access/tags
    assert md["reviewed"] == ["2025-03-01"] and md["draft"] == ["false"]
    assert md["format"] == ["markdown"]  # the file system's key is not overridden
    assert "nested" not in md  # a mapping is not a value
    assert md["title"] == ["The leave policy"] and md["document"] == ["leave.md"]
    assert md["size"] == [str((tmp_path / "leave.md").stat().st_size)]
    assert md["modified"][0].endswith("Z") and md["folder"] == []


def test_front_matter_needs_a_closing_line_and_a_mapping():
    assert front_matter("---\nno closing line\n\ntext").end == 0  # a thematic break, not YAML
    assert front_matter("# title\n---\na: 1\n---\n").end == 0  # only at the very start
    fm = front_matter("---\n---\nbody")
    assert fm.end == len("---\n---\n") and fm.fields == {}
    with pytest.raises(MetadataError, match="not a mapping"):
        front_matter("---\n- a\n- b\n---\nbody")
    with pytest.raises(MetadataError, match=r"not valid YAML at line 3"):
        front_matter("---\ntags: [a, b\naccess: [hr\n---\nbody")


def test_bad_front_matter_fails_its_document_alone(tmp_path):
    (tmp_path / "bad.md").write_text("---\naccess: [hr\n---\n# Secret\n\nText.\n")
    (tmp_path / "good.md").write_text("# Fine\n\nText.\n")
    (tmp_path / "empty.md").write_text("---\ntags: [a]\n---\n\n")
    docs = _docs(tmp_path)
    assert docs["bad.md"].status == "failed" and "front matter is not valid YAML" in str(
        docs["bad.md"].reason
    )
    assert docs["empty.md"].status == "failed" and "only front matter" in str(
        docs["empty.md"].reason
    )
    assert docs["good.md"].status == "ok"


def test_ragmeta_patterns_deepest_folder_wins_per_key(tmp_path):
    (tmp_path / "hr" / "policies").mkdir(parents=True)
    (tmp_path / "hr" / "policies" / "leave.md").write_text("# Leave\n\nDays off.\n")
    (tmp_path / "hr" / "salaries.md").write_text("# Salaries\n\nBands.\n")
    (tmp_path / "notes.txt").write_text("Public notes.\n")
    (tmp_path / ".ragmeta").write_text(
        "# the whole tree\n** tags=general team=all\nhr/** access=hr,legal tags=people\n"
        '*.txt title="Plain notes" tags=\n'
    )
    (tmp_path / "hr" / ".ragmeta").write_text("policies/** access=hr   # policies: hr only\n")
    docs = _docs(tmp_path)
    leave = docs["hr/policies/leave.md"].metadata
    assert leave["access"] == ["hr"]  # hr/.ragmeta is deeper than the root's line
    assert leave["tags"] == ["people"] and leave["team"] == ["all"]  # the rest from the root
    assert leave["folder"] == ["hr", "hr/policies"]
    salaries = docs["hr/salaries.md"].metadata
    assert salaries["access"] == ["hr", "legal"] and salaries["folder"] == ["hr"]
    notes = docs["notes.txt"].metadata
    assert "access" not in notes and notes["tags"] == []  # `tags=`: the key, no values
    assert notes["title"] == ["Plain notes"]  # a shell-quoted value may hold spaces
    assert "tags=people" in labels(leave) and "folder=hr/policies" in labels(leave)
    assert metadata_digest(leave) != metadata_digest(salaries)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("access=hr", "not a pattern"),
        ("hr/**", "sets no key=value"),
        ("hr/** access", "is not key=value"),
        ("hr/** Access=hr", "is not a key"),
        ("hr/** folder=x", "set by the file system"),
        ("hr/** access=h$r", "is not a group name"),
        ('hr/** title="open', "No closing quotation"),
    ],
)
def test_ragmeta_bad_lines_are_named(line, why):
    with pytest.raises(MetadataError, match=why) as err:
        parse_ragmeta(f"# ok\n** tags=a\n{line}\n", "x", "x/.ragmeta")
    assert str(err.value).startswith("x/.ragmeta line 3:")


def test_a_bad_ragmeta_fails_every_document_under_it_closed(tmp_path):
    (tmp_path / "hr").mkdir()
    (tmp_path / "hr" / "a.md").write_text("# A\n\nText.\n")
    (tmp_path / "b.md").write_text("# B\n\nText.\n")
    (tmp_path / "hr" / ".ragmeta").write_text("** access hr\n")
    docs = _docs(tmp_path)
    a = docs["hr/a.md"]
    assert a.status == "failed" and a.reason == (
        "metadata: hr/.ragmeta line 1: 'access' is not key=value"
    )
    assert a.metadata["access"] == []  # access unknown: the administrator's alone
    assert docs["b.md"].status == "ok" and "access" not in docs["b.md"].metadata
    assert read_rules(tmp_path).errors == {"hr": "hr/.ragmeta line 1: 'access' is not key=value"}


def test_metadata_is_rebuilt_each_run_while_extraction_is_reused(tmp_path):
    (tmp_path / "a.md").write_text("---\ntags: [x]\n---\n# A\n\nText.\n")
    first = extract_folder(tmp_path)
    (tmp_path / ".ragmeta").write_text("* owner=ops\n")
    os.utime(tmp_path / "a.md", (1_700_000_000, 1_700_000_000))
    previous = {d.document_id: d for d in first.documents}
    again = extract_folder(tmp_path, previous)
    assert again.reused == ["a.md"]  # same bytes: not extracted again
    md = again.documents[0].metadata
    assert md["owner"] == ["ops"] and md["tags"] == ["x"]  # front matter kept from the reuse
    assert md["modified"] == ["2023-11-14T22:13:20Z"]


def test_ragmeta_changes_the_folder_scan(tmp_path):
    from rag_assets.lib.ingest.extract import scan_folder

    (tmp_path / "a.md").write_text("# A\n\nText.\n")
    before = scan_folder(tmp_path)
    (tmp_path / ".ragmeta").write_text("* access=hr\n")
    after = scan_folder(tmp_path)
    assert before != after and after[".ragmeta"].startswith("metadata: ")


@pytest.mark.parametrize(
    ("access", "why"),
    [
        ("[secret, {x: 1}]", "access is a list holding a non-scalar"),
        ("{group: secret}", "access is a mapping"),
        ("!!binary c2VjcmV0", "access is binary data"),
        ("[*groups]", "access is a list holding a non-scalar"),  # an alias of a list, nested
        ('"*"', "access '\\*' is not a group name"),
        ('"hr, *"', "access '\\*' is not a group name"),
        ("[hr, '*']", "access '\\*' is not a group name"),
        ("yes", "access is a YAML bool"),
    ],
)
def test_front_matter_access_that_is_not_group_names_fails_the_document_closed(
    tmp_path, access, why
):
    """Issue 43: front matter's access never makes a document public; `*` is refused as
    .ragmeta and `token add --groups` refuse it, also over a .ragmeta line."""
    (tmp_path / "hr").mkdir()
    (tmp_path / ".ragmeta").write_text("hr/** access=hr\n")
    head = "---\nlists: &groups [secret]\n" if "*groups" in access else "---\n"
    (tmp_path / "hr" / "doc.md").write_text(f"{head}access: {access}\n---\n# Pay\n\nBands.\n")
    (tmp_path / "hr" / "fine.md").write_text("---\naccess: [hr, legal]\n---\n# Fine\n\nText.\n")
    docs = _docs(tmp_path)
    bad = docs["hr/doc.md"]
    assert bad.status == "failed" and "front matter: " in str(bad.reason)
    assert re.search(why, str(bad.reason)), bad.reason
    assert docs["hr/fine.md"].status == "ok" and docs["hr/fine.md"].metadata["access"] == [
        "hr",
        "legal",
    ]
