"""The dashboard's pages: each module of this package declares itself with a module-level
``PAGE = Page(...)`` (address, title, place in the navigation, layout, callbacks), and the app
finds them with :func:`discover_pages`, so adding a page is adding one module here (see
docs/extending.md).
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Page:
    """One page: ``layout(**query)`` builds it (query-string values as keyword arguments);
    ``register_callbacks(app)`` adds its callbacks once; ``order`` places it in the navigation bar.
    ``module`` is filled in by :func:`discover_pages`."""

    path: str
    title: str
    order: int
    layout: Callable[..., Any]
    register_callbacks: Callable[[Any], None]
    module: str = ""

    @property
    def nav_id(self) -> str:
        """Id of its navigation link: ``nav-whatif`` for the page titled "What-if"."""
        return f"nav-{self.title.lower().replace('-', '')}"


def discover_pages(package: str = __name__) -> list[Page]:
    """The ``PAGE`` of every module of ``package`` (modules named ``_…`` are skipped), sorted by
    ``order``. A module without a ``PAGE``, or two pages with one address or one order, are errors."""
    pkg = importlib.import_module(package)
    pages: list[Page] = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        page = vars(module).get("PAGE")
        if not isinstance(page, Page):
            raise TypeError(f"{module.__name__}: a page module must declare PAGE = Page(path=..., title=..., "
                            "order=..., layout=..., register_callbacks=...)")
        pages.append(dataclasses.replace(page, module=module.__name__))
    _unique(pages, "path", lambda p: p.path)
    _unique(pages, "order", lambda p: p.order)
    return sorted(pages, key=lambda p: p.order)


def _unique(pages: list[Page], what: str, key: Callable[[Page], Any]) -> None:
    seen: dict[Any, str] = {}
    for p in pages:
        if key(p) in seen:
            raise ValueError(f"{p.module}: {what} {key(p)!r} is taken by {seen[key(p)]}")
        seen[key(p)] = p.module
