"""Issue 49 end to end: credentials, access and links of a Git repository and a bucket, on the
real graph (``rag-assets index``, a Dagster instance), a Git server that asks for credentials
(``git http-backend`` behind HTTP Basic), the S3 server (moto, authentication on, its
endpoint given with user info), the real model and a real ``rag-assets serve``.

- A location with a credential inside is refused in one line naming the variables to use;
  the credentials given the right way (a Git credential helper, ``AWS_*``), the endpoint's
  user info and a presigned link are found in no file the index, its working folder and the
  Dagster instance hold, read decompressed (SQLite values, zlib and gzip, Parquet, every
  LanceDB table version).
- ``.ragmeta`` and front matter restrict documents of the repository and the bucket, the
  sources file's ``metadata`` the outermost layer: a group token never sees them on any route.
- Citations: a Git file on an unknown host is ``path@commit:LINE`` in the terminal and the
  service's own view in the service, whose PDF view serves a Git PDF and a bucket PDF; a
  private object is ``s3://bucket/key`` or, asked for, a presigned URL; a changed ``link``
  template re-renders the citations with nothing embedded.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rag_assets_tests.helpers import (
    bearer,
    cli_here,
    index_env,
    line_starting,
    start_server,
    stop_process,
)
from rag_assets_tests.source_servers import (
    commit_files,
    git,
    git_credential_env,
    git_http,
    s3_client,
    scan_for_secrets,
    small_pdf,
)

pytestmark = pytest.mark.slow

ADMIN = "admin-token-49"
GIT_USER, GIT_PW = "indexer", "GITPASSWORD-49"
EP_USER, EP_SECRET = "epuser", "EPSECRET-49"
ROLLBACK = "# Rollback\n\nRun deploy --previous to roll back.\n\nThen watch the heron error rate.\n"
REPO = {
    ".ragmeta": "secret/** access=board\n",
    "guide/rollback.md": ROLLBACK,
    "secret/plans.md": "# Plans\n\nThe okapi merger plan closes in spring.\n",
    # front matter wins over the .ragmeta line above: visible to staff
    "secret/open.md": "---\naccess: staff\n---\n# Open\n\nThe pangolin open roadmap is public.\n",
    # front matter restricts a document no .ragmeta line names
    "public/review.md": "---\naccess: [board]\n---\n# Review\n\nThe narwhal salary review.\n",
}
BUCKET = {
    ".ragmeta": "vault/** access=board\n",
    "notes/faq.md": "# FAQ\n\nThe heron refund policy gives five days.\n",
    "vault/ledger.md": "# Ledger\n\nThe quokka ledger balance is private.\n",
}
HIDDEN = {  # hidden from a staff token, and the phrase only that document has
    "handbook/secret/plans.md": "okapi merger plan",
    "handbook/public/review.md": "narwhal salary review",
    "bucket/vault/ledger.md": "quokka ledger balance",
}
SEEN = {
    "handbook/secret/open.md": "pangolin open roadmap",
    "bucket/notes/faq.md": "heron refund policy",
}
LINK = "https://git.example/team/handbook/-/blob/{commit}/{path}#L{line}"


@dataclass
class Built:
    root: Path
    env: dict[str, str]
    prefix: str
    commit: str
    pdf: bytes
    outputs: dict[str, Any] = field(default_factory=dict)
    url: str = ""
    tokens: dict[str, str] = field(default_factory=dict)

    def get(self, who: str, path: str, **kw: Any) -> httpx.Response:
        return bearer(self.url, self.tokens[who], "GET", path, **kw)

    def post(self, who: str, path: str, body: Any) -> httpx.Response:
        return bearer(self.url, self.tokens[who], "POST", path, json=body)


def _sources(path: Path, repo_url: str, prefix: str, link: str = "") -> None:
    text = (
        f'[[source]]\nname = "handbook"\nlocation = "git+{repo_url}/handbook.git@main"\n'
        'metadata = { team = "docs" }\n'
        + (f'link = "{link}"\n' if link else "")
        + f'\n[[source]]\nname = "bucket"\nlocation = "s3://rag/{prefix}"\n'
        'metadata = { access = "staff" }\n'
    )
    path.write_text(text)


def _json(out: str) -> Any:
    return json.loads(out)


@pytest.fixture(scope="module")
def built(tmp_path_factory, s3_server) -> Iterator[Built]:
    root = tmp_path_factory.mktemp("access49")
    work_repo = root / "repo"
    pdf = small_pdf("The manual says: restart the gateway before the deploy.")
    commit = commit_files(work_repo, dict(REPO), "handbook")
    (work_repo / "guide").mkdir(exist_ok=True)
    (work_repo / "guide" / "manual.pdf").write_bytes(pdf)
    git(work_repo, "add", "guide/manual.pdf")
    git(work_repo, "commit", "-q", "-m", "manual")
    commit = git(work_repo, "rev-parse", "HEAD")
    served = root / "srv"
    served.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(work_repo), str(served / "handbook.git")],
                   check=True, capture_output=True)  # fmt: skip

    s3 = s3_client(s3_server)
    prefix = f"access49-{os.getpid()}"
    for name, text in BUCKET.items():
        s3.put_object(Bucket="rag", Key=f"{prefix}/{name}", Body=text.encode())
    s3.put_object(Bucket="rag", Key=f"{prefix}/notes/scan.pdf", Body=pdf)

    aws = dict(s3_server)
    aws["AWS_ENDPOINT"] = aws["AWS_ENDPOINT"].replace("http://", f"http://{EP_USER}:{EP_SECRET}@")
    with git_http(served, GIT_USER, GIT_PW) as repo_url:
        sources = root / "sources.toml"
        env = index_env(root, root / "no-folder", RAG_SOURCES=str(sources), no_proxy="127.0.0.1")
        env = {k: v for k, v in env.items() if not k.startswith(("AWS_", "GIT_"))}
        env |= aws | git_credential_env(GIT_USER, GIT_PW)
        b = Built(root, env, prefix, commit, pdf)
        out = b.outputs

        # a credential inside a location: refused in one line, before anything is stored
        secret_s3 = env | {"RAG_SOURCES": ""}
        out["refused"] = [
            cli_here(
                secret_s3, "index", "--documents", "s3://AKIAKEY49:S3SECRET49@rag/p", check=False
            ),  # fmt: skip
        ]
        sources.write_text(f'[[source]]\nname = "handbook"\nlocation = '
                           f'"git+{repo_url.replace("//", f"//{GIT_USER}:{GIT_PW}@")}'
                           '/handbook.git"\n')  # fmt: skip
        out["refused"].append(cli_here(env, "index", check=False))

        _sources(sources, repo_url, prefix)
        out["first"] = cli_here(env, "index").stdout
        question = "How do I roll back with deploy --previous?"
        out["ask"] = cli_here(env, "ask", question).stdout
        out["ask_json"] = _json(cli_here(env, "ask", question, "--json").stdout)
        faq = "What does the heron refund policy give?"
        out["faq"] = cli_here(env, "search", faq, "-k", "3").stdout
        out["faq_json"] = _json(cli_here(env, "search", faq, "-k", "3", "--json").stdout)
        presign = env | {"RAG_SOURCE_PRESIGN_SECONDS": "900"}
        out["faq_signed"] = _json(cli_here(presign, "search", faq, "-k", "3", "--json").stdout)
        out["status_json"] = _json(cli_here(env, "status", "--json").stdout)

        # a new link template: the citations change, nothing is read or embedded again
        _sources(sources, repo_url, prefix, LINK)
        out["relinked"] = cli_here(env, "index").stdout
        out["ask_relinked"] = _json(cli_here(env, "ask", question, "--json").stdout)

        made = cli_here(env, "token", "add", "reader", "--groups", "staff")
        b.tokens = {"admin": ADMIN, "reader": made.stdout.strip()}
        secrets = [GIT_PW, EP_SECRET, EP_USER, s3_server["AWS_SECRET_ACCESS_KEY"], "S3SECRET49",
                   "X-Amz-Signature"]  # fmt: skip
        roots = [root / "index", root / "work", root / "dagster"]
        out["scan"] = scan_for_secrets(roots, secrets)
        # the scan's control: what is stored only compressed or encoded is found
        controls = ["The git source handbook", "pangolin open roadmap"]
        out["control"] = scan_for_secrets(roots, controls)
        # the Git cache exists and fetched over the authenticated server
        out["git_config"] = root / "work" / "sources" / "handbook" / "repo.git" / "config"

    # the service: its own Git cache and the bucket, no Git server needed any more
    url, proc = start_server(root / "index", env | {"RAG_API_TOKEN": ADMIN}, root / "serve.log")
    b.url = url
    try:
        yield b
    finally:
        stop_process(proc)


# -- item 5 and 6: credentials --------------------------------------------------------------
def test_a_credential_in_a_location_is_refused_and_no_secret_is_stored(built):
    bucket, repo = built.outputs["refused"]
    assert bucket.returncode != 0 and repo.returncode != 0
    for proc, names in ((bucket, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
                        (repo, "credential helper")):  # fmt: skip
        err = proc.stderr.strip()
        assert "\n" not in err and names in err and "may not hold a user or password" in err, err
        assert "S3SECRET49" not in proc.stdout + err and GIT_PW not in proc.stdout + err
    config = built.outputs["git_config"]
    assert config.is_file() and GIT_USER not in config.read_text()
    assert "source handbook: 5 listed, 5 read" in built.outputs["first"], built.outputs["first"]
    # nothing the index, its working folder and the Dagster instance hold names a secret
    assert built.outputs["scan"] == []
    # and it reads what it must: Dagster's zlib-compressed snapshots (the source asset's
    # description is only there), the LanceDB tables' rows (the documents' and chunks' text)
    found = built.outputs["control"]
    assert any("runs.db:snapshots: The git source handbook" in f for f in found), found
    assert any(".lance@" in f and "pangolin open roadmap" in f for f in found), found


def test_the_endpoint_user_info_is_in_no_output(built):
    shown = json.dumps([built.outputs[k] for k in ("ask_json", "faq_json", "faq_signed",
                                                    "status_json", "ask", "faq")])  # fmt: skip
    assert EP_SECRET not in shown and EP_USER not in shown


# -- items 9 and 10: links --------------------------------------------------------------------
def test_a_git_citation_without_a_web_host_is_path_at_commit_and_line(built):
    (first, *_) = built.outputs["ask_json"]["citations"]
    assert first["document_id"] == "handbook/guide/rollback.md"
    assert first["url"] == f"guide/rollback.md@{built.commit}:{first['line']}"
    assert f"guide/rollback.md@{built.commit[:12]}:{first['line']}" in built.outputs["ask"]
    assert "file:" not in built.outputs["ask"] and "{line}" not in built.outputs["ask"]


def test_a_private_object_is_cited_by_its_key_or_a_presigned_url(built):
    hit = built.outputs["faq_json"][0]
    assert hit["document_id"] == "bucket/notes/faq.md"
    assert hit["url"] == f"s3://rag/{built.prefix}/notes/faq.md:{hit['line']}"
    assert f"s3://rag/{built.prefix}/notes/faq.md:" in built.outputs["faq"]
    signed = built.outputs["faq_signed"][0]["url"]
    assert signed.startswith("http://127.0.0.1:") and f"/rag/{built.prefix}/notes/faq.md?" in signed
    assert "X-Amz-Expires=900" in signed and "X-Amz-Signature=" in signed


def test_the_service_cites_its_view_and_serves_git_and_bucket_pdfs(built):
    r = built.post("reader", "/ask", {"question": "How do I roll back with deploy --previous?"})
    cited = r.json()["citations"][0]
    assert cited["url"].startswith(f"{built.url}/documents/handbook/guide/rollback.md")
    view = built.get("reader", "/documents/handbook/guide/rollback.md", params={"char": "0,10"})
    assert view.status_code == 200 and "heron error rate" in view.text
    for doc in ("handbook/guide/manual.pdf", "bucket/notes/scan.pdf"):
        pdf = built.get("reader", f"/documents/{doc}")
        assert pdf.status_code == 200, (doc, pdf.text)
        assert pdf.headers["content-type"] == "application/pdf" and pdf.content == built.pdf
        page = built.get("reader", f"/documents/{doc}", params={"char": "0,11"})
        assert page.status_code == 200 and f'src="/documents/{doc}#page=1"' in page.text


# -- item 11: a changed link template ----------------------------------------------------------
def test_a_changed_link_template_rerenders_citations_without_embedding(built):
    out = built.outputs["relinked"]
    assert "source handbook: 5 listed, 0 read, 5 unchanged, 0 deleted" in out, out
    assert line_starting(out, "embedded:").startswith("embedded: 0 texts"), out
    cited = built.outputs["ask_relinked"]["citations"][0]
    line = cited["line"]
    want = f"https://git.example/team/handbook/-/blob/{built.commit}/guide/rollback.md#L{line}"
    assert cited["url"] == want


# -- item 7: .ragmeta and front matter in a repository and a bucket, every route --------------
@pytest.mark.parametrize("retriever", ["dense", "bm25", "hybrid"])
def test_a_group_token_never_finds_a_restricted_source_document(built, retriever):
    for doc, phrase in HIDDEN.items():
        hits = built.get("reader", "/search", params={"q": phrase, "retriever": retriever}).json()
        assert not {h["document_id"] for h in hits} & set(HIDDEN), (doc, retriever)
        assert phrase.split()[0] not in json.dumps(hits)
        mine = built.get("admin", "/search", params={"q": phrase, "retriever": retriever}).json()
        assert doc in {h["document_id"] for h in mine}  # the administrator finds it
    for doc, phrase in SEEN.items():
        hits = built.get("reader", "/search", params={"q": phrase, "retriever": retriever}).json()
        assert doc in {h["document_id"] for h in hits[:3]}


def test_every_other_route_keeps_them_hidden(built):
    for doc, phrase in HIDDEN.items():
        asked = built.post("reader", "/ask", {"question": f"What is the {phrase}?"}).json()
        assert not {c["document_id"] for c in asked["citations"]} & set(HIDDEN)
        sources = asked["prompt"].rsplit("Question:", 1)[0]  # the question is the asker's
        assert phrase.split()[0] not in sources + json.dumps(asked["citations"])
        missing = built.get("reader", f"/documents/{doc}x")
        for query in ("", "?char=0,5"):
            r = built.get("reader", f"/documents/{doc}{query}")
            assert r.status_code == 404 == missing.status_code
            assert r.json() == {"error": f"no document {doc!r} in the published index"}
        assert built.get("admin", f"/documents/{doc}").status_code == 200
    status = built.get("reader", "/status").json()
    listed = {d["document"] for d in status["documents"]["list"]}
    assert listed and not listed & set(HIDDEN) and set(SEEN) <= listed
    admin = {d["document"] for d in built.get("admin", "/status").json()["documents"]["list"]}
    assert set(HIDDEN) <= admin
    for phrase in HIDDEN.values():  # an operator checking the token: `search --as`
        got = cli_here(built.env, "search", phrase, "--as", "reader", "--json").stdout
        assert not {h["document_id"] for h in json.loads(got)} & set(HIDDEN)
    facets = built.get("reader", "/filters").json()
    assert "handbook/public" not in facets["folders"] and "bucket/vault" not in facets["folders"]
    assert set(facets["folders"]) >= {"bucket/notes", "handbook/secret"}


def test_mcp_over_http_keeps_them_hidden(built):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def call() -> list[Any]:
        token = built.tokens["reader"]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(f"{built.url}/mcp", http_client=http)) as c:
            got = []
            for doc, phrase in HIDDEN.items():
                got.append(await c.call_tool("search", {"query": phrase, "k": 20}))
                got.append(await c.call_tool("ask", {"question": f"What is the {phrase}?"}))
                span = {"document_id": doc, "start": 0, "end": 20}
                got.append(await c.call_tool("get_document_span", span))
            return got

    for result in anyio.run(call):
        got = result.structured_content or {}
        if isinstance(got, dict) and "citations" in got:  # ask: its sources, not the question
            got = [got["prompt"].rsplit("Question:", 1)[0], got["citations"]]
        text = json.dumps(got)
        if result.is_error:  # a hidden document's span: what a missing one gets
            text = " ".join(getattr(c, "text", "") for c in result.content)
            assert "in the published index" in text, text
        for doc, phrase in HIDDEN.items():
            assert doc not in text or result.is_error
            assert phrase.split()[0] not in text, text
