"""Dashboard render times through headless Chromium (docs/dashboard.md).

A 100 k-task run is made by repeating the bundled LLM sample (tracer/repeat.py) and served
in-process; selenium drives Debian's chromium. Measured:

* timeline, first full render: navigate to /timeline until the figure of both panels is drawn
  (the server has the analysis; building lanes and bins is part of the time), and the same
  after the first (cached timelines);
* zoom to exact slices: a relayout until the exact WebGL segments are drawn;
* what-if update: change a parameter and press Predict until the speedup is shown, then until
  the new critical path is drawn.

Usage: python bench/dashboard.py [--copies 4] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from selenium.webdriver.common.keys import Keys

from whatif.api import Analysis
from whatif.dashboard.app import create_app
from whatif.dashboard.browser import chrome, find_browser
from whatif.dashboard.serve import serve_in_background
from whatif.dashboard.state import RunStore
from whatif.depgraph.build import build_graph
from whatif.predictors.replay import replay
from whatif.tracer.repeat import repeat_trace
from whatif.tracer.trace import load_trace

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve"


def _until(browser, cond, timeout: float = 120.0) -> float:
    t = time.perf_counter()
    while time.perf_counter() - t < timeout:
        if browser.execute_script(cond):
            return time.perf_counter() - t
        time.sleep(0.02)
    info = browser.execute_script("const i = document.getElementById('tl-info'); return i && i.textContent;")
    raise TimeoutError(f"{cond}\n(tl-info: {info})")


DRAWN = """const info = document.getElementById('tl-info');
const gd = document.querySelector('#tl-graph .js-plotly-plot');
return !!(info && info.textContent.includes('%s') && gd && gd.data && gd.data.length >= 2
          && gd.querySelector('.heatmaplayer, canvas'));"""


# a zoom reaches the server once dcc.Graph listens to plotly's relayout events
LISTENING = """const gd = document.querySelector('#tl-graph .js-plotly-plot');
return !!(gd && gd._ev && gd._ev.listeners('plotly_relayout').length);"""


def main() -> None:  # noqa: C901 - a straight script
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    why = find_browser()[2]
    if why:
        raise SystemExit(f"bench/dashboard.py {why}")
    t = time.perf_counter()
    trace = repeat_trace(load_trace(SAMPLE), args.copies)
    graph = build_graph(trace)
    analysis = Analysis(trace=trace, graph=graph, replay=replay(graph))
    build_s = time.perf_counter() - t
    store = RunStore([])
    run = store.add_analysis(f"llm_serve x{args.copies}", analysis)
    bg = serve_in_background(create_app(store=store))
    browser = chrome()
    results: dict[str, list[float]] = {"timeline_first": [], "timeline_cached": [], "zoom_exact": [],
                                       "whatif_speedup": [], "whatif_critical_path": []}
    try:
        for _ in range(args.repeat):
            run.cache.clear()
            for key in ("timeline_first", "timeline_cached"):
                browser.get("about:blank")
                t = time.perf_counter()
                browser.get(f"{bg.url}/timeline?run={run.id}")
                _until(browser, DRAWN % "(bins)")
                results[key].append(time.perf_counter() - t)
            _until(browser, LISTENING)
            t = time.perf_counter()
            browser.execute_script("""const gd = document.querySelector('#tl-graph .js-plotly-plot');
                const r = gd._fullLayout.xaxis.range; Plotly.relayout(gd, {'xaxis.range': [r[0] + (r[1] - r[0]) * 0.3,
                r[0] + (r[1] - r[0]) * 0.3025]});""")
            _until(browser, DRAWN % "(exact)")
            results["zoom_exact"].append(time.perf_counter() - t)
        browser.get(f"{bg.url}/whatif?run={run.id}")
        factor_id = json.dumps({"name": "factor", "type": "wb-param"}, separators=(",", ":"))
        _until(browser, f"return !!document.getElementById('{factor_id}')")
        for i in range(args.repeat):
            factor = round(0.5 + 0.1 * i, 1)  # a new scenario each time: nothing cached
            el = browser.find_element("xpath", f"//*[@id='{factor_id}']")
            el.send_keys(Keys.CONTROL, "a")
            el.send_keys(Keys.DELETE)
            el.send_keys(str(factor), Keys.TAB)
            name = browser.find_element("id", "wb-name")
            name.send_keys(Keys.CONTROL, "a")
            name.send_keys(Keys.DELETE)
            name.send_keys(f"bench {factor}", Keys.TAB)
            browser.find_element("id", "wb-clear").click()
            time.sleep(0.3)
            browser.find_element("id", "wb-add").click()
            _until(browser, f"return document.getElementById('wb-toml').textContent.includes('factor = {factor}')")
            t = time.perf_counter()
            browser.find_element("id", "wb-predict").click()
            _until(browser, f"""const s = document.getElementById('wb-waterfall');
                return !!(s && s.textContent.includes('factor={factor}'));""")
            results["whatif_speedup"].append(time.perf_counter() - t)
            _until(browser, f"""const s = document.querySelector('#wb-cp-steps .js-plotly-plot');
                return !!(s && s.layout
                          && String(s.layout.title.text || s.layout.title).includes('bench {factor}'));""")
            results["whatif_critical_path"].append(time.perf_counter() - t)
    finally:
        browser.quit()
        bg.stop()
    print(f"run: {graph.num_tasks:,} tasks, {len(analysis.steps)} steps (llm_serve x{args.copies}); "
          f"trace+graph+replay built in {build_s:.2f} s before serving")
    for key, vals in results.items():
        print(f"{key:22s} median {statistics.median(vals):6.2f} s   (runs: {', '.join(f'{v:.2f}' for v in vals)})")


if __name__ == "__main__":
    main()
