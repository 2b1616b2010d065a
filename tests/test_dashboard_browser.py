"""The dashboard in headless Chromium (Debian's chromium + chromium-driver, driven by selenium):
overview numbers against ``whatif analyze``'s document, the timeline (bins, zoom to exact
slices, click a task), a scale transform in the builder, save and reload the scenario, compare
two scenarios, the graph page, a refused path. Screenshots go to a temporary folder, or to
``$WHATIF_SCREENSHOTS`` (how docs/img/dashboard-*.png are made).

No sleeps: every step waits for a concrete condition — Dash's own callback queues empty
(:func:`_settled`), the figure on screen being the one the server sent and listening to the
mouse (:func:`_timeline_drawn` compares the drawn subplot titles with the server's summary
line), a cell or text present."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e '.[dev]')")

from whatif.dashboard.browser import chrome, find_browser
from whatif.dashboard.jobs import POLL_MS
from whatif.dashboard.layout import NAME_WIDTH
from whatif.report.diff_text import short_name

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(bool(find_browser()[2]), reason=find_browser()[2] or "ok")]

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"
SHARED_TRACES = REPO.parent / "shared" / "traces"  # as in conftest.py (its shared_traces fixture skips)
QWEN = "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
WAIT = 60


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = Path(os.environ.get("WHATIF_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    from whatif.dashboard.app import create_app
    from whatif.dashboard.serve import serve_in_background
    from whatif.dashboard.state import RunStore

    paths: list[str | Path] = [SAMPLE]
    if (SHARED_TRACES / QWEN).is_file():
        paths.append(SHARED_TRACES / QWEN)
    store = RunStore(paths)
    bg = serve_in_background(create_app(store=store))
    bg.store = store
    yield bg
    bg.stop()


@pytest.fixture(scope="module")
def browser(downloads: Path) -> Iterator[Any]:
    b = chrome(download_dir=downloads)
    b.set_window_size(1400, 1000)
    yield b
    b.quit()


def _wait(browser: Any, cond: Any, timeout: float = WAIT) -> Any:
    """Poll ``cond`` until truthy; elements Dash re-renders mid-read (stale) are simply read again."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException, NoSuchElementException)).until(cond)


def _cell_texts(browser: Any, css: str) -> list[str]:
    """Texts of the cells matching ``css``, read in one go (retried if the table re-renders)."""
    from selenium.webdriver.common.by import By

    return _wait(browser, lambda b: [c.text for c in b.find_elements(By.CSS_SELECTOR, css)] or None)


def _text(browser: Any, id_: str) -> str:
    """The visible text of ``#id_`` ('' when absent), read again if Dash replaces the element mid-read."""
    from selenium.webdriver.common.by import By

    def read(b: Any) -> tuple[str]:
        els = b.find_elements(By.ID, id_)
        return (els[0].text if els else "",)  # a tuple: truthy even when the text is empty

    return _wait(browser, read)[0]


# True when the page is idle: the app is hydrated, Dash has no callback requested, running or
# waiting to be applied (the queues dash.testing waits on), nothing is marked loading, every
# dcc.Graph on the page has been drawn by plotly, and none is `dash-graph--pending`: dcc.Graph
# sets that class while it plots and while it resizes (after its first plot it always resizes).
SETTLED = """
const s = window.store && window.store.getState();
if (!s || s.appLifecycle !== 'HYDRATED' || s.isLoading) return false;
for (const [queue, items] of Object.entries(s.callbacks || {}))
  if (queue !== 'completed' && Array.isArray(items) && items.length) return false;
if (document.querySelector('[data-dash-is-loading="true"], .dash-graph--pending')) return false;
for (const g of document.querySelectorAll('.dash-graph'))
  if (!g.querySelector('.js-plotly-plot .main-svg')) return false;
return true;"""


def _settled(browser: Any) -> bool:
    return bool(browser.execute_script(SETTLED))


# Subplot titles of the timeline figure on screen, or null while dcc.Graph has not yet bound its
# plotly event handlers (it does so once its first plot resolves; a zoom or click before that
# never reaches the server).
TIMELINE_TITLES = """
const gd = document.querySelector('#tl-graph .js-plotly-plot');
if (!gd || !gd._ev || !gd._ev.listeners('plotly_relayout').length || !gd._ev.listeners('plotly_click').length)
  return null;
return Array.from(gd.querySelectorAll('.annotation-text')).map(a => a.textContent);"""


def _timeline_drawn(browser: Any) -> str:
    """``#tl-info`` once the timeline on screen is the one it describes ('' before): each panel of
    the info line ("measured: 1,234 tasks in view (bins)") must be a drawn subplot title
    ("measured (bins, 1,234 tasks)"), the graph listening to zoom and click, and the page idle."""
    if not _settled(browser):
        return ""
    info = _text(browser, "tl-info")
    panels = re.findall(r"(.+?): ([\d,]+) tasks in view \((\w+)\)(?: · |$)", info)
    titles = browser.execute_script(TIMELINE_TITLES)
    return info if panels and titles == [f"{name} ({mode}, {n} tasks)" for name, n, mode in panels] else ""


def _click(browser: Any, id_: str) -> None:
    from selenium.webdriver.common.by import By

    def attempt(b: Any) -> bool:
        el = b.find_element(By.ID, id_)
        b.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
        el.click()
        return True

    _wait(browser, attempt)  # a control Dash re-rendered between find and click is found again


def _param(browser: Any, name: str) -> Any:
    """A generated form control (pattern-matching id ``{"name": …, "type": "wb-param"}``)."""
    from selenium.webdriver.common.by import By

    return browser.find_element(By.XPATH, _param_xpath(name))


def _param_xpath(name: str) -> str:
    return "//*[@id='" + json.dumps({"name": name, "type": "wb-param"}, separators=(",", ":")) + "']"


