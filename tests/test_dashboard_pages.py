"""Dashboard pages are discovered: each module of whatif.dashboard.pages declares PAGE, the app
registers them in order and the navigation bar lists them; a page added as one more module (here
from a temporary folder put on the package's path) is served like the built-in ones."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

dash = pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
pytest.importorskip("dash_cytoscape", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")

import whatif.dashboard.pages as pages_pkg  # noqa: E402
from whatif.dashboard.app import create_app  # noqa: E402
from whatif.dashboard.layout import COUNT_ALL  # noqa: E402
from whatif.dashboard.pages import Page, discover_pages  # noqa: E402
from whatif.dashboard.state import get_store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"
BUILT_IN = [("/", "Runs", "nav-runs"), ("/overview", "Overview", "nav-overview"),
            ("/timeline", "Timeline", "nav-timeline"),
            ("/ops", "Ops", "nav-ops"), ("/breakdown", "Breakdown", "nav-breakdown"),
            ("/memory", "Memory", "nav-memory"), ("/suggest", "Suggest", "nav-suggest"),
            ("/collectives", "Collectives", "nav-collectives"),
            ("/whatif", "What-if", "nav-whatif"),
            ("/compare", "Compare", "nav-compare"), ("/graph", "Graph", "nav-graph")]

TOY_PAGE = '''
from typing import Any

import dash
from dash import Input, Output, html

from whatif.dashboard.pages import Page
from whatif.dashboard.state import get_store


def layout(**_: Any) -> html.Div:
    return html.Div([html.H2("Steps"), html.Div(id="toy-steps")])


def register(app: dash.Dash) -> None:
    @app.callback(Output("toy-steps", "children"), Input("run", "value"))
    def steps(run_id: str | None) -> str:
        if not run_id:
            raise dash.exceptions.PreventUpdate
        return f"{len(get_store().get(run_id).analysis.steps)} steps"


PAGE = Page(path="/toy-steps", title="Steps", order=ORDER, layout=layout, register_callbacks=register)
'''


def toy_page(order: int) -> str:
    return TOY_PAGE.replace("ORDER", str(order))


def nav_links(app: dash.Dash) -> list[tuple[str, str, str]]:
    """(href, text, id) of each link of the navigation bar, in order."""
    nav = app.layout().children[0].children
    return [(c.href, c.children, c.id) for c in nav if isinstance(c, dash.dcc.Link)]


@pytest.fixture
def extra_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on the pages package's path: a module written there is one more page module."""
    folder = tmp_path / "more_pages"
    folder.mkdir()
    monkeypatch.setattr(pages_pkg, "__path__", [*pages_pkg.__path__, str(folder)])
    before = set(dash.page_registry)
    yield folder
    for key in set(dash.page_registry) - before:
        del dash.page_registry[key]
    for name in [m for m in sys.modules if m.startswith("whatif.dashboard.pages.toy")]:
        del sys.modules[name]


def test_built_in_pages_are_discovered_in_order() -> None:
    found = discover_pages()
    assert [(p.path, p.title, p.nav_id) for p in found] == BUILT_IN
    assert [p.order for p in found] == sorted(p.order for p in found)
    assert all(p.module == f"whatif.dashboard.pages.{m}" for p, m in
               zip(found, ["runs", "overview", "timeline", "ops", "breakdown", "memory", "suggest", "collectives",
                             "builder", "compare", "graph"]))
    app = create_app([SAMPLE])
    assert nav_links(app) == [(path, title, nav) for path, title, nav in BUILT_IN]
    registered = {p["module"]: p for p in dash.page_registry.values()}
    for p in found:
        entry = registered[p.module]
        assert (entry["path"], entry["name"], entry["title"]) == (p.path, p.title, f"whatif · {p.title}")


def test_a_page_added_as_one_module_is_served(extra_pages: Path) -> None:
    (extra_pages / "toy_steps.py").write_text(toy_page(25))  # between Timeline and What-if
    app = create_app([SAMPLE])
    titles = [t for _, t, _ in nav_links(app)]
    assert titles == ["Runs", "Overview", "Timeline", "Ops", "Steps", "Breakdown", "Memory", "Suggest",
                      "Collectives", "What-if", "Compare", "Graph"]
    assert ("/toy-steps", "Steps", "nav-steps") in nav_links(app)
    assert dash.page_registry["whatif.dashboard.pages.toy_steps"]["title"] == "whatif · Steps"
    run_id = next(iter(app.layout().children[0].children[-1].options))["value"]
    body = {"output": "toy-steps.children", "outputs": {"id": "toy-steps", "property": "children"},
            "inputs": [{"id": "run", "property": "value", "value": run_id}], "changedPropIds": ["run.value"]}
    r = app.server.test_client().post("/_dash-update-component", json=body)
    assert r.status_code == 200
    steps = len(get_store().get(run_id).analysis.steps)
    assert steps > 1 and json.loads(r.data)["response"]["toy-steps"]["children"] == f"{steps} steps"


def test_page_modules_must_declare_one_page_each(extra_pages: Path) -> None:
    def only(name: str, text: str) -> None:  # a fresh module name each time: no stale import
        for p in extra_pages.glob("toy_*.py"):
            p.unlink()
        (extra_pages / f"{name}.py").write_text(text)

    only("toy_nopage", "X = 1\n")
    with pytest.raises(TypeError, match=r"^whatif.dashboard.pages.toy_nopage: a page module must declare PAGE"):
        discover_pages()
    only("toy_path", toy_page(90).replace('"/toy-steps"', '"/graph"'))
    with pytest.raises(ValueError, match=r"^whatif.dashboard.pages.toy_path: path '/graph' is taken by "
                                         r"whatif.dashboard.pages.graph$"):
        discover_pages()
    only("toy_order", toy_page(50))
    with pytest.raises(ValueError, match=r"toy_order: order 50 is taken by whatif.dashboard.pages.graph$"):
        discover_pages()
    (extra_pages / "_toy_helper.py").write_text("raise RuntimeError('a _module is not a page')\n")
    only("toy_fine", toy_page(60))
    assert [p.title for p in discover_pages()] == [t for _, t, _ in BUILT_IN] + ["Steps"]


def test_nav_id_from_title() -> None:
    page = Page(path="/x", title="Foo-bar", order=1, layout=lambda **_: None, register_callbacks=lambda app: None)
    assert page.nav_id == "nav-foobar" and page.module == ""


def _ids(component: object, found: set[str]) -> set[str]:
    """The string ids of ``component`` and everything inside it."""
    if isinstance(component, (list, tuple)):
        for c in component:
            _ids(c, found)
    elif isinstance(component, dash.development.base_component.Component):
        if isinstance(getattr(component, "id", None), str):
            found.add(component.id)
        _ids(getattr(component, "children", None), found)
    return found


def test_every_callback_input_is_laid_out() -> None:
    """Each callback's inputs and states are components of the shell or of a page's layout (a
    misnamed one leaves the callback silently never firing in the browser)."""
    app = create_app([SAMPLE])
    laid_out = _ids(app.layout(), set())
    for page in discover_pages():
        _ids(page.layout(), laid_out)
    wanted = {d["id"] for cb in app.callback_map.values() for d in [*cb["inputs"], *cb.get("state", [])]
              if not d["id"].startswith("{")}  # pattern-matching ids are JSON objects
    assert {"ov-ready", "tl-ready", "run", COUNT_ALL} <= wanted
    assert wanted - laid_out == set()
