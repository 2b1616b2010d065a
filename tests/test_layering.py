"""Data flows one way: core -> hardware -> tracer -> depgraph -> transforms -> predictors -> front door /
dashboard. No folder imports one to its right (checked on the source, imports inside functions included)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = {"core": 0, "hardware": 1, "tracer": 2, "depgraph": 3, "transforms": 4, "predictors": 5, "dashboard": 6}
FRONT_DOOR = 6  # whatif.api, whatif.summary, whatif.report… sit with the dashboard at the end


def rank_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "whatif" or len(parts) < 2:
        return None
    return ORDER.get(parts[1], FRONT_DOOR)


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("folder", [f for f in ORDER if f != "dashboard"])
def test_no_folder_imports_one_to_its_right(folder: str) -> None:
    own = ORDER[folder]
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {mod}"
           for path in sorted((ROOT / folder).rglob("*.py"))
           for line, mod in imports(path)
           if (r := rank_of(mod)) is not None and r > own]
    assert not bad, "\n".join(bad)