def _type(el: Any, value: str) -> None:
    from selenium.webdriver.common.keys import Keys

    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(Keys.DELETE)
    el.send_keys(value, Keys.TAB)


def _no_error(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    errors = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".error")]
    assert not errors, errors


def _run_id(server: Any, label_part: str) -> str:
    return next(r.id for r in server.store.runs.values() if label_part in r.label)


def _analyze_doc(path: Path, tmp: Path, *flags: str) -> dict[str, Any]:
    out = tmp / "analysis.json"
    subprocess.run([sys.executable, "-m", "whatif.cli", "analyze", str(path), *flags, "--json", str(out)], check=True,
                   capture_output=True)
    return json.loads(out.read_text())


def _check_overview(browser: Any, doc: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    steps = doc["steps"]
    n = len(steps)
    assert _text(browser, "ov-tasks") == f"{doc['tasks']:,}"
    assert _text(browser, "ov-edges") == f"{doc['edges']:,}"
    assert _text(browser, "ov-steps-count") == str(n)
    counted = [s for s in steps if "excluded" not in s] or steps  # warm-up and partial steps left out of means
    k = len(counted)
    assert _text(browser, "ov-measured") == f"{sum(s['measured_ns'] for s in counted) / k / 1e6:,.3f}"
    assert _text(browser, "ov-replayed") == f"{sum(s['predicted_ns'] for s in counted) / k / 1e6:,.3f}"
    cells = browser.find_elements(By.CSS_SELECTOR, "#ov-steps td[data-dash-column='replayed ms']")
    assert cells and float(cells[0].text) == round(steps[0]["predicted_ns"] / 1e6, 3)
    first_kernel = browser.find_elements(By.CSS_SELECTOR, "#ov-top_kernels td[data-dash-column='name']")
    if doc["top_kernels"]:  # shortened from the middle, numbers first
        assert first_kernel[0].text == short_name(doc["top_kernels"][0]["name"], NAME_WIDTH)
        headers = _cell_texts(browser, "#ov-top_kernels th.dash-header")
        assert [h.strip() for h in headers] == ["count", "GPU ms", "name"], headers   # a kernel has no CPU time


def test_overview_matches_analyze(server: Any, browser: Any, shots: Path, tmp_path: Path) -> None:
    doc = _analyze_doc(SAMPLE, tmp_path)
    browser.get(f"{server.url}/overview?run={_run_id(server, 'llm_serve')}")
    _wait(browser, lambda b: _text(b, "ov-tasks"))
    _check_overview(browser, doc)
    _no_error(browser)
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-overview.png"))


def test_count_all_steps_box(server: Any, browser: Any, tmp_path: Path) -> None:
    """The box in the navigation bar counts the warm-up and partial steps, as --include-* do."""
    from selenium.webdriver.common.by import By

    every = _analyze_doc(SAMPLE, tmp_path, "--include-warmup", "--include-partial")
    mean = f"{sum(s['measured_ns'] for s in every['steps']) / len(every['steps']) / 1e6:,.3f}"
    browser.get(f"{server.url}/overview?run={_run_id(server, 'llm_serve')}")
    _wait(browser, lambda b: _text(b, "ov-tasks"))
    assert _text(browser, "ov-measured") != mean and _text(browser, "ov-excluded")
    browser.find_element(By.CSS_SELECTOR, "#count-all input[type=checkbox]").click()
    _wait(browser, lambda b: _text(b, "ov-measured") == mean and _settled(b))
    assert _text(browser, "ov-excluded") == ""
    _check_overview(browser, every)
    browser.find_element(By.CSS_SELECTOR, "#count-all input[type=checkbox]").click()  # leave it as found
    _wait(browser, lambda b: _text(b, "ov-measured") != mean and _settled(b))
    _no_error(browser)


def test_shared_gpu_trace(server: Any, browser: Any, shots: Path, shared_traces: Path, tmp_path: Path) -> None:
    doc = _analyze_doc(shared_traces / QWEN, tmp_path)
    rid = _run_id(server, "Qwen")
    browser.get(f"{server.url}/overview?run={rid}")
    _wait(browser, lambda b: _text(b, "ov-tasks") == f"{doc['tasks']:,}")
    _check_overview(browser, doc)
    _open_timeline(browser, f"{server.url}/timeline?run={rid}")
    assert "stream" in browser.page_source  # one lane per GPU stream
    browser.save_screenshot(str(shots / "dashboard-timeline-gpu.png"))


def _open_timeline(browser: Any, url: str) -> str:
    """Open the timeline and wait until it is drawn (its info line returned) or shows an error,
    which fails the test with the page's own message."""
    browser.get(url)
    # the info line as the wait saw it settled: read again, a late re-render (a resize) could blank it
    drawn = _wait(browser, lambda b: _timeline_drawn(b) or _text(b, "tl-error"))
    assert not _text(browser, "tl-error"), _text(browser, "tl-error")
    return drawn


ZOOM = """
const gd = document.querySelector('#tl-graph .js-plotly-plot');
const r = gd._fullLayout.xaxis.range; const mid = (r[0] + r[1]) / 2;
Plotly.relayout(gd, {'xaxis.range': [mid, mid + (r[1] - r[0]) / 400]});"""


def _zoom_to_exact(browser: Any) -> None:
    """Zoom as a user's drag would (a plotly relayout of the x axis); the server re-renders the
    window as exact slices."""
    browser.execute_script(ZOOM)
    _wait(browser, lambda b: "(exact)" in _timeline_drawn(b))


def test_timeline_slow_draw(server: Any, browser: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draw slower than the loading spinner's 150 ms delay (a large trace) makes the graph
    resize while it runs; that resize must not supersede the draw (the page stayed on its empty
    first figure) nor a zoom."""
    import time

    from whatif.dashboard import timeline as tl

    view = tl.view

    def slow_view(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.6)
        return view(*args, **kwargs)

    monkeypatch.setattr(tl, "view", slow_view)
    for _ in range(2):  # a first load in a new browser session can escape the race; a second did not
        info = _open_timeline(browser, f"{server.url}/timeline?run={_run_id(server, 'llm_serve')}")
        assert "(bins)" in info
    _zoom_to_exact(browser)
    _no_error(browser)


def test_timeline_zoom_and_click(server: Any, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    info = _open_timeline(browser, f"{server.url}/timeline?run={_run_id(server, 'llm_serve')}")
    assert "(bins)" in info and "(exact)" not in info
    browser.save_screenshot(str(shots / "dashboard-timeline.png"))
    _zoom_to_exact(browser)
    # click the middle of the longest slice of the replayed panel, at its pixel position
    pos = browser.execute_script("""
        const gd = document.querySelector('#tl-graph .js-plotly-plot');
        let best = null;
        gd.data.forEach((t, c) => { if (t.type !== 'scattergl' || t.yaxis !== 'y2') return;
          for (let i = 1; i < t.x.length; i += 4) { const w = t.x[i + 1] - t.x[i - 1];
            if (best === null || w > best.w) best = {w: w, x: t.x[i], y: t.y[i]}; } });
        const xa = gd._fullLayout.xaxis2, ya = gd._fullLayout.yaxis2, box = gd.getBoundingClientRect();
        return [xa._offset + xa.l2p(best.x) - box.width / 2, ya._offset + ya.l2p(best.y) - box.height / 2];""")
    plot = browser.find_element(By.CSS_SELECTOR, "#tl-graph .js-plotly-plot")
    ActionChains(browser).move_to_element_with_offset(plot, int(pos[0]), int(pos[1])).click().perform()
    _wait(browser, lambda b: b.find_elements(By.ID, "tl-task"))
    details = _text(browser, "tl-task")
    assert "depends on" in details and "critical path" in details
    _no_error(browser)
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-timeline-zoomed.png"))


def _predict(browser: Any, name: str, factor: str, pattern: str) -> str:
    _type(_param(browser, "factor"), factor)
    _type(_param(browser, "select.name"), pattern)
    _click(browser, "wb-clear")
    _click(browser, "wb-add")
    _wait(browser, lambda b: "[[transform]]" in _text(b, "wb-toml") and f"factor = {factor}" in _text(b, "wb-toml"))
    _type(browser.find_element("id", "wb-name"), name)
    _click(browser, "wb-predict")
    _wait(browser, lambda b: _text(b, "wb-speedup").endswith("x") and name in b.page_source)
    return _text(browser, "wb-speedup")


def test_builder_save_load_compare(server: Any, browser: Any, shots: Path, downloads: Path) -> None:
    from selenium.webdriver.common.by import By

    from whatif.transforms.scenario import load_scenario

    rid = _run_id(server, "llm_serve")
    browser.get(f"{server.url}/whatif?run={rid}")
    _wait(browser, lambda b: b.find_elements(By.XPATH, _param_xpath("factor")))
    speedup = _predict(browser, "aten twice as fast", "0.5", "aten::")
    assert float(speedup.rstrip("x")) > 1.05
    _wait(browser, lambda b: b.find_elements(By.ID, "wb-cp-compare"))
    _no_error(browser)
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-whatif.png"))
    # save: the TOML download is a scenario the CLI loads
    _click(browser, "wb-save")
    _wait(browser, lambda b: "saved" in _text(b, "wb-saved"))
    saved = downloads / "aten_twice_as_fast.toml"
    _wait(browser, lambda b: saved.is_file() and saved.stat().st_size > 0)
    scenario = load_scenario(saved)
    assert scenario.name == "aten twice as fast" and scenario.transforms[0].factor == 0.5
    # a second scenario, then reload the first from its file
    _predict(browser, "aten 20% faster", "0.8", "aten::")
    _click(browser, "wb-save")
    _wait(browser, lambda b: "aten_20__faster.toml" in _text(b, "wb-saved"))
    browser.find_element(By.CSS_SELECTOR, "#wb-upload input[type=file]").send_keys(str(saved))
    _wait(browser, lambda b: b.find_element(By.ID, "wb-name").get_attribute("value") == "aten twice as fast")
    assert "factor = 0.5" in _text(browser, "wb-toml")
    _click(browser, "wb-predict")
    _wait(browser, lambda b: _text(b, "wb-speedup") == speedup)
    # compare both
    browser.get(f"{server.url}/compare?run={rid}")
    _wait(browser, lambda b: "aten 20% faster" in b.page_source)
    _click(browser, "cmp-run")
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#cmp-table td[data-dash-column='scenario']"))
    names = _cell_texts(browser, "#cmp-table td[data-dash-column='scenario']")
    assert names == ["baseline", "aten twice as fast", "aten 20% faster"]
    speeds = [float(c) for c in _cell_texts(browser, "#cmp-table td[data-dash-column='speedup']")]
    assert speeds[0] == 1.0 and speeds[1] > speeds[2] > 1.0
    assert "TTFT" in _text(browser, "cmp-serving")
    # serving metrics of the baseline and both scenarios at the recorded workload
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#cmp-serving-table td[data-dash-column='scenario']"))
    assert _cell_texts(browser, "#cmp-serving-table td[data-dash-column='scenario']") == names
    ttft = [float(c) for c in _cell_texts(browser, "#cmp-serving-table td[data-dash-column='TTFT mean ms']")]
    tpot = [float(c) for c in _cell_texts(browser, "#cmp-serving-table td[data-dash-column='TPOT mean ms']")]
    assert len(ttft) == len(tpot) == 3 and all(v > 0 for v in ttft + tpot)
    assert ttft[1] < ttft[0] and tpot[1] < tpot[0]
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#cmp-serving-curves .main-svg"))
    _no_error(browser)
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-compare.png"))
    browser.execute_script("document.getElementById('cmp-serving').scrollIntoView();")
    _wait(browser, lambda b: b.execute_script(
        "const r = document.getElementById('cmp-serving').getBoundingClientRect();"
        "return r.top >= 0 && r.top < window.innerHeight;"))
    browser.save_screenshot(str(shots / "dashboard-compare-serving.png"))


def test_graph_and_runs(server: Any, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    rid = _run_id(server, "llm_serve")
    browser.get(f"{server.url}/graph?run={rid}&task=15605")
    _wait(browser, lambda b: "tasks within" in _text(b, "gr-info"))
    _wait(browser, lambda b: b.find_elements(By.ID, "tl-task"))
    _no_error(browser)
    n = int(_text(browser, "gr-info").split()[0])
    # drawn: the page idle, and dash-cytoscape's instance (window.cy) holds the n nodes, none moving
    _wait(browser, lambda b: _settled(b) and b.execute_script(
        "return window.cy && window.cy.nodes().length === arguments[0] && !window.cy.nodes().some(x => x.animated());",
        n))
    browser.save_screenshot(str(shots / "dashboard-graph.png"))
    browser.get(f"{server.url}/?run={rid}")
    _wait(browser, lambda b: b.find_elements(By.ID, "runs-path"))
    browser.find_element(By.ID, "runs-path").send_keys("/etc")
    _click(browser, "runs-add")
    _wait(browser, lambda b: "outside the folders" in _text(b, "runs-error"))
    assert "llm_serve" in _text(browser, "runs-table")
    browser.save_screenshot(str(shots / "dashboard-runs.png"))


def test_upload_a_trace_and_a_bomb_from_the_runs_page(server: Any, browser: Any, shots: Path, tmp_path: Path) -> None:
    """The Runs page streams a chosen file to the upload route (assets/upload.js): a trace becomes
    the selected run, a gzip bomb is refused with the reader's one line."""
    import gzip
    import shutil

    from selenium.webdriver.common.by import By

    def choose(path: Path) -> None:
        browser.get(f"{server.url}/")
        _wait(browser, lambda b: b.find_elements(By.ID, "runs-choose"))
        _click(browser, "runs-choose")
        _wait(browser, lambda b: b.find_elements(By.ID, "runs-file"))
        browser.find_element(By.ID, "runs-file").send_keys(str(path))

    trace = tmp_path / "uploaded.pt.trace.json.gz"
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", trace)
    choose(trace)
    _wait(browser, lambda b: "run=" in b.current_url)
    rid = browser.current_url.split("run=")[1]
    assert server.store.runs[rid].label == "uploaded.pt.trace.json.gz"     # its name, not its hash folder's
    _wait(browser, lambda b: "uploaded.pt.trace.json.gz" in _text(b, "runs-table"))
    bad = tmp_path / "bad3.json"               # named a trace, not valid JSON: the reader fails on analysis
    bad.write_text("{bad\n")
    choose(bad)
    _wait(browser, lambda b: "run=" in b.current_url and b.current_url.split("run=")[1] != rid)
    assert server.store.runs[browser.current_url.split("run=")[1]].label == "bad3.json"
    _wait(browser, lambda b: "not valid JSON" in _text(b, "runs-table") and _idle(b))
    _no_error(browser)                          # said in the run's status, not in an error box
    browser.execute_script(COUNT_CALLBACKS)
    time.sleep(4 * POLL_MS / 1000)              # a poll still on would call the server 4 times meanwhile
    assert browser.execute_script("return window.whatifCallbacks") == 0
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [], "pad": "' + b" " * (64 << 20) + b'"}', mtime=0))
    choose(bomb)
    _wait(browser, lambda b: "inflates to more than" in _text(b, "runs-upload-status"))
    assert "bomb.json.gz: inflates to more than" in _text(browser, "runs-upload-status")
    browser.save_screenshot(str(shots / "dashboard-upload-refused.png"))


def test_suggest_page(server: Any, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    label = "Qwen" if any("Qwen" in r.label for r in server.store.runs.values()) else "llm_serve"
    browser.get(f"{server.url}/suggest?run={_run_id(server, label)}")
    _wait(browser, lambda b: b.find_elements(By.ID, "sg-run"))
    _click(browser, "sg-run")
    _wait(browser, lambda b: _text(b, "sg-best"))
    _no_error(browser)
    if label == "Qwen":
        from whatif.suggest import suggest
        run = next(r for r in server.store.runs.values() if label in r.label)
        best = suggest(run.path).suggestions[0]                     # the page shows what the API ranks first
        assert best.setting == "precision(dtype=fp8)" and best.headline.speedup > 1.1
        assert _text(browser, "sg-best") == f"{best.setting} {best.headline.speedup:.3f}x"
        assert _cell_texts(browser, "#sg-table td[data-dash-column='optimization']")[:3] == [
            "precision(dtype=fp8)", "fuse()", "cuda_graph()"]
    else:
        assert _text(browser, "sg-best") == "none applies"
    assert "needs collective kernels" in _text(browser, "sg-skipped")
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-suggest.png"))


def test_breakdown_page(server: Any, browser: Any, shots: Path) -> None:
    """The Breakdown page shows the figures of the `whatif breakdown` document of the same run."""
    from selenium.webdriver.common.by import By

    from whatif.breakdown import WHOLE_RANK, breakdown

    if not any("Qwen" in r.label for r in server.store.runs.values()):
        browser.get(f"{server.url}/breakdown?run={_run_id(server, 'llm_serve')}")
        _wait(browser, lambda b: _text(b, "bd-empty"))
        assert "No GPU activity" in _text(browser, "bd-empty")
        return
    rid = _run_id(server, "Qwen")
    browser.get(f"{server.url}/breakdown?run={rid}")
    _wait(browser, lambda b: b.find_elements(By.ID, "bd-idle") and _text(b, "bd-idle"))
    _no_error(browser)
    analysis = server.store.get(rid).analysis
    whole = next(r for r in breakdown(analysis.trace, analysis.graph).temporal if r.step == WHOLE_RANK)
    assert _text(browser, "bd-idle") == f"{100 * whole.idle_ns / whole.span_ns:.1f} %"
    assert _cell_texts(browser, "#bd-temporal-table td[data-dash-column='step']")[0] == "all"
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-breakdown.png"))


def test_memory_page(server: Any, browser: Any, shots: Path) -> None:
    """The Memory page shows the `whatif memory` document of the same run: the peak, the timeline
    and the operators that held the peak; a run recorded without profile_memory says so."""
    from selenium.webdriver.common.by import By

    from whatif.memory import memory

    browser.get(f"{server.url}/memory?run={_run_id(server, 'llm_serve')}")
    _wait(browser, lambda b: _text(b, "mem-empty"))
    assert "No allocator records" in _text(browser, "mem-empty")
    if not any("Qwen" in r.label for r in server.store.runs.values()):
        return
    rid = _run_id(server, "Qwen")
    browser.get(f"{server.url}/memory?run={rid}")
    _wait(browser, lambda b: b.find_elements(By.ID, "mem-peak") and _text(b, "mem-peak"))
    _no_error(browser)
    analysis = server.store.get(rid).analysis
    gpu = memory(analysis.trace, analysis.graph).devices[0]
    assert gpu.device == "GPU 0"
    assert _text(browser, "mem-peak") == f"{round(gpu.peak_allocated_bytes / 2**20, 1):,}"
    assert _text(browser, "mem-at").startswith(f"step {gpu.peak_step} · aten::mul")
    assert _cell_texts(browser, "#mem-ops td[data-dash-column='op']")[:2] == ["aten::add", "aten::addmm"]
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-memory.png"))


def _pick(browser: Any, id_: str, label: str) -> None:
    """Choose ``label`` in the dropdown ``#id_``, as a user does."""
    from selenium.webdriver.common.by import By

    _click(browser, id_)
    option = _wait(browser, lambda b: next((o for o in b.find_elements(By.CSS_SELECTOR, "[role=option]")
                                             if o.text == label), None))
    option.click()


def test_memory_page_predicts_a_scenario(server: Any, browser: Any, shots: Path) -> None:
    """A scenario of the run shows the timeline its transforms predict (`whatif memory -s`) beside the
    recorded one; a scenario whose memory model cannot apply says why in one line."""
    from selenium.webdriver.common.by import By

    from whatif.memory import memory, memory_edits
    from whatif.transforms.scenario import scenario_from_dict

    run = server.store.add_path(REPO / "sample_traces" / "sdpa_memory" / "math")[0]
    spec = {"name": "batch 2", "transform": [{"name": "batch", "factor": 2}]}
    run.scenarios["batch 2"] = spec
    run.scenarios["fuse"] = {"name": "fuse", "transform": [{"name": "cuda_graph"}]}
    run.scenarios["flash, batch 2"] = {"name": "flash, batch 2", "transform": [{"name": "flash_attention"},
                                                                              {"name": "batch", "factor": 2}]}
    browser.get(f"{server.url}/memory?run={run.id}")
    _wait(browser, lambda b: b.find_elements(By.ID, "mem-peak") and _text(b, "mem-peak"))
    recorded = _text(browser, "mem-peak")
    assert not browser.find_elements(By.ID, "mem-predicted")
    _pick(browser, "mem-scenario", "predicted: batch 2")
    _wait(browser, lambda b: b.find_elements(By.ID, "mem-predicted"))
    _no_error(browser)
    analysis = run.analysis
    edits, lines = memory_edits(analysis.graph, scenario_from_dict(spec).transforms)
    cpu = memory(analysis.trace, analysis.graph, edits=edits).devices[0]
    assert _text(browser, "mem-peak") == f"{round(cpu.peak_allocated_bytes / 2**20, 1):,}"
    assert _text(browser, "mem-recorded-peak") == recorded
    assert _text(browser, "mem-predicted").splitlines() == lines and lines[0].startswith("batch")
    assert float(_text(browser, "mem-peak-ratio").rstrip("x")) > 1.2
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-memory-predicted.png"))
    _pick(browser, "mem-scenario", "predicted: fuse")  # a transform that does not model memory says so
    _wait(browser, lambda b: "memory not modelled" in _text(b, "mem-predicted"))
    assert _text(browser, "mem-peak") == recorded and _text(browser, "mem-peak-ratio") == "1.000x"
    _pick(browser, "mem-scenario", "predicted: flash, batch 2")  # edits that do not compose: one line
    _wait(browser, lambda b: "both change" in _text(b, "mem-body-error"))
    assert not browser.find_elements(By.ID, "mem-peak")
    _pick(browser, "mem-scenario", "as recorded")
    _wait(browser, lambda b: _text(b, "mem-peak") == recorded and not b.find_elements(By.ID, "mem-predicted"))


def test_ops_page(server: Any, browser: Any, shots: Path) -> None:
    """The Ops page shows the `whatif ops` table of the same run, longest group first, numbers first."""
    from selenium.webdriver.common.by import By

    from whatif.ops import ops_table

    if not any("Qwen" in r.label for r in server.store.runs.values()):
        pytest.skip("the Qwen H100 trace is not in ../shared/traces")
    rid = _run_id(server, "Qwen")
    browser.get(f"{server.url}/ops?run={rid}")
    _wait(browser, lambda b: b.find_elements(By.ID, "ops-total") and _text(b, "ops-total"))
    _no_error(browser)
    doc = ops_table(server.store.get(rid).analysis.trace)
    assert _text(browser, "ops-total") == f"{doc.gpu_total_ns / 1e6:,.3f} ms"
    assert _cell_texts(browser, "#ops-table td[data-dash-column='op']")[0] == doc.rows[0].op
    assert _cell_texts(browser, "#ops-table td[data-dash-column='bound']")[0] == doc.rows[0].bound
    headers = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#ops-table th .column-header-name")]
    assert headers[:2] == ["total ms", "share %"]
    _wait(browser, _settled)
    browser.save_screenshot(str(shots / "dashboard-ops.png"))


def test_sweep_html_renders_offline(browser: Any, tmp_path: Path, shots: Path) -> None:
    """`whatif sweep --html` embeds plotly: the page draws its figure from a file, with no network
    (the machines that run CI have none, and a CDN script would leave it blank)."""
    from selenium.webdriver.common.by import By

    from whatif.cli import main

    html = tmp_path / "sweep.html"
    assert main(["sweep", str(SAMPLE), "--rates", "5,20", "--num-requests", "10", "--html", str(html), "-q"]) == 0
    browser.get(html.as_uri())
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, ".main-svg .scatterlayer .trace"))
    assert browser.execute_script("return typeof Plotly") == "object"
    browser.save_screenshot(str(shots / "sweep-offline.png"))


