"""The subprocesses of a benchmark phase (watchers, the HTTP handler, the peers' workers) and the
helper scripts they run (`cmds/`, or `feedproc/_examples/` in a wheel)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .options import BenchFailed


def helper(name: str) -> Path:
    """A helper script in `cmds/` (a checkout) or packaged beside feedproc (a wheel)."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent / "cmds" / name, package / "_examples" / name):
        if candidate.exists():
            return candidate
    raise BenchFailed(f"{name} is missing: run the benchmark from a feedproc checkout")


class Processes:
    """Subprocesses of one phase, with their peak RSS sampled (psutil when installed, and
    /proc/PID/status VmHWM, the kernel's high-water mark, read just before they stop)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self, command: list[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        with open(self.folder / f"{name}.out", "wb") as out, open(self.folder / f"{name}.err", "wb") as err:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample, name="bench-rss", daemon=True)
            self._sampler.start()
        return proc

    def _sample(self) -> None:
        try:
            import psutil
        except ImportError:  # /proc VmHWM alone (Linux)
            return
        handles: dict[int, Any] = {}
        while not self._stop.wait(0.1):
            for proc in list(self.procs):
                if proc.poll() is not None:
                    continue
                try:
                    handle = handles.get(proc.pid) or handles.setdefault(proc.pid, psutil.Process(proc.pid))
                    rss = handle.memory_info().rss
                except (psutil.Error, OSError):
                    continue
                self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), rss)

    def record_high_water(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        hwm = int(line.split()[1]) * 1024
                        self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), hwm)

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def dead(self) -> list[subprocess.Popen[bytes]]:
        return [proc for proc in self.procs if proc.poll() is not None and proc.returncode != 0]

    def wait_exit(self, deadline: float) -> bool:
        """Wait for every process to exit by itself (the peers' drain mode); False at the deadline."""
        while time.monotonic() < deadline:
            if all(proc.poll() is not None for proc in self.procs):
                return True
            self.record_high_water()
            time.sleep(0.05)
        return False

    def stop(self, grace: float = 30.0) -> None:
        self.record_high_water()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=2)

    def peak_mb(self) -> list[float]:
        return [round(self.peak[p.pid] / 2**20, 1) for p in self.procs if p.pid in self.peak]

    def errors(self) -> str:
        tails = []
        for path in sorted(self.folder.glob("*.err")):
            text = path.read_text(errors="replace").strip()
            if text:
                tails.append(f"{path.name}: {text.splitlines()[-1][:300]}")
        return "; ".join(tails)
