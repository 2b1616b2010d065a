"""Every example of docs/extending.md runs: the ```python blocks of each section in order, in one
namespace per section, in a temporary folder that links sample_traces/. A block whose first line
is ``# dashboard/pages/NAME.py`` is a page module: it is written to a folder on the pages
package's path and served by the app. Every registry the examples add to is restored afterwards."""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from whatif.predictors.cost_models import COST_MODELS
from whatif.predictors.serving import POLICIES, ROUTERS, engines
from whatif.tracer import readers
from whatif.transforms import registry

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
PAGE_FILE = re.compile(r"^# dashboard/pages/(\w+)\.py\n")


def sections(text: str) -> dict[str, list[str]]:
    """The ```python blocks under each ``## `` heading."""
    out: dict[str, list[str]] = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = re.findall(r"^```python\n(.*?)^```", body, flags=re.S | re.M)
    return out


SECTIONS = sections(DOC.read_text())


@pytest.fixture
def restored_registries() -> Iterator[None]:
    registry.names()
    readers.suffixes()
    POLICIES.names()
    ROUTERS.names()
    COST_MODELS.names()
    engines.adapters()
    live_registries = (registry._REGISTRY, readers._READERS, POLICIES._classes, ROUTERS._classes, COST_MODELS._classes,
                       engines._REGISTRY)
    saved = tuple(dict(live) for live in live_registries)
    try:
        yield
    finally:
        for live, before in zip(live_registries, saved):
            live.clear()
            live.update(before)


def test_every_extension_point_has_a_section() -> None:
    assert list(SECTIONS) == ["A trace reader", "A dashboard page", "A serving policy or router", "A serving engine",
                              "An edge rule", "A transform", "A cost model"]
    assert all(SECTIONS.values())
    readme = (ROOT / "README.md").read_text()
    assert "docs/extending.md" in readme


@pytest.mark.parametrize("title", list(SECTIONS))
def test_section_examples_run(title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              restored_registries: None, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sample_traces").symlink_to(ROOT / "sample_traces")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    pages = []
    for i, code in enumerate(SECTIONS[title]):
        page = PAGE_FILE.match(code)
        if page:
            pages.append((page.group(1), code))
            continue
        try:
            exec(compile(code, f"{DOC}:{title}:block{i + 1}", "exec", dont_inherit=True), namespace)  # noqa: S102 - our own docs
        except Exception as exc:  # pragma: no cover - the message names the block
            raise AssertionError(f"docs/extending.md, {title}, python block {i + 1} failed: {exc!r}\n{code}") from exc
    if pages:
        serve_pages(pages, tmp_path, monkeypatch)
    out = capsys.readouterr().out
    if title == "A trace reader":
        assert "*.json, *.json.gz, *.events.csv" in out and readers.accepted().endswith("*.events.csv")
    if title == "A serving policy or router":
        assert re.search(r"^vllm: TTFT mean \d+ ms", out, re.M) and re.search(r"^sjf: TTFT mean \d+ ms", out, re.M)
    if title == "A serving engine":
        assert "toyserve: prefill LLMBatch(prefill_tokens=(24, 24), prefill_cached=(0, 0), decode_context=())" in out
        assert "toyserve: decode LLMBatch(prefill_tokens=(), prefill_cached=(), decode_context=(25, 25))" in out
    if title == "An edge rule":
        assert "without the fence: step 1 begins 0 us later" in out
        assert "with the fence: step 1 begins 60 us later" in out
    if title == "A transform":
        speedup = float(re.search(r"CPU twice as fast: ([\d.]+)x", out).group(1))
        assert speedup > 1.0 and "must be one of cpu, gpu" in out
    if title == "A cost model":
        trace, peak = (float(x.replace(",", "")) for x in re.findall(r"in ([\d,]+) us$", out, re.M))
        assert peak < trace and "--cost-model {trace,datasheet,link_peak}" in out


def serve_pages(pages: list[tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the page modules on the pages package's path and check the app serves them."""
    dash = pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
    pytest.importorskip("dash_cytoscape", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
    import whatif.dashboard.pages as pages_pkg
    from whatif.dashboard.app import create_app
    from whatif.dashboard.state import get_store

    folder = tmp_path / "pages"
    folder.mkdir()
    for name, code in pages:
        (folder / f"{name}.py").write_text(code)
    monkeypatch.setattr(pages_pkg, "__path__", [*pages_pkg.__path__, str(folder)])
    before = set(dash.page_registry)
    try:
        app = create_app([ROOT / "sample_traces" / "llm_serve"])
        nav = app.layout().children[0].children
        assert [c.children for c in nav if isinstance(c, dash.dcc.Link)][-1] == "Steps"
        run_id = nav[-1].options[0]["value"]
        body = {"output": "..steps-count.children...steps-error.children..",
                "outputs": [{"id": "steps-count", "property": "children"},
                            {"id": "steps-error", "property": "children"}],
                "inputs": [{"id": "run", "property": "value", "value": run_id}], "changedPropIds": ["run.value"]}
        r = app.server.test_client().post("/_dash-update-component", json=body)
        assert r.status_code == 200
        shown = json.loads(r.data)["response"]["steps-count"]["children"]
        assert shown.startswith(f"{len(get_store().get(run_id).analysis.steps)} steps, ")
    finally:
        for key in set(dash.page_registry) - before:
            del dash.page_registry[key]
        for name, _ in pages:
            sys.modules.pop(f"whatif.dashboard.pages.{name}", None)