def test_report_html_renders_offline(browser: Any, tmp_path: Path) -> None:
    """The CI report's HTML is self-contained too: drawn from a file, no network."""
    from selenium.webdriver.common.by import By

    from whatif.cli import main

    scenario = REPO / "scenarios" / "faster_linear.toml"
    assert main(["report", str(SAMPLE), "-s", str(scenario), "-o", str(tmp_path / "r"), "--format", "html", "-q",
                 "--no-step-summary"]) == 0
    browser.get((tmp_path / "r" / "report.html").as_uri())
    _wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, ".main-svg .trace"))
    assert browser.execute_script("return typeof Plotly") == "object"
    assert "linear 2x faster" in browser.page_source


COUNT_CALLBACKS = """
window.whatifCallbacks = 0;
const fetch0 = window.fetch;
window.fetch = (url, ...rest) => {
  if (String(url).includes("_dash-update-component")) { window.whatifCallbacks += 1; }
  return fetch0(url, ...rest);
};
"""
"""From now on, count the page's callback requests (``window.whatifCallbacks``)."""
PAGE_ACTIONS = {"/suggest": ("sg-run", "sg-body")}
"""The button a page waits for before it shows its numbers, and where they appear (pressed by
:func:`test_every_page`)."""


# dash-cytoscape draws asynchronously: its instance (window.cy) holds the nodes, none moving
CYTOSCAPE_DRAWN = """
if (!document.getElementById('gr-cyto')) return true;
return !!window.cy && window.cy.nodes().length > 0 && !window.cy.nodes().some(x => x.animated());"""


