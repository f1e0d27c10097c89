"""The dashboard of `feedproc serve` (issue 6).

The browser test drives Debian's Chromium through Playwright against a real `feedproc serve` and a
real watcher: the progress bar of a partition being processed reaches 100% by the live refresh
alone, and the retry button (with the API token) puts a failed partition back to work. It saves a
screenshot to $FEEDPROC_ARTIFACTS (default .ci/artifacts/). Without Chromium or the playwright
package it skips, unless FEEDPROC_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from feedproc import Feed

from ..api_support import TOKEN, ApiServer, ServeProcess
from ..support import ROOT, HandlerService, WatcherProcesses

CHROMIUM = os.environ.get("FEEDPROC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(os.environ.get("FEEDPROC_ARTIFACTS", ROOT / ".ci" / "artifacts"))
FAST = ("--poll-interval", "0.1", "--lease-seconds", "5", "--retry-delay", "0.05", "--concurrency", "2")


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (Debian's) driven by Playwright."""
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "the playwright package is not installed (pip install -e '.[test]')"
    if missing is None and not (shutil.which(CHROMIUM) or os.access(CHROMIUM, os.X_OK)):
        missing = f"no Chromium at {CHROMIUM} (apt-get install chromium, or set FEEDPROC_CHROMIUM)"
    if missing:
        if os.environ.get("FEEDPROC_REQUIRE_BROWSER", "") not in ("", "0"):
            pytest.fail(f"a browser is required (FEEDPROC_REQUIRE_BROWSER=1): {missing}")
        pytest.skip(missing)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


# ---------------------------------------------------------------- without a browser


@pytest.mark.sqlite_only
def test_pages_escape_data_and_errors(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b'{"name": "<script>alert(1)</script>"}')])
    page = api.get("/partitions/p")
    assert page.status_code == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "<script>alert" not in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'self': no inline script
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


@pytest.mark.sqlite_only
def test_a_key_with_dot_segments_links_and_acts_on_itself_not_another_partition(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("victim", [(0, b"1")])
    feed.add_partition("x/../victim", [(0, b"1")])
    assert 'href="/partitions/x%2F..%2Fvictim"' in api.get("/").text
    assert 'data-key="x/../victim"' in api.get("/partitions/x%2F..%2Fvictim").text
    answer = httpx.post(
        f"{api.url}/api/v1/partitions/x%2F..%2Fvictim/cancel", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 200, answer.text
    assert feed.status("x/../victim")["status"] == "cancelled"
    assert feed.status("victim")["status"] == "available"


@pytest.mark.sqlite_only
def test_an_unknown_partition_page_is_404(api: ApiServer) -> None:
    assert api.get("/partitions/nope").status_code == 404


def test_overview_lists_partitions_with_a_bar_per_gate(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (2, b"2")])
    html = api.get("/").text
    assert 'data-key="p"' in html and 'data-gate="0"' in html and 'data-gate="2"' in html


def test_partition_page_draws_the_mean_progress_of_items_in_flight(api: ApiServer, feed: Feed) -> None:
    from feedproc.core.records import ProgressReport

    from ..support import register

    feed.add_partition("long", [(0, b"1"), (0, b"2")])
    register(feed.store, "w1")
    (lease,) = feed.store.acquire("w1", "default", 1, 30)
    first, second = feed.store.fetch_ready("w1", 10)
    feed.store.heartbeat(
        "w1",
        30,
        [
            ProgressReport(item.id, item.partition_id, lease.epoch, item.gate, fraction)
            for item, fraction in ((first, 0.2), (second, 0.6))
        ],
    )
    html = api.get("/partitions/long").text
    assert '<progress class="item-progress" max="100" value="40">' in html and "2 at" in html


# ---------------------------------------------------------------- in a browser


@pytest.mark.slow
@pytest.mark.postgres_only
def test_dashboard_shows_live_progress_and_retries_a_failed_partition(
    browser: Any, feed: Feed, db_url: str, tmp_path: Path, watchers: WatcherProcesses, handler: HandlerService
) -> None:
    from playwright.sync_api import expect

    broken = {"on": True}

    def behave(body: dict[str, Any]) -> tuple[Any, ...]:
        if body["partition"] == "broken/1" and broken["on"]:
            return 400, "<b>unreadable file</b>"
        return 200, {"done": True}, {}, 0.05

    handler.behavior = behave
    feed.add_partition("work/1", [(0, b"{}")] * 30 + [(1, b'{"rank": true}')])
    feed.add_partition("broken/1", [(0, b'{"file": "x.pdf"}')])
    serve = ServeProcess(db_url, tmp_path, FEEDPROC_API_TOKEN=TOKEN)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(serve.url + "/")
        work = page.locator('table.partitions tr[data-key="work/1"]')
        expect(work.locator(".overall .pct")).to_have_text("0%")

        watchers.start("--handler", handler.url, *FAST)  # the page is open: only its refresh can show progress
        expect(work.locator(".overall .pct")).to_have_text("100%", timeout=90_000)
        expect(work.locator(".gatebar .pct")).to_have_text(["100%", "100%"])
        failed = page.locator('table.partitions tr[data-key="broken/1"]')
        expect(failed).to_have_attribute("data-status", "failed", timeout=60_000)
        expect(page.locator("table.failures .error")).to_contain_text("<b>unreadable file</b>")  # shown, not parsed
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

        broken["on"] = False
        page.fill("#token", TOKEN)
        failed.locator('button[data-action="retry"]').click()
        expect(page.locator("#flash")).to_contain_text("Retrying broken/1")
        expect(failed).to_have_attribute("data-status", "complete", timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "dashboard-after-retry.png"), full_page=True)
        status = httpx.get(f"{serve.url}/api/v1/partitions/broken/1", params={"history": 20}).json()
        assert "retried" in [event["kind"] for event in status["history"]]
    finally:
        serve.stop()


def test_overview_ignores_filters_no_key_could_match(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    page = api.get("/", params={"prefix": "a\x00<b>", "after": "\x00", "status": "nonsense"})
    assert page.status_code == 200 and 'data-key="p"' in page.text
