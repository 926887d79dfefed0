"""A real PostgreSQL server for the tests of Dagster's Postgres instance storage (issue 42):
Debian's ``postgresql`` binaries (``initdb``, ``pg_ctl``), a throwaway cluster in a temporary
folder, trust authentication on 127.0.0.1 only, a free port. PostgreSQL refuses to run as root,
so as root the cluster belongs to the ``postgres`` user and the binaries run as it
(``runuser``)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DB = "dagster"
USER = "postgres"


def pg_bindir() -> Path | None:
    """The folder with ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest
    ``/usr/lib/postgresql/<version>/bin``; None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2] or 0))
    for d in reversed(dirs):
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


def why_no_postgres() -> str | None:
    """Why the Postgres tests cannot run here, or None when they can."""
    if pg_bindir() is None:
        return "PostgreSQL is not installed (initdb/pg_ctl; .ci/run installs Debian's postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    try:
        import dagster_postgres  # noqa: F401
    except ImportError:
        return "dagster-postgres is not installed"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server() -> Iterator[dict[str, str]]:
    """Start a cluster with database ``dagster``; yields the ``DAGSTER_PG_*`` settings that the
    docs' ``dagster.yaml`` reads (host, port, user, password, database)."""
    bindir = pg_bindir()
    assert bindir is not None, why_no_postgres()
    root = Path(tempfile.mkdtemp(prefix="rag-pg-"))
    data, sock = root / "data", root / "sock"
    as_user: list[str] = []
    if os.geteuid() == 0:  # the cluster belongs to the postgres user, who runs it
        as_user = ["runuser", "-u", USER, "--"]
        sock.mkdir()
        shutil.chown(root, USER)
        shutil.chown(sock, USER)
        os.chmod(root, 0o755)
    else:
        sock.mkdir()
    port = _free_port()

    def run(*args: str) -> None:
        subprocess.run([*as_user, *args], check=True, capture_output=True, cwd="/")

    run(str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8",
        "--locale=C", "--no-sync")  # fmt: skip
    options = (
        f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"),
        "-w", "-t", "60", "start")  # fmt: skip
    try:
        _create_db(port)
        yield {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(port),
            "DAGSTER_PG_USER": USER,
            "DAGSTER_PG_PASSWORD": "unused-trust-auth",
            "DAGSTER_PG_DB": DB,
        }
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            check=False,
            cwd="/",
        )
        shutil.rmtree(root, ignore_errors=True)


def _create_db(port: int) -> None:
    import psycopg2

    deadline = time.monotonic() + 30
    while True:
        try:
            conn = psycopg2.connect(host="127.0.0.1", port=port, user=USER, dbname="postgres")
            break
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DB}")
    conn.close()


def fresh_database(pg: dict[str, str], name: str) -> dict[str, str]:
    """A new, empty database on the session's server (one per test: Dagster's tables start
    empty); returns ``pg`` naming it."""
    import psycopg2

    conn = psycopg2.connect(
        host=pg["DAGSTER_PG_HOST"], port=int(pg["DAGSTER_PG_PORT"]), user=pg["DAGSTER_PG_USER"],
        dbname=DB,
    )  # fmt: skip
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return {**pg, "DAGSTER_PG_DB": name}
