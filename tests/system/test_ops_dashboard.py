"""
The dashboard (C{malamute_pack/ops/dashboard/}) in a real browser: Debian's
headless C{chromium}, driven through selenium and C{chromium-driver}, loads
the page from a real broker process's management API while clients make
traffic, and the rendered tables must show the streams, clients, mailboxes
and services that exist. A screenshot is saved under the trial temp
directory and its path printed. The browser keeps everything it writes
(profile, caches, crash dumps, chromedriver's log) in the test's own
directory, its temporary files in a folder of its own that goes when it
quits: nothing is left in /tmp, nothing is shared with another test
process.

Tests for: ``malamute_pack/ops/dashboard/`` (index.html, dashboard.js,
dashboard.css).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from twisted.trial import unittest

from malamute_pack.client import BlockingClient
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.support import skip_slow

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

# A mailbox address that would be an element if the page took it for markup.
MARKUP = '<b class="injected">dash-markup</b>'

# Seconds the page has to show what exists (it polls every 2 s).
RENDER_TIMEOUT = 20.0


def _browser_missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.exists(path) and os.access(path, os.X_OK)):
            return f"{path} is missing: apt-get install {package} (scripts/bootstrap does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed in this environment (scripts/bootstrap installs it)"
    return None


class DashboardBrowserTests(unittest.TestCase):
    """The dashboard, rendered by headless chromium against a broker with traffic."""

    skip = skip_slow or _browser_missing()

    def setUp(self) -> None:
        directory = Path(self.mktemp())
        self.broker = BrokerProcess(
            directory,
            journal=True,
            # The test's clients are only serviced while it calls them.
            timeout_ms=120_000,
            args=["--http", "tcp:0:interface=127.0.0.1"],
        )
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.url = self.broker.http_url

    def client(self, address: str) -> BlockingClient:
        """A client of the broker as C{address}, closed when the test ends."""
        client = BlockingClient(self.broker.endpoint, address, timeout=5.0)
        self.addCleanup(client.close)
        return client

    def make_traffic(self) -> None:
        """
        A reader, a writer to two streams, letters waiting in a mailbox, a
        service's worker and a request for it.
        """
        self.reader = self.client("dash-reader")
        self.reader.set_consumer("dash-weather", ".*")
        self.writer = self.client("dash-writer")
        for stream in ("dash-trades", "dash-weather"):
            self.writer.set_producer(stream)
            for n in range(25):
                self.writer.send(f"tick.{n}", [b"x" * 100])
        for n in range(3):
            self.writer.sendto("dash-inbox", "letter", [f"letter {n}".encode()])
        # Names are the API's data: the page must show them as text, never as markup.
        self.writer.sendto(MARKUP, "letter", [b"<script>"])
        worker = self.client("dash-worker")
        worker.set_worker("dash-echo", ".*")
        self.reader.sendfor("dash-echo", "ping", [b"ping"])

    def keep_publishing(self, seconds: float) -> None:
        """Publish to C{dash-weather} for C{seconds}, a few hundred a second, read by the reader."""
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            for _ in range(20):
                n += 1
                self.writer.send(f"tick.more.{n}", [b"y" * 200])
            while self.reader.recv(timeout=0) is not None:
                pass
            self.writer.pause(0.05)

    def browser(self) -> WebDriver:
        """Headless chromium through chromedriver, quit when the test ends."""
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        # The browser's profile, caches and crash dumps go to this test's
        # directory. Its temporary files (TMPDIR) go to a folder of its own,
        # removed after it quits: the folder of its singleton socket, which
        # chromium leaves behind when it is killed, must be in a short path
        # (a socket's path is at most 107 bytes), so not under trial's.
        home = Path(self.mktemp()).resolve()
        home.mkdir(parents=True)
        temporary = tempfile.mkdtemp(prefix="malamute-chromium-")
        self.addCleanup(shutil.rmtree, temporary, ignore_errors=True)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in (
            "--headless=new",
            "--no-sandbox",  # the tests run as root
            "--disable-dev-shm-usage",
            "--window-size=1400,1300",
            "--lang=en-US",  # thousands separators as checked here
            f"--user-data-dir={home / 'profile'}",
            f"--disk-cache-dir={home / 'cache'}",
            f"--crash-dumps-dir={home / 'crashes'}",
        ):
            options.add_argument(argument)
        # The page's console, to check that it logs no errors.
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        environment = dict(os.environ, TMPDIR=temporary)
        service = Service(CHROMEDRIVER, env=environment, log_output=str(home / "chromedriver.log"))
        driver = webdriver.Chrome(options=options, service=service)
        self.addCleanup(driver.quit)
        return driver

    def test_tables_show_what_exists(self) -> None:
        """
        The clients, streams, mailboxes and services tables show the
        clients' addresses, the streams written, the mailbox with letters
        waiting and the service offered; the overview and the chart render.
        """
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.make_traffic()
        driver = self.browser()
        driver.get(self.url)

        def names(table: str) -> set[str]:
            rows = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-name]")
            return {str(row.get_attribute("data-name")) for row in rows}

        expected = {
            "clients-table": {"dash-writer", "dash-reader", "dash-worker"},
            "streams-table": {"dash-weather", "dash-trades"},
            "mailboxes-table": {"dash-inbox", MARKUP},
            "services-table": {"dash-echo"},
        }

        def shown(_: object) -> bool:
            return all(want <= names(table) for table, want in expected.items())

        wait = WebDriverWait(driver, RENDER_TIMEOUT, poll_frequency=0.25)
        wait.until(shown, f"the dashboard did not show {expected} in {RENDER_TIMEOUT}s")
        for table, want in expected.items():
            self.assertTrue(want <= names(table), f"{table}: {names(table)}")
        # The broker's own connections (its $broker session) are hidden by default.
        self.assertEqual(driver.find_elements(By.CSS_SELECTOR, "#clients-table tr.internal"), [])

        def cell(table: str, name: str, column: int) -> str:
            for row in driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-name]"):
                if row.get_attribute("data-name") == name:
                    return str(row.find_element(By.CSS_SELECTOR, f"td:nth-child({column})").text)
            return ""

        self.assertEqual(driver.find_elements(By.CSS_SELECTOR, "b.injected"), [])
        self.assertEqual(cell("mailboxes-table", MARKUP, 1), MARKUP)

        # Figures, right-aligned and formatted: 25 messages, 3 letters waiting.
        wait.until(lambda _: cell("streams-table", "dash-trades", 4) == "25")
        self.assertEqual(cell("mailboxes-table", "dash-inbox", 2), "3")
        self.assertEqual(cell("services-table", "dash-echo", 5), "1")
        self.assertEqual(
            driver.find_element(By.CSS_SELECTOR, "#streams-table td.n").value_of_css_property(
                "text-align"
            ),
            "right",
        )
        self.assertEqual(driver.find_element(By.ID, "status").text, "live")
        self.assertTrue(driver.find_elements(By.CSS_SELECTOR, "#chart svg polyline"))

        # A few refreshes later, with traffic, the rates show and the page has not failed.
        self.keep_publishing(6.0)
        wait.until(lambda _: cell("streams-table", "dash-weather", 6) not in ("0/s", ""))
        self.assertRegex(cell("streams-table", "dash-weather", 4), r"^\d{1,3}(,\d{3})+$")
        self.assertRegex(cell("streams-table", "dash-weather", 6), r"/s$")
        self.assertEqual(driver.find_element(By.ID, "status").text, "live")

        # A click on a header sorts by it: the stream names, descending.
        def order() -> list[str]:
            rows = driver.find_elements(By.CSS_SELECTOR, "#streams-table tbody tr[data-name]")
            return [str(row.get_attribute("data-name")) for row in rows]

        self.assertEqual(order(), ["dash-trades", "dash-weather"])
        driver.find_element(By.CSS_SELECTOR, "#streams-table th").click()
        self.assertEqual(order(), ["dash-weather", "dash-trades"])
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        self.assertEqual(errors, [])
        screenshot = os.path.abspath(self.mktemp()) + ".png"
        self.assertTrue(driver.save_screenshot(screenshot))
        print(f"dashboard screenshot: {screenshot}")

    def test_unreachable(self) -> None:
        """When the broker stops answering, the page says so (and keeps retrying)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        driver = self.browser()
        driver.get(self.url)

        def status(_: object) -> str:
            return str(driver.find_element(By.ID, "status").text)

        wait = WebDriverWait(driver, RENDER_TIMEOUT, poll_frequency=0.25)
        wait.until(lambda d: status(d) == "live")
        self.broker.stop()
        wait.until(lambda d: "broker unreachable" in status(d))