def _idle(browser: Any) -> bool:
    """The page settled, no job "working" message left (pages poll while their job runs), a graph
    drawing drawn."""
    from selenium.webdriver.common.by import By

    return _settled(browser) and not browser.find_elements(By.CSS_SELECTOR, ".working") and \
        bool(browser.execute_script(CYTOSCAPE_DRAWN))


def _runs() -> list[str]:
    return ["llm_serve", "Qwen"]


def _whole_page_screenshot(browser: Any, path: Path, most_px: int = 5000) -> None:
    """The whole page (up to ``most_px`` high) in one screenshot; the window is put back after."""
    height = min(most_px, int(browser.execute_script("return document.documentElement.scrollHeight")))
    browser.set_window_size(1400, max(1000, height + 140))
    _wait(browser, _idle)
    browser.save_screenshot(str(path))
    browser.set_window_size(1400, 1000)


@pytest.mark.parametrize("label", _runs())
def test_every_page(server: Any, browser: Any, shots: Path, label: str) -> None:
    """Every registered page (pages added as modules included) on the sample and on the Qwen H100
    trace: drawn without an error, no text in its main panels clipped or overflowing; a screenshot of
    each to look at."""
    from whatif.dashboard.browser import clipped_text
    from whatif.dashboard.pages import discover_pages

    if not any(label in r.label for r in server.store.runs.values()):
        pytest.skip(f"needs ../shared/traces/{QWEN}")
    rid = _run_id(server, label)
    for page in discover_pages():
        browser.get(f"{server.url}{page.path}?run={rid}")
        _wait(browser, _idle)
        if page.path in PAGE_ACTIONS:
            button, body = PAGE_ACTIONS[page.path]
            _click(browser, button)
            _wait(browser, lambda b, body=body: _text(b, body) and _idle(b))
        _no_error(browser)
        problems = clipped_text(browser)
        _whole_page_screenshot(browser, shots / f"page-{page.path.strip('/') or 'runs'}-{label}.png")
        assert not problems, f"{page.title} on {label}:\n" + "\n".join(problems)


