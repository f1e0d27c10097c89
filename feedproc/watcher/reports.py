"""What the next heartbeat writes besides the renewal: items' progress, deliveries still running
since the last beat (the dashboard's running view), and throughput (feedproc_stats)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from ..core.records import ProgressReport


class HeartbeatReports:
    """Collected by the workers and the group commit, taken by each heartbeat (given back when the
    heartbeat fails, so the next one writes them)."""

    def __init__(self) -> None:
        self._progress: dict[int, ProgressReport] = {}  # reported since the last heartbeat, by item
        # Deliveries started since the last heartbeat and still running at it: the heartbeat writes
        # their start (the dashboard's running view), so an item that finishes sooner costs nothing.
        self._unannounced: dict[int, ProgressReport] = {}
        self._tally: Counter[str] = Counter()  # throughput since the last heartbeat (feedproc_stats)

    def progress(self, report: ProgressReport) -> None:
        """`item.progress(f)` of a delivery (may run on a processor's thread)."""
        self._progress[report.item_id] = report

    def take_progress(self, item_id: int) -> ProgressReport | None:
        """The progress `item_id` reported, taken back: its answer is written instead."""
        return self._progress.pop(item_id, None)

    def started(self, report: ProgressReport) -> None:
        """A delivery started (announced by the next heartbeat if it still runs then)."""
        self._unannounced[report.item_id] = report

    def ended(self, item_id: int) -> None:
        self._unannounced.pop(item_id, None)

    def count(self, tally: Mapping[str, int]) -> None:
        """Throughput written by a group commit."""
        self._tally.update(tally)

    def take(self) -> tuple[dict[int, ProgressReport], Counter[str]]:
        """For a heartbeat: the progress to write (with the start of the deliveries still running)
        and the throughput, both reset."""
        reports, self._progress = self._progress, {}
        for item_id, started in self._unannounced.items():  # still running at this beat
            report = reports.get(item_id)
            reports[item_id] = started if report is None else replace(report, started_us=started.started_us)
        self._unannounced = {}
        tally, self._tally = self._tally, Counter()
        return reports, tally

    def give_back(self, reports: dict[int, ProgressReport], tally: Counter[str]) -> None:
        """A heartbeat failed: keep what it took for the next one (newer progress wins)."""
        self._progress = {**reports, **self._progress}
        self._tally.update(tally)
