"""Test-only helpers for the dashboard's browser tests: headless Chromium from Debian through Debian's
chromedriver (Selenium), and ``tpuops dashboard`` run as a user runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium session (import it as a fixture); skipped, saying why, without Debian's packages."""
    if CHROMEDRIVER is None or CHROMIUM is None:
        pytest.skip("needs Debian's chromium and chromium-driver (make tools installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def dashboard_process(work: Path, env: dict[str, str], *flags: str) -> Iterator[str]:
    """``tpuops dashboard`` in its own process on a free port; the URL (with the token) it prints first."""
    proc = subprocess.Popen([sys.executable, "-m", "tpuops", "dashboard", *flags], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "http://127.0.0.1:" not in line:
            proc.kill()
            raise AssertionError(f"tpuops dashboard did not start: {line!r} {proc.communicate()[1]}")
        yield line.split(": ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def drawn(browser: Any, selector: str) -> int:
    """How many elements the page has drawn that match ``selector`` (CSS)."""
    return len(browser.find_elements("css selector", selector))