BROKEN_PAGE = """<!DOCTYPE html><html><head><style>{css}</style></head><body><div class="page">
<div class="cards"><div class="card" style="width: 90px; overflow: hidden"><div class="label">mean step</div>
  <div class="value" style="white-space: nowrap">123,456,789.000 ms</div></div></div>
<div class="panel" style="width: 320px"><h4>Top kernels</h4><div style="overflow-x: auto">
  <table><tr><th>name</th><th>count</th><th>GPU ms</th><th>CPU ms</th></tr>
  <tr><td style="max-width: 120px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap">
    void at::native::vectorized_elementwise_kernel&lt;4, at::native::FillFunctor&lt;float&gt;&gt;</td>
  <td>1,204</td><td>12.345</td><td>0.123</td></tr></table></div></div>
</div></body></html>"""


def test_clipping_check_fails_on_a_broken_page(browser: Any, tmp_path: Path) -> None:
    """The check finds what the issue's screenshots showed: a name cut by an ellipsis, numbers
    scrolled off the side of a panel, a card value spilling out of its card; and nothing once fixed."""
    from whatif.dashboard.browser import clipped_text
    from whatif.dashboard.layout import CSS

    page = tmp_path / "broken.html"
    page.write_text(BROKEN_PAGE.format(css=CSS))
    browser.get(page.as_uri())
    problems = clipped_text(browser)
    assert any(p.startswith('clipped: td "void at::native::vectorized') for p in problems), problems
    assert any(p.startswith("wider than its box (scrolls sideways): div") for p in problems), problems
    assert any(p.startswith('overflows its box: div "123,456,789.000 ms"') for p in problems), problems
    fixed = BROKEN_PAGE.replace("width: 90px; overflow: hidden", "").replace('style="width: 320px"', "")
    page.write_text(fixed.replace("max-width: 120px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap",
                                  "").format(css=CSS))
    browser.get(page.as_uri())
    assert clipped_text(browser) == []


