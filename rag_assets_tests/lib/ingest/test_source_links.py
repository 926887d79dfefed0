"""Issue 49, the Dagster-free layer: a credential inside a location is refused in one line; the
object store's endpoint user info is never stored or shown; ``.ragmeta`` and front matter
apply to a Git repository and a bucket exactly as to the same tree in a folder, the sources
file's ``metadata`` outermost; Git citations link the host's file view (or no web address);
a changed ``link`` template changes the links without reading anything again; a presigned
object link is a valid SigV4 signature for the configured lifetime. On a real Git repository
and the S3 server (moto, authentication on)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from rag_assets.lib.ingest.sources import SourceError
from rag_assets.lib.ingest.sources.config import SourceSpec, load_sources, source_specs
from rag_assets.lib.ingest.sources.git import git_link
from rag_assets.lib.ingest.sources.sync import extract_sources
from rag_assets_tests.source_servers import commit_files, s3_client


def _run(specs, previous, work, **kw):
    out = extract_sources(specs, {d.document_id: d for d in previous}, work, **kw)
    return out, {r.name: r for r in out.sources}


C = "3de857b1c0ffee00d15ea5e5a1ab1e5eedc0ffee"


@pytest.mark.parametrize(
    ("remote", "template", "want"),
    [
        ("https://github.com/org/repo.git", "", f"https://github.com/org/repo/blob/{C}/a%20b/c.md#L{{line}}"),
        ("ssh://git@github.com/org/repo.git", "", f"https://github.com/org/repo/blob/{C}/a%20b/c.md#L{{line}}"),
        ("https://gitlab.com/g/sub/repo.git", "", f"https://gitlab.com/g/sub/repo/-/blob/{C}/a%20b/c.md#L{{line}}"),
        ("https://gitlab.example.com/g/repo", "", f"https://gitlab.example.com/g/repo/-/blob/{C}/a%20b/c.md#L{{line}}"),
        ("https://bitbucket.org/team/repo.git", "", f"https://bitbucket.org/team/repo/src/{C}/a%20b/c.md#lines-{{line}}"),
        ("https://codeberg.org/u/repo.git", "", f"https://codeberg.org/u/repo/src/commit/{C}/a%20b/c.md#L{{line}}"),
        ("https://gitea.example.org:3000/u/repo.git", "", f"https://gitea.example.org:3000/u/repo/src/commit/{C}/a%20b/c.md#L{{line}}"),
        ("https://forgejo.example.org/u/repo.git", "", f"https://forgejo.example.org/u/repo/src/commit/{C}/a%20b/c.md#L{{line}}"),
        ("https://git.sr.ht/~u/repo", "", f"https://git.sr.ht/~u/repo/tree/{C}/item/a%20b/c.md#L{{line}}"),
        ("https://github.example.com/org/repo.git", "", f"https://github.example.com/org/repo/blob/{C}/a%20b/c.md#L{{line}}"),
        # no web host known: no web address; the service's view, or path@commit in a terminal
        ("file:///srv/repo.git", "", f"view:a b/c.md@{C}"),
        ("https://git.example.com/team/repo.git", "", f"view:a b/c.md@{C}"),
        ("http://127.0.0.1:8080/repo.git", "", f"view:a b/c.md@{C}"),
        # a template wins, with every field
        ("https://git.example.com/team/repo.git", "{repo}/-/blob/{commit}/{path}#L{line}",
         f"https://git.example.com/team/repo/-/blob/{C}/a%20b/c.md#L{{line}}"),
        ("file:///srv/repo.git", "https://cgit.example/repo/tree/{path}?id={commit}#n{line}",
         f"https://cgit.example/repo/tree/a%20b/c.md?id={C}#n{{line}}"),
    ],
)  # fmt: skip
def test_a_git_file_links_its_host_view_at_the_commit(remote, template, want):
    assert git_link(remote, C, "a b/c.md", template) == want


@pytest.mark.parametrize(
    ("location", "names"),
    [
        ("s3://AKIAKEY:SECRETVALUE@docs/handbook", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ("gs://svc:SECRETVALUE@docs/x", "GOOGLE_SERVICE_ACCOUNT"),
        ("az://acct:SECRETVALUE@container/x", "AZURE_STORAGE_ACCOUNT_KEY"),
        ("git+http://user:SECRETVALUE@127.0.0.1:9/repo.git@main", "credential helper"),
        ("git+https://SECRETVALUE@github.com/org/repo.git", "GIT_ASKPASS"),
        ("git+ssh://git:SECRETVALUE@github.com/org/repo.git", "SSH key"),
        ("https://user:SECRETVALUE@wiki.example.com/", "sends no credentials"),
    ],
)
def test_a_credential_inside_a_location_is_refused_in_one_line(tmp_path: Path, location, names):
    with pytest.raises(SourceError) as single:
        source_specs(location)
    sources = tmp_path / "sources.toml"
    sources.write_text(f'[[source]]\nname = "x"\nlocation = "{location}"\n')
    with pytest.raises(SourceError) as in_file:
        load_sources(sources)
    spec = SourceSpec("x", location, "objects")  # built by hand: refused when opened
    out, rep = _run([spec], [], tmp_path / "work")
    for text in (str(single.value), str(in_file.value), rep["x"].error):
        assert "\n" not in text and "SECRETVALUE" not in text, text
        assert names in text and "may not hold a user or password" in text, text
    assert "source x:" in str(in_file.value) and not rep["x"].ok
    assert "SECRETVALUE" not in (tmp_path / "work" / "sources" / "state.json").read_text()


def test_an_ssh_login_name_is_not_a_credential():
    (spec,) = source_specs("git+ssh://git@github.com/org/runbooks.git@main") or []
    assert spec.kind == "git" and spec.name == "runbooks"


# -- .ragmeta and front matter in every source kind ------------------------------------------
TREE = {
    ".ragmeta": "secret/** access=admins\n*.md tags=handbook\n",
    "secret/.ragmeta": "plans.md access=board\n",  # deeper: wins for plans.md
    "public/a.md": "# A\n\nThe public alpha page.\n",
    "public/fm.md": "---\naccess: [team]\ntags: [own]\n---\n# FM\n\nFront matter wins.\n",
    "secret/keys.md": "# Keys\n\nThe zebra key rotation.\n",
    "secret/plans.md": "# Plans\n\nThe okapi plan.\n",
}
OUTER = {"access": ["everyone"], "team": ["docs"]}  # the sources file's metadata: outermost
WANT = {
    "public/a.md": {"access": ["everyone"], "tags": ["handbook"], "team": ["docs"]},
    "public/fm.md": {"access": ["team"], "tags": ["own"], "team": ["docs"]},
    "secret/keys.md": {"access": ["admins"], "tags": ["handbook"], "team": ["docs"]},
    "secret/plans.md": {"access": ["board"], "tags": ["handbook"], "team": ["docs"]},
}
OWNED = ("access", "tags", "team")


def _owned(out) -> dict[str, dict[str, list[str]]]:
    docs = {d.document_id.split("/", 1)[1]: d for d in out.documents}
    assert all(d.ok for d in docs.values()), [(d.document_id, d.reason) for d in docs.values()]
    return {k: {m: d.metadata[m] for m in OWNED if m in d.metadata} for k, d in docs.items()}


@pytest.fixture(params=["git", "s3"])
def tree_source(request, tmp_path: Path):
    """(spec of TREE in a Git repository or a bucket, write(files), a folder spec of TREE)."""
    folder = tmp_path / "folder"
    for name, text in TREE.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    as_folder = SourceSpec("t", str(folder), "folder", metadata=OUTER)
    if request.param == "git":
        repo = tmp_path / "repo"
        commit_files(repo, dict(TREE), "tree")

        def write(files: dict[str, str]) -> None:
            commit_files(repo, dict(files), "edit")

        return SourceSpec("t", f"git+file://{repo}@main", "git", metadata=OUTER), write, as_folder
    aws = request.getfixturevalue("s3_env")
    s3, prefix = s3_client(aws), f"meta-{tmp_path.name}"

    def put(files: dict[str, str]) -> None:
        for name, text in files.items():
            s3.put_object(Bucket="rag", Key=f"{prefix}/{name}", Body=text.encode())

    put(TREE)
    return SourceSpec("t", f"s3://rag/{prefix}", "objects", metadata=OUTER), put, as_folder


def test_ragmeta_and_front_matter_apply_as_in_a_folder(tmp_path: Path, tree_source):
    spec, write, as_folder = tree_source
    out, rep = _run([spec], [], tmp_path / "work")
    assert _owned(out) == WANT
    folder, _ = _run([as_folder], [], tmp_path / "work-folder")
    assert _owned(folder) == WANT  # the same precedence as the same tree in a folder
    assert not any(d.document_id.endswith(".ragmeta") for d in out.documents)

    # a .ragmeta edit: a new state (the observation sees a change), nothing read again
    write({"secret/.ragmeta": "plans.md access=board,admins\n"})
    out2, rep2 = _run([spec], out.documents, tmp_path / "work")
    assert rep2["t"].state != rep["t"].state and rep2["t"].read == 0
    assert _owned(out2)["secret/plans.md"]["access"] == ["board", "admins"]

    # a .ragmeta that cannot be read fails its folder's documents closed, and only those
    write({"secret/.ragmeta": "plans.md access\n"})
    out3, _ = _run([spec], out2.documents, tmp_path / "work")
    failed = {d.document_id: d.reason for d in out3.documents if not d.ok}
    assert set(failed) == {"t/secret/keys.md", "t/secret/plans.md"}
    assert all("secret/.ragmeta line 1" in r for r in failed.values())


# -- links ---------------------------------------------------------------------------------------
def test_a_changed_link_template_changes_the_links_and_reads_nothing(tmp_path: Path):
    repo = tmp_path / "repo"
    commit = commit_files(repo, {"a.md": "# A\n\nalpha\n", "b/c.md": "# C\n\ngamma\n"}, "add")
    spec = SourceSpec("r", f"git+file://{repo}@main", "git")
    out, _ = _run([spec], [], tmp_path / "work")
    assert {d.path for d in out.documents} == {f"view:a.md@{commit}", f"view:b/c.md@{commit}"}
    link = "https://git.example/r/-/blob/{commit}/{path}#L{line}"
    linked = SourceSpec("r", spec.location, "git", link=link)
    assert linked.settings_digest() != spec.settings_digest()  # the observation sees a change
    out2, rep = _run([linked], out.documents, tmp_path / "work")
    assert (rep["r"].read, rep["r"].reused) == (0, 2)
    assert {d.path for d in out2.documents} == {
        f"https://git.example/r/-/blob/{commit}/a.md#L{{line}}",
        f"https://git.example/r/-/blob/{commit}/b/c.md#L{{line}}",
    }
    assert [d.text_hash for d in out2.documents] == [d.text_hash for d in out.documents]


def test_endpoint_user_info_is_never_stored_or_shown(tmp_path: Path, s3_env, monkeypatch):
    """``AWS_ENDPOINT=http://user:secret@host:port``: the objects are read, and neither the
    documents, the kept listing, the state nor an error names the user info."""
    s3 = s3_client(s3_env)
    prefix = f"ep-{tmp_path.name}"
    s3.put_object(Bucket="rag", Key=f"{prefix}/a.md", Body=b"# A\n\nendpoint alpha\n")
    endpoint = s3_env["AWS_ENDPOINT"].replace("http://", "http://epuser:EPSECRET@")
    monkeypatch.setenv("AWS_ENDPOINT", endpoint)
    spec = SourceSpec("b", f"s3://rag/{prefix}", "objects")
    out, rep = _run([spec], [], tmp_path / "work", run_id="run-1")
    (doc,) = out.documents
    assert doc.ok and doc.path == f"view:s3://rag/{prefix}/a.md"
    from rag_assets.lib.ingest.sources import Item
    from rag_assets.lib.ingest.sources.objects import ObjectSource

    with pytest.raises(SourceError) as gone:
        ObjectSource(spec).read(Item("no-such.md", ""))
    shown = [str(gone.value), json.dumps([d.to_dict() for d in out.documents]), rep["b"].line()]
    shown += [p.read_text() for p in (tmp_path / "work").rglob("*.json")]
    assert len(shown) >= 5  # the state and the run's kept listing among them
    assert not [s for s in shown if "EPSECRET" in s or "epuser" in s]


def test_a_presigned_link_is_signed_for_its_lifetime(tmp_path: Path, s3_env, monkeypatch):
    """The plain object URL answers 403 on the real server (why a private object is not
    linked by it); the presigned URL is the SigV4 query signature botocore computes for the
    same request, valid ``seconds``, with no endpoint user info; other paths are not signed."""
    import httpx
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from rag_assets.lib.ingest.sources.objects import presigner

    s3 = s3_client(s3_env)
    key = f"sign-{tmp_path.name}/a b.pdf"
    s3.put_object(Bucket="rag", Key=key, Body=b"%PDF-1.4 signed")
    plain = f"{s3_env['AWS_ENDPOINT']}/rag/{key.replace(' ', '%20')}"
    assert httpx.get(plain).status_code == 403
    monkeypatch.setenv("AWS_ENDPOINT", s3_env["AWS_ENDPOINT"].replace("//", "//u:EPSECRET@"))
    sign = presigner(600)
    url = sign(f"view:s3://rag/{key}")
    assert url and url.startswith(plain + "?") and "EPSECRET" not in url
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert query["X-Amz-Expires"] == "600"
    request = AWSRequest(method="GET", url=plain)
    request.context["timestamp"] = query["X-Amz-Date"]
    auth = S3SigV4QueryAuth(
        Credentials(s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_SECRET_ACCESS_KEY"]),
        "s3",
        s3_env["AWS_REGION"],
        expires=600,
    )
    auth._modify_request_before_signing(request)
    want = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    assert query["X-Amz-Signature"] == want
    assert sign("view:a.md@" + C) is None and sign("https://example.com/x") is None
