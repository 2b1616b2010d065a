"""Headless Chromium through selenium, for the browser tests and ``bench/dashboard.py``.

Uses Debian's ``chromium`` and ``chromium-driver`` (or ``$WHATIF_CHROMIUM`` /
``$WHATIF_CHROMEDRIVER``); never downloads a browser.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--window-size=1400,1000",
                  "--enable-unsafe-swiftshader")  # WebGL in software: plotly's Scattergl needs it without a GPU


def find_browser() -> tuple[str | None, str | None, str]:
    """(chromium, chromedriver, why not) — the reason is empty when both are found."""
    chromium = os.environ.get("WHATIF_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("WHATIF_CHROMEDRIVER") or shutil.which("chromedriver")
    missing = [n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p]
    try:
        import selenium  # noqa: F401
    except ModuleNotFoundError:
        missing.append("the selenium package (pip install -e '.[dev]')")
    why = f"needs {' and '.join(missing)} (apt-get install chromium chromium-driver)" if missing else ""
    return chromium, driver, why


def chrome(download_dir: str | Path | None = None) -> Any:
    """A headless Chromium webdriver with a fresh profile (removed when the driver quits)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver, why = find_browser()
    if why or chromium is None or driver is None:
        raise RuntimeError(f"headless browser unavailable: {why}")
    profile = tempfile.mkdtemp(prefix="whatif-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    if download_dir:
        opts.add_experimental_option("prefs", {"download.default_directory": str(download_dir),
                                               "download.prompt_for_download": False})
    browser = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    quit_ = browser.quit

    def quit_and_clean() -> None:
        try:
            quit_()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    browser.quit = quit_and_clean  # type: ignore[method-assign]  # this driver's quit also removes its profile
    return browser