# the drawn critical path: node labels' size on screen, rows (y, x of each node), highlighted nodes
PATH_DRAWN = """
const c = window.cy, nodes = c.nodes();
return {zoom: c.zoom(), n: nodes.length, slow: nodes.filter('.slow').length,
        rows: nodes.map(n => [Math.round(n.position('y')), Math.round(n.position('x'))]),
        inside: nodes.every(n => { const b = n.renderedBoundingBox({includeLabels: true});
                                   return b.x1 >= 0 && b.x2 <= c.width() && b.y1 >= 0 && b.y2 <= c.height(); })};"""


@pytest.mark.parametrize("label", _runs())
def test_graph_opens_on_the_slowest_steady_step(server: Any, browser: Any, shots: Path, label: str) -> None:
    """The Graph page opens on the critical path of the slowest step that counts (not the warm-up
    ProfilerStep#0), drawn left to right in rows that fit the panel, labels at least 10 px, the
    slowest segments highlighted."""
    from whatif.dashboard.derive import PATH_COLUMNS, PATH_NODES, SLOWEST, slowest_steady_step
    from whatif.dashboard.pages.graph import FONT_PX

    if not any(label in r.label for r in server.store.runs.values()):
        pytest.skip(f"needs ../shared/traces/{QWEN}")
    rid = _run_id(server, label)
    steps = server.store.get(rid).analysis.steps
    row = slowest_steady_step(steps)
    assert row is not None and bool(steps["included"].iat[row])
    assert steps["measured_ns"].iat[row] == steps[steps["included"]]["measured_ns"].max()
    browser.get(f"{server.url}/graph?run={rid}")
    _wait(browser, lambda b: "critical path of" in _text(b, "gr-info") and _idle(b))
    _no_error(browser)
    assert _text(browser, "gr-info").startswith(f"critical path of step {steps['step'].iat[row]}: ")
    drawn = browser.execute_script(PATH_DRAWN)
    assert 1 < drawn["n"] <= PATH_NODES and drawn["slow"] == min(SLOWEST, drawn["n"])
    assert drawn["zoom"] * FONT_PX >= 10, drawn["zoom"]       # labels readable
    assert drawn["inside"]                                     # sized to fit: every node and label on screen
    rows = drawn["rows"]
    for i in range(1, len(rows)):                              # left to right, then the next row
        same_row = i % PATH_COLUMNS != 0
        (y0, x0), (y1, x1) = rows[i - 1], rows[i]
        assert (y1 == y0 and x1 > x0) if same_row else y1 > y0
    browser.save_screenshot(str(shots / f"dashboard-graph-{label}.png"))


