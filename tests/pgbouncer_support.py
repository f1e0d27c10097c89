"""PgBouncer in front of the test PostgreSQL, in transaction pooling mode (Debian's `pgbouncer`).

`PgBouncer.start()` runs one on a free port for the test session (as the `postgres` user when the
tests run as root: PgBouncer refuses to run as root), passing every database through to the server
the tests use. Without the binary the tests that need it skip, unless
FEEDPROC_REQUIRE_PGBOUNCER=1 (CI), where they fail.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

from .support import spawn, stop_group

BINARIES = ("pgbouncer", "/usr/sbin/pgbouncer")


def pgbouncer_binary() -> str | None:
    for name in BINARIES:
        if found := shutil.which(name):
            return found
    return None


def require_pgbouncer() -> str:
    """The pgbouncer binary; skips (fails under FEEDPROC_REQUIRE_PGBOUNCER=1) when there is none."""
    binary = pgbouncer_binary()
    if binary is None:
        if os.environ.get("FEEDPROC_REQUIRE_PGBOUNCER", "") not in ("", "0"):
            pytest.fail("PgBouncer is required (FEEDPROC_REQUIRE_PGBOUNCER=1) but not installed")
        pytest.skip("no pgbouncer binary (Debian: apt-get install pgbouncer)")
    return binary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """A PgBouncer process in transaction mode in front of `server_url`'s host and port."""

    def __init__(self, binary: str, server_url: str) -> None:
        server = make_url(server_url)
        self.server = server
        self.port = _free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="feedproc-pgbouncer-"))
        user = server.username or "postgres"
        (self.directory / "users.txt").write_text(f'"{user}" ""\n')
        (self.directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.directory / 'users.txt'}\n"
            "pool_mode = transaction\nmax_client_conn = 1000\ndefault_pool_size = 20\n"
            # psycopg sends it at connect; PgBouncer would refuse a parameter it does not track.
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.directory / 'pgbouncer.log'}\n"
        )
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncer:
        """Start it (from pytest's main thread: `spawn`) and wait until it accepts connections."""
        user: dict[str, Any] = {}
        if os.geteuid() == 0:  # PgBouncer will not run as root
            postgres = pwd.getpwnam("postgres")
            for path in [self.directory, *self.directory.iterdir()]:
                os.chown(path, postgres.pw_uid, postgres.pw_gid)
            user = {"user": postgres.pw_uid, "group": postgres.pw_gid, "extra_groups": []}
        self.process = spawn([self.binary, str(self.directory / "pgbouncer.ini")], stderr=subprocess.DEVNULL, **user)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"PgBouncer did not start: {self.log()}")

    def url(self, database_url: str, *, option: bool = True) -> str:
        """`database_url` (a database of the server) reached through this PgBouncer, with
        `?feedproc_pooler=transaction` unless `option` is False."""
        parsed = make_url(database_url).set(host="127.0.0.1", port=self.port)
        if option:
            parsed = parsed.update_query_dict({"feedproc_pooler": "transaction"})
        return parsed.render_as_string(hide_password=False)

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process, grace=10)
        shutil.rmtree(self.directory, ignore_errors=True)
