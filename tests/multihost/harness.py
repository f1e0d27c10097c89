"""Many hosts on one machine: watcher "hosts" in Linux network namespaces against a PostgreSQL of
the harness's own, with a fault proxy in between (docs/performance.md, "Many hosts").

    bridge fpmh0 10.231.7.1/24 (the root namespace: PostgreSQL on :25432, the proxy on :25433)
      ├─ veth fpmh1a ── fpmh1b 10.231.7.11 in namespace fpmh-h1 (a watcher process)
      ├─ veth fpmh2a ── fpmh2b 10.231.7.12 in namespace fpmh-h2
      └─ ...

Each host reaches the database only through its own link and the proxy, so a host is cut off by
taking its link down (its TCP connections hang, as on a real network partition, instead of being
closed), and latency, a blackhole or a storm of resets hits every host at the proxy. Root is
needed (`ip netns`, a bridge, veth links); everything the harness makes is named `fpmh*`, lives
in addresses it assigns itself, and is removed on `close()` — also what a crashed run left behind,
at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from ..support import spawn
from .proxy import FaultProxy

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), Path("/usr/bin"))
PREFIX = "fpmh"
SUBNET = "10.231.7"
BRIDGE_IP = f"{SUBNET}.1"
# Below the kernel's ephemeral range (32768-60999): beside the conformance suite, a client socket once
# held 127.0.0.1:55432 as its own port, PostgreSQL could not listen there, and every test was refused.
PG_PORT = 25432
PROXY_PORT = 25433
METRICS_PORT = 9100  # each host's watcher serves /metrics on its own address


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def available() -> str | None:
    """Why the harness cannot run here, or None: it needs root, `ip netns` and PostgreSQL's binaries."""
    if os.geteuid() != 0:
        return "the multi-host harness needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "the multi-host harness needs iproute2 (ip netns)"
    if not (PG_BIN / "initdb").exists():
        return f"the multi-host harness needs PostgreSQL's server binaries (no initdb in {PG_BIN})"
    return None


# ---------------------------------------------------------------- the network


class Network:
    """A bridge in the root namespace and one namespace per host, each on a veth link to it."""

    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        self.bridge = f"{PREFIX}0"

    @staticmethod
    def namespace(n: int) -> str:
        return f"{PREFIX}-h{n}"

    @staticmethod
    def address(n: int) -> str:
        return f"{SUBNET}.{10 + n}"

    def up(self) -> None:
        self.clean()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for n in range(1, self.hosts + 1):
            ns, outer, inner = self.namespace(n), f"{PREFIX}{n}a", f"{PREFIX}{n}b"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", outer, "master", self.bridge)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{self.address(n)}/24", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def cut(self, n: int) -> None:
        """Take host n's link down: its packets go nowhere (its connections hang, unclosed)."""
        sh("ip", "link", "set", f"{PREFIX}{n}a", "down")

    def heal(self, n: int) -> None:
        sh("ip", "link", "set", f"{PREFIX}{n}a", "up")

    def run_in(self, n: int) -> list[str]:
        """The command prefix that runs a program on host n."""
        return ["ip", "netns", "exec", self.namespace(n)]

    def clean(self) -> None:
        """Remove every namespace and link of ours, including what a crashed run left."""
        for name in sh("ip", "netns", "list", check=False).stdout.split():
            if name.startswith(f"{PREFIX}-h"):
                sh("ip", "netns", "del", name, check=False)
        links = sh("ip", "-o", "link", "show", check=False).stdout.splitlines()
        for line in links:
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(PREFIX):
                sh("ip", "link", "del", name, check=False)


# ---------------------------------------------------------------- PostgreSQL of our own


