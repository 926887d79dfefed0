"""A Git repository as a source: ``git+file:///path/repo.git@ref`` or
``git+https://host/org/repo.git@ref`` (a branch, a tag or a commit; none: the remote's HEAD).

The documents are the files of that commit, read with the ``git`` binary from a bare copy kept
in the source's cache folder (``git fetch`` brings it up to date): ``git ls-tree`` lists them
with their blob ids (the content identity: an unchanged file is never read again), ``git
cat-file`` reads one, and ``git diff --name-status`` between the last listed commit and the new
one names what changed (a note; when the last commit is gone after a force-push, the note says
the full listing was compared instead). Every document is stamped with the commit it was read
at (``commit``), and its link opens that file at that commit and the cited line: the host's own
file view for the usual hosts (:data:`HOST_LINKS`: GitHub, GitLab, Bitbucket, Gitea, Forgejo,
Codeberg, sourcehut) or the source's ``link`` template; on any other host, or a local
repository, no web address opens it, and a citation opens the service's own view of the
document (``path@commit:LINE`` where there is no service: :data:`~rag_assets.lib.ingest.
sources.VIEW`).

Credentials stay Git's own (a credential helper, ``GIT_ASKPASS``, an SSH key); a token inside
the URL is redacted from every message. A file name that is not UTF-8 is keyed with its bytes
escaped (``caf\\xe9.md``): the document indexes like any other (issue 49).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from rag_assets.lib.ingest.sources import (
    VIEW,
    Item,
    LimitHit,
    Listing,
    SourceError,
    is_meta_key,
)
from rag_assets.lib.ingest.sources.config import SourceSpec
from rag_assets.lib.models.http import redact

MAX_ERROR_CHARS = 600  # of Git's message in a source's failure
_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
REPO_DIR = "repo.git"  # a Git source's bare cache, in its folder of the working folder


def split_location(location: str) -> tuple[str, str]:
    """(remote URL, ref) of ``git+URL[@ref]``; ``@`` inside the host part is user info."""
    url = location.removeprefix("git+")
    parts = urlsplit(url)
    path, ref = parts.path, ""
    if "@" in path:
        path, ref = path.rsplit("@", 1)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")), ref


class GitSource:
    def __init__(self, spec: SourceSpec, cache: Path):
        self.spec = spec
        self.remote, self.ref = split_location(spec.location)
        self.cache = Path(cache) / REPO_DIR
        self.commit = ""

    # -- git ----------------------------------------------------------------------------------
    def _git(
        self, *args: str, check: bool = True, binary: bool = False
    ) -> subprocess.CompletedProcess:
        import os

        try:
            proc = subprocess.run(
                ["git", "--git-dir", str(self.cache), *args],
                capture_output=True,
                timeout=self.spec.limits.timeout,
                env={**os.environ, **_ENV},
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LimitHit(
                f"git {args[0]} took longer than timeout={self.spec.limits.timeout:g}s"
            ) from None
        if check and proc.returncode != 0:
            raise SourceError(f"git {args[0]} failed: {self._stderr(proc)}")
        return proc

    def _stderr(self, proc: subprocess.CompletedProcess) -> str:
        """Git's whole message on one line (issue 49: its last line alone, "and the repository
        exists.", said nothing): every line but ``hint:``s, at most :data:`MAX_ERROR_CHARS`."""
        lines = [
            ln.strip()
            for ln in proc.stderr.decode("utf-8", "replace").splitlines()
            if ln.strip() and not ln.lstrip().startswith("hint:")
        ]
        text = " ".join(lines) if lines else f"exit status {proc.returncode}"
        if len(text) > MAX_ERROR_CHARS:
            text = text[: MAX_ERROR_CHARS - 1] + "…"
        user = urlsplit(self.remote).netloc.rpartition("@")[0]
        if user:
            text = text.replace(user, "***")
        return text.replace(self.remote, redact(self.remote))

    def _fetch(self) -> None:
        if not (self.cache / "HEAD").exists():
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["git", "init", "--bare", "-q", str(self.cache)],
                check=True,
                env=None,
                capture_output=True,
            )
            self._git("remote", "add", "origin", self.remote)
        else:
            self._git("remote", "set-url", "origin", self.remote)
        self._git("fetch", "--quiet", "--prune", "--force", "--tags", "origin",
                  "+HEAD:refs/remotes/origin/HEAD", "+refs/heads/*:refs/heads/*")  # fmt: skip

    def _resolve(self) -> str:
        for ref in (
            [self.ref, f"refs/tags/{self.ref}"] if self.ref else ["refs/remotes/origin/HEAD"]
        ):
            proc = self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
            if proc.returncode == 0:
                return proc.stdout.decode().strip()
        raise SourceError(
            f"ref {self.ref or 'HEAD'!r} not found in {redact(self.remote)} (a deleted branch or "
            "tag, or a commit not on any branch)"
        )

    # -- the interface ------------------------------------------------------------------------
    def list_items(self, last_commit: str = "") -> Listing:
        self._fetch()
        self.commit = self._resolve()
        out = self._git("ls-tree", "-r", "-l", "-z", "--full-tree", self.commit).stdout
        items, meta = [], []
        for entry in out.split(b"\0"):
            if not entry:
                continue
            head, _, name = entry.partition(b"\t")
            mode, typ, sha, size = head.decode().split()
            # a name that is not UTF-8: its bytes escaped (\\xe9), a key every store can write
            path = name.decode("utf-8", "backslashreplace")
            if typ != "blob" or mode == "120000":
                continue  # submodules and symbolic links are not documents
            if is_meta_key(path):  # issue 49: its rules apply as in a folder
                meta.append(Item(path, f"blob:{sha}", int(size)))
            if any(p.startswith(".") for p in path.split("/")):
                continue  # hidden files are not documents
            url = self._link(path)
            items.append(Item(path, f"blob:{sha}", int(size), url, {"commit": self.commit}))
        notes = self._changes(last_commit)
        return Listing(items, self.commit, notes, {"commit": self.commit}, meta)

    def _changes(self, last: str) -> list[str]:
        """One note naming what changed since ``last`` (``git diff --name-status``)."""
        if not last or last == self.commit:
            return []
        ancestor = self._git("merge-base", "--is-ancestor", last, self.commit, check=False)
        if ancestor.returncode != 0:
            return [f"commit {last[:12]} is not in the history of {self.commit[:12]} (a force-push "
                    "rewrote it): the full listing was compared"]  # fmt: skip
        proc = self._git("diff", "--name-status", "-M", last, self.commit)
        counts: dict[str, int] = {}
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            status = line[:1]
            counts[status] = counts.get(status, 0) + 1
        shown = ", ".join(f"{n} {_STATUS.get(s, s)}" for s, n in sorted(counts.items()))
        return [f"commit {last[:12]}..{self.commit[:12]}: {shown or 'no file changed'}"]

    def read(self, item: Item) -> bytes:
        limit = self.spec.limits.max_file_size
        if item.size is not None and item.size > limit:
            raise LimitHit(f"{item.size:,} bytes, over max_file_size={limit:,}: not read")
        return bytes(self._git("cat-file", "blob", item.identity.removeprefix("blob:")).stdout)

    def _link(self, path: str) -> str:
        return git_link(self.remote, self.commit, path, self.spec.link)