def test_working_state_while_a_trace_is_analysed(server: Any, browser: Any, shots: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A run nobody analysed yet: the Overview shows "working" at once (the analysis runs in a job,
    held here on an event) and the page once the job is done, without a reload."""
    import threading

    from whatif.dashboard import state

    gate, analyze = threading.Event(), state.analyze

    def held(path: Any) -> Any:
        gate.wait()
        return analyze(path)

    monkeypatch.setattr(state, "analyze", held)
    run = server.store.add_path(SAMPLE.parent / "dit_serve")[0]
    assert not run.loaded
    browser.get(f"{server.url}/overview?run={run.id}")
    try:
        _wait(browser, lambda b: "working: analysing sample_traces/dit_serve" in _text(b, "ov-body"))
        browser.save_screenshot(str(shots / "dashboard-working.png"))
    finally:
        gate.set()
    _wait(browser, lambda b: _text(b, "ov-tasks") and _idle(b))
    assert _text(browser, "ov-tasks") == f"{run.analysis.graph.num_tasks:,}"
    _no_error(browser)


OTHER_RUN = SAMPLE.parent / "gpu" / "pairs" / "p1_precision-before-r1"
"""A second run to switch to (a GPU trace inside the sample folder, so the store allows it)."""


BUILDER_PROMPT = "Add a transform and press Predict."
"""What the What-if prediction panel shows until Predict is pressed for the scenario on screen."""


def _other_run(server: Any) -> Any:
    return server.store.add_path(OTHER_RUN)[0]


def _menu(browser: Any) -> str:
    """The run the menu shows."""
    return _text(browser, "run")


def _pick_run(browser: Any, label: str) -> None:
    """Choose ``label`` in the run menu, as a user does."""
    from selenium.webdriver.common.by import By

    _click(browser, "run")
    option = _wait(browser, lambda b: next((o for o in b.find_elements(By.CSS_SELECTOR, "[role=option]")
                                             if o.text == label), None))
    option.click()
    _wait(browser, lambda b: _menu(b) == label)


def test_the_run_menu_writes_the_address(server: Any, browser: Any) -> None:
    """A run chosen in the menu goes to the address's ?run= (and the navigation links), so a reload
    shows it: the stale ?run= of the page first opened used to win."""
    from selenium.webdriver.common.by import By

    first, other = server.store.get(_run_id(server, "llm_serve")), _other_run(server)
    browser.get(f"{server.url}/overview?run={first.id}")
    _wait(browser, lambda b: _text(b, "ov-tasks") == f"{first.analysis.graph.num_tasks:,}")
    _pick_run(browser, other.label)
    _wait(browser, lambda b: f"run={other.id}" in b.current_url)
    assert browser.current_url.startswith(f"{server.url}/overview?")
    assert browser.find_element(By.ID, "nav-timeline").get_attribute("href").endswith(f"/timeline?run={other.id}")
    browser.refresh()
    _wait(browser, lambda b: _text(b, "ov-tasks") == f"{other.analysis.graph.num_tasks:,}" and _settled(b))
    assert _menu(browser) == other.label and f"run={other.id}" in browser.current_url
    _no_error(browser)


def test_a_run_switch_empties_the_results(server: Any, browser: Any) -> None:
    """What-if, Compare and Suggest results of one run are gone once another is chosen (they stayed
    under the new run's name)."""
    from selenium.webdriver.common.by import By

    first, other = server.store.get(_run_id(server, "llm_serve")), _other_run(server)
    browser.get(f"{server.url}/whatif?run={first.id}")
    _wait(browser, lambda b: b.find_elements(By.XPATH, _param_xpath("factor")))
    _predict(browser, "aten faster", "0.5", "aten::")
    _wait(browser, lambda b: b.find_elements(By.ID, "wb-cp-compare") and _settled(b))
    _pick_run(browser, other.label)
    _wait(browser, lambda b: _text(b, "wb-result") == BUILDER_PROMPT and _settled(b))
    assert not browser.find_elements(By.ID, "wb-speedup") and not browser.find_elements(By.ID, "wb-cp-compare")

    first.scenarios["half cpu"] = {"name": "half cpu", "transform": [
        {"name": "scale", "factor": 0.5, "select": {"kind": "cpu"}}]}
    browser.get(f"{server.url}/compare?run={first.id}")
    _wait(browser, lambda b: "half cpu" in _text(b, "cmp-scenarios") and _settled(b))
    _click(browser, "cmp-run")
    _wait(browser, lambda b: b.find_elements(By.ID, "cmp-table") and b.find_elements(By.ID, "cmp-serving-table"))
    _pick_run(browser, other.label)
    _wait(browser, lambda b: _settled(b) and not _text(b, "cmp-body") and not _text(b, "cmp-serving-body"))
    assert _text(browser, "cmp-scenarios") == ""

    browser.get(f"{server.url}/suggest?run={first.id}")
    _wait(browser, lambda b: b.find_elements(By.ID, "sg-run") and _settled(b))
    _click(browser, "sg-run")
    _wait(browser, lambda b: _text(b, "sg-best"))
    _pick_run(browser, other.label)
    _wait(browser, lambda b: _idle(b) and not _text(b, "sg-body"))
    _no_error(browser)


def test_builder_errors_replace_what_they_invalidate(server: Any, browser: Any) -> None:
    """A factor of -1 is refused naming the field (it was added as a x1.0 no-op); an error goes once
    its cause is fixed; Clear then Predict leaves the error alone, not the old prediction and note."""
    from selenium.webdriver.common.by import By

    browser.get(f"{server.url}/whatif?run={_run_id(server, 'llm_serve')}")
    _wait(browser, lambda b: b.find_elements(By.XPATH, _param_xpath("factor")))
    _type(_param(browser, "factor"), "-1")
    _click(browser, "wb-add")
    _wait(browser, lambda b: "scale.factor: must be a finite number >= 0, got -1.0" in _text(b, "wb-spec-error"))
    assert _text(browser, "wb-toml") == "(no transforms yet)"
    _click(browser, "wb-predict")
    _wait(browser, lambda b: "no transforms" in _text(b, "wb-error"))
    _type(_param(browser, "factor"), "0.5")
    _click(browser, "wb-add")
    _wait(browser, lambda b: "factor = 0.5" in _text(b, "wb-toml") and _settled(b))
    assert _text(browser, "wb-spec-error") == "" and _text(browser, "wb-error") == ""
    _click(browser, "wb-predict")
    _wait(browser, lambda b: b.find_elements(By.ID, "wb-cp-compare") and _settled(b))
    _click(browser, "wb-save")
    _wait(browser, lambda b: "saved" in _text(b, "wb-saved"))
    _click(browser, "wb-clear")
    _wait(browser, lambda b: _text(b, "wb-result") == BUILDER_PROMPT and _settled(b))
    assert _text(browser, "wb-saved") == "" and not browser.find_elements(By.ID, "wb-cp-compare")
    _click(browser, "wb-predict")
    _wait(browser, lambda b: "no transforms" in _text(b, "wb-error") and _settled(b))
    assert _text(browser, "wb-result") == "" and not browser.find_elements(By.ID, "wb-speedup")


def test_graph_says_a_missing_task_once(server: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server.url}/graph?run={_run_id(server, 'llm_serve')}&task=15605")
    _wait(browser, lambda b: "tasks within" in _text(b, "gr-info") and _idle(b))
    _type(browser.find_element(By.ID, "gr-task"), "999999")
    _wait(browser, lambda b: _settled(b) and "task 999999 does not exist" in _text(b, "gr-error"))
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".error")] == [_text(browser, "gr-error")]
    assert _text(browser, "gr-info") == "" and browser.execute_script("return window.cy.nodes().length") == 0
