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


# Text in the page's main panels (everything under .page except plotly and cytoscape drawings, which
# draw their own text) that the reader cannot see whole: a text element whose content is wider or
# taller than its box with overflow not visible (an ellipsis, a hidden tail); a text element whose
# content is wider than its box, or that lies outside its panel or card; a panel, card or table
# wrapper whose content is wider than it (columns scrolled off the side). Returns one line per problem.
CLIPPED_TEXT = """
const root = document.querySelector(arguments[0]);
if (!root) return ['no element matches ' + arguments[0]];
const drawn = el => el.closest('.js-plotly-plot, #gr-cyto, [class*="cytoscape"]');
const visible = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
  (el.dataset && el.dataset.dashColumn ? '[' + el.dataset.dashColumn + ']' : '') +
  ' "' + (el.innerText || '').trim().slice(0, 60) + '"';
const problems = [];
const texts = 'td, th, .card .value, .card .label, h1, h2, h3, h4, p, li, label, button, .note, pre';
for (const el of root.querySelectorAll(texts)) {
  if (drawn(el) || !visible(el) || !(el.innerText || '').trim()) continue;
  const s = getComputedStyle(el);
  const wide = el.scrollWidth > el.clientWidth + 1, tall = el.scrollHeight > el.clientHeight + 1;
  if ((wide && s.overflowX !== 'visible' && el.tagName !== 'PRE') || (tall && s.overflowY === 'hidden'))
    problems.push('clipped: ' + name(el));
  else if (wide && s.overflowX === 'visible') problems.push('overflows its box: ' + name(el));
  const box = el.closest('.panel, .card');
  if (box && box !== el) {
    const r = el.getBoundingClientRect(), b = box.getBoundingClientRect();
    if (r.right > b.right + 1 || r.left < b.left - 1) problems.push('outside its panel: ' + name(el));
  }
}
for (const el of root.querySelectorAll('.panel, .card, .dash-spreadsheet-container, .dash-table-container')) {
  if (drawn(el) || !visible(el)) continue;
  if (el.scrollWidth > el.clientWidth + 1) problems.push('wider than its box (scrolls sideways): ' + name(el));
}
if (root.scrollWidth > root.clientWidth + 1) problems.push('the page scrolls sideways');
return problems;"""


def clipped_text(browser: Any, root: str = ".page") -> list[str]:
    """One line per text of ``root``'s panels that is clipped or overflows (:data:`CLIPPED_TEXT`)."""
    return list(browser.execute_script(CLIPPED_TEXT, root))