#: a Git host's file view at a commit and line, by host name (issue 49)
HOST_LINKS = {
    "github": "{repo}/blob/{commit}/{path}#L{line}",
    "gitlab": "{repo}/-/blob/{commit}/{path}#L{line}",
    "bitbucket": "{repo}/src/{commit}/{path}#lines-{line}",
    "gitea": "{repo}/src/commit/{commit}/{path}#L{line}",  # Forgejo and Codeberg alike
    "sourcehut": "{repo}/tree/{commit}/item/{path}#L{line}",
}
_HOSTS = {
    "github.com": "github",
    "gitlab.com": "gitlab",
    "bitbucket.org": "bitbucket",
    "codeberg.org": "gitea",
    "gitea.com": "gitea",
    "git.sr.ht": "sourcehut",
}
#: a self-hosted instance known by its host name's first label (github.example.com: GitHub
#: Enterprise); a self-hosted Bitbucket (Data Center) has other URLs: it needs a ``link``
_FIRST_LABEL = {"github": "github", "gitlab": "gitlab", "gitea": "gitea", "forgejo": "gitea"}


def web_repo(remote: str) -> str:
    """The remote's web address (``https://host/org/repo``: no credentials, no ``.git``; an
    ``ssh://`` remote's host over HTTPS), as a ``link`` template's ``{repo}``."""
    parts = urlsplit(remote)
    host = parts.netloc.rpartition("@")[2]
    scheme = parts.scheme
    if scheme in ("ssh", "git"):
        scheme, host = "https", parts.hostname or host
    path = parts.path.rstrip("/").removesuffix(".git")
    return urlunsplit((scheme, host, path, "", ""))


def host_kind(remote: str) -> str | None:
    """Which of :data:`HOST_LINKS` serves ``remote``, or None (a local repository, another host)."""
    parts = urlsplit(remote)
    if parts.scheme not in ("http", "https", "ssh", "git") or not parts.hostname:
        return None
    host = parts.hostname.lower()
    return _HOSTS.get(host) or _FIRST_LABEL.get(host.split(".", 1)[0])


def git_link(remote: str, commit: str, path: str, template: str = "") -> str:
    """Where a citation of ``path`` at ``commit`` opens (``{line}`` left for the citation to
    fill): the ``template`` (fields ``{repo}``, ``{commit}``, ``{path}``, ``{line}``), else the
    host's file view, else :data:`~rag_assets.lib.ingest.sources.VIEW` ``path@commit`` (the
    service's view of the document; the text a terminal shows)."""
    kind = host_kind(remote)
    if not template and kind is None:  # a name that is not UTF-8 shown escaped, never raising
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return f"{VIEW}{shown}@{commit}"
    fields = {"repo": web_repo(remote), "commit": commit, "line": "{line}",
              "path": quote(path, errors="surrogateescape")}  # fmt: skip
    return (template or HOST_LINKS[kind or "github"]).format_map(fields)


_STATUS = {
    "A": "added",
    "M": "modified",
    "D": "deleted",
    "R": "renamed",
    "C": "copied",
    "T": "retyped",
}