class Postgres:
    """A PostgreSQL server started for the run (initdb in a temporary directory, trust auth on
    the bridge), stopped and deleted by `stop()`."""

    def __init__(self, port: int = PG_PORT, max_connections: int = 300) -> None:
        self.port = port
        self.max_connections = max_connections
        self.dir = Path(tempfile.mkdtemp(prefix="fpmh-pg-"))
        self.data = self.dir / "data"
        self.pid: int | None = None

    def _as_postgres(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, text=True)

    def start(self) -> None:
        os.chmod(self.dir, 0o755)
        shutil.chown(self.dir, "postgres")
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"listen_addresses = '{BRIDGE_IP},127.0.0.1'\nport = {self.port}\n"
                f"max_connections = {self.max_connections}\nunix_socket_directories = '{self.dir}'\n"
                "shared_buffers = 256MB\nfsync = on\nsynchronous_commit = on\n"
            )
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\nhost all all 127.0.0.1/32 trust\n")
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        admin = create_engine(self.url("postgres", host="127.0.0.1"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE feedproc"))
        admin.dispose()

    def url(self, database: str = "feedproc", *, host: str = BRIDGE_IP, port: int | None = None) -> str:
        return f"postgresql+psycopg://postgres@{host}:{port or self.port}/{database}"

    def cpu_seconds(self) -> float:
        """CPU time of the server so far: the postmaster, its live backends and those it reaped."""
        if self.pid is None:
            return 0.0
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in [self.pid, *_children(self.pid)]:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
                if pid == self.pid:
                    total += int(fields[13]) + int(fields[14])  # cutime, cstime: reaped backends
        return total / tick

    def stop(self) -> None:
        if self.data.exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    with contextlib.suppress(OSError):
        return [int(p) for p in path.read_text().split()]
    return []


# ---------------------------------------------------------------- the cluster


@dataclass
class Host:
    """One watcher host: its namespace number, its `feedproc watch` process, its log."""

    n: int
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    started: float = 0.0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Cluster:
    """The network, the database, the proxy and the hosts of one run; `close()` undoes all of it."""

    hosts: int
    lease_seconds: float = 10.0
    concurrency: int = 50
    processor: str = "tests.multihost.processors:Sleep20"
    poll_interval: float = 0.5
    extra: tuple[str, ...] = ()
    network: Network = field(init=False)
    pg: Postgres = field(init=False)
    proxy: FaultProxy = field(init=False)
    members: dict[int, Host] = field(default_factory=dict)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fpmh-run-")))
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        self.network = Network(self.hosts)
        self.pg = Postgres()

    def start(self) -> None:
        self.network.up()
        self.pg.start()
        self.proxy = FaultProxy(BRIDGE_IP, PROXY_PORT, "127.0.0.1", self.pg.port)
        self.proxy.start()
        self.engine = create_engine(self.pg.url(host="127.0.0.1"), pool_size=4)
        from feedproc import Feed

        with Feed(self.pg.url(host="127.0.0.1")) as feed:
            feed.migrate()

    @property
    def watcher_url(self) -> str:
        """The database as the hosts see it: through the proxy, on the bridge."""
        return self.pg.url(port=PROXY_PORT)

    def feed(self) -> Any:
        from feedproc import Feed

        return Feed(self.pg.url(host="127.0.0.1"))

    def start_host(self, n: int, *args: str) -> Host:
        """Start `feedproc watch` on host n (logs as JSON lines in the run's directory)."""
        host = self.members.setdefault(n, Host(n))
        host.log = self.workdir / f"host{n}.log"
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", FEEDPROC_DATABASE_URL=self.watcher_url)
        env["FPMH_CALL_LOG"] = str(self.workdir / f"calls{n}.log")  # tests/multihost/processors.py
        command = [
            *self.network.run_in(n),
            sys.executable,
            "-m",
            "feedproc",
            "watch",
            "--processor",
            self.processor,
            "--concurrency",
            str(self.concurrency),
            "--lease-seconds",
            str(self.lease_seconds),
            "--poll-interval",
            str(self.poll_interval),
            "--log-format",
            "json",
            "--shutdown-grace",
            "30",
            "--metrics-port",
            str(METRICS_PORT),
            "--monitor-host",
            "0.0.0.0",
            *self.extra,
            *args,
        ]
        with open(host.log, "ab") as log:
            host.process = spawn(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        host.started = time.monotonic()
        return host

    def stop_host(self, n: int, *, kill: bool = False, timeout: float = 60.0) -> None:
        """SIGTERM (a clean leave) or SIGKILL host n's watcher, and wait for it."""
        host = self.members[n]
        if host.process is None or host.process.poll() is not None:
            return
        host.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            host.process.wait(timeout)
        except subprocess.TimeoutExpired:
            host.process.kill()
            host.process.wait(10)

    def watcher_of(self) -> dict[str, int]:
        """Watcher id -> host number, for the watchers registered (ids carry the pid)."""
        pids = {h.pid: n for n, h in self.members.items() if h.pid is not None}
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT id, pid FROM feedproc_watchers")).all()
        # `ip netns exec` execs the program: the watcher's pid is the process's pid.
        return {row.id: pids[row.pid] for row in rows if row.pid in pids}

    def leases_by_host(self) -> dict[int, int]:
        """Partitions leased now (unexpired), per host."""
        owners = self.watcher_of()
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT lease_owner, count(*) AS n FROM feedproc_partitions WHERE status = 'available'"
                    " AND lease_owner IS NOT NULL AND lease_expires_at > now() GROUP BY lease_owner"
                )
            ).all()
        held = {n: 0 for n, h in self.members.items() if h.alive()}
        for row in rows:
            if row.lease_owner in owners:
                held[owners[row.lease_owner]] = held.get(owners[row.lease_owner], 0) + row.n
        return held

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(text(sql), params).scalar()

    def handovers(self) -> int:
        """Partitions handed from one watcher to another that asked (rebalancing), so far."""
        return int(self.scalar("SELECT count(*) FROM feedproc_events WHERE kind = 'stolen'"))

    def takeovers(self) -> int:
        """Leases taken over after they expired (a host gone silent), so far."""
        return int(self.scalar("SELECT count(*) FROM feedproc_events WHERE kind = 'expired'"))

    def lost_deliveries(self) -> int:
        """Deliveries charged as lost (taken by a watcher that lost the lease before answering):
        each is delivered again."""
        return int(self.scalar("SELECT count(*) FROM feedproc_attempts WHERE outcome = 'lost'"))

    def partitions_of(self, watcher: str) -> list[int]:
        """The partitions leased to `watcher` now."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id FROM feedproc_partitions WHERE lease_owner = :w AND status = 'available'"
                    " AND lease_expires_at > now()"
                ),
                {"w": watcher},
            )
            return [row.id for row in rows]

    def still_held_by(self, watcher: str, pids: list[int]) -> int:
        """How many of `pids` are still available and leased to `watcher` (not taken over, not finished)."""
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM feedproc_partitions WHERE id = ANY(:ids) AND status = 'available'"
                        " AND lease_owner = :w"
                    ),
                    {"ids": pids, "w": watcher},
                ).scalar_one()
            )

    def in_flight_of(self, watcher: str) -> int:
        """Items a watcher has taken and not yet answered (its in-flight records)."""
        from feedproc.core.records import decode_inflight

        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT entries FROM feedproc_inflight WHERE watcher = :w"), {"w": watcher})
            return sum(len(decode_inflight(row.entries)) for row in rows)

    def metric(self, n: int, name: str, **labels: str) -> float:
        """A counter of host n's watcher, summed over the samples with `labels` (its /metrics, read
        over the bridge)."""
        import httpx

        body = httpx.get(f"http://{self.network.address(n)}:{METRICS_PORT}/metrics", timeout=5).text
        total = 0.0
        for line in body.splitlines():
            if not line.startswith(name + "{"):
                continue
            head, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def calls(self) -> list[tuple[int, int, float]]:
        """Every processor call of every host so far: (item id, gate, unix time it started)."""
        found = []
        for path in self.workdir.glob("calls*.log"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 3:
                    found.append((int(parts[0]), int(parts[1]), float(parts[2])))
        return found

    def log_events(self, n: int, event: str) -> list[dict[str, Any]]:
        host = self.members[n]
        if host.log is None or not host.log.exists():
            return []
        found = []
        for line in host.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    found.append(record)
        return found

    def close(self) -> None:
        for n in list(self.members):
            with contextlib.suppress(Exception):
                self.stop_host(n, kill=True, timeout=10)
        with contextlib.suppress(Exception):
            self.engine.dispose()
        with contextlib.suppress(Exception):
            self.proxy.stop()
        self.pg.stop()
        self.network.clean()
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def cluster(hosts: int, **settings: Any) -> Iterator[Cluster]:
    """A started Cluster, always closed afterwards."""
    made = Cluster(hosts, **settings)
    try:
        made.start()
        yield made
    finally:
        made.close()


def wait_for(predicate: Callable[[], Any], timeout: float, every: float = 0.25) -> tuple[Any, float]:
    """Poll until `predicate()` is truthy or the deadline; (its last value, seconds waited)."""
    start = time.monotonic()
    last = predicate()
    while not last and time.monotonic() - start < timeout:
        time.sleep(every)
        last = predicate()
    return last, time.monotonic() - start
