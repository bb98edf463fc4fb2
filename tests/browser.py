"""Headless Chromium for the page tests: Debian's ``chromium`` driven through its own
``chromedriver`` (the ``chromium-driver`` package, always the same build) with selenium.

The flags keep a browser on a closed network from hanging on connection attempts (sync,
component updates, QUIC, background fetches); each browser gets a fresh profile.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
INSTALL = "apt-get install -y chromium chromium-driver && pip install -c constraints.txt -e '.[test]'"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,2400",
)


def skip_reason() -> str | None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        import selenium  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as exc:
        missing.append(exc.name or "selenium/plotly")
    return f"needs {', '.join(missing)}: {INSTALL}" if missing else None


class Browser:
    """One headless Chromium; ``js`` runs a script in the page and returns its value."""

    def __init__(self, profile_dir: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile_dir}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        self.driver.set_page_load_timeout(60)
        self.driver.set_script_timeout(30)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait_for(self, script: str, timeout: float, what: str, *args: Any) -> Any:
        """Poll ``script`` (a JS expression body ending in ``return``) until it is truthy."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.js(script, *args)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what} (last: {value!r}); console: {self.console()}"
        )

    def console(self) -> list[str]:
        try:
            return [entry["message"] for entry in self.driver.get_log("browser")]
        except Exception:  # noqa: BLE001 - only for failure messages
            return []

    def screenshot(self, path: Path) -> Path:
        """The whole page, as tall as it is."""
        height = self.js("return Math.max(document.body.scrollHeight, 800)")
        self.driver.set_window_size(1400, min(int(height) + 40, 12000))
        self.driver.save_screenshot(str(path))
        return path

    def close(self) -> None:
        self.driver.quit()


@pytest.fixture
def browser(tmp_path):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp_path))
    chromium = Browser(profile)
    try:
        yield chromium
    finally:
        chromium.close()
