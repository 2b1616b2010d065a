"""Each domain fact has one home, only the primitives write a graph's tables, and no module
imports another that imports it back (checked on the source with ``ast``)."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"core": "core", "hardware": "hardware", "tracer": "tracer", "depgraph": "depgraph",
           "transforms": "transforms", "predictors": "predictors", "dashboard": "dashboard", "whatif": "whatif"}


def sources() -> Iterator[tuple[str, ast.Module]]:
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            yield rel, ast.parse(path.read_text(), rel)


def module_name(rel: str) -> str:
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "whatif" else ["whatif", *parts])


def docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (prose may name anything)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                        and isinstance(stmt.value.value, str):
                    out.add(id(stmt.value))
    return out


def strings(tree: ast.Module) -> Iterator[ast.Constant]:
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node


def members(node: ast.AST, enum: str, names: set[str]) -> set[str]:
    """Members of ``enum`` named by the elements of a set/tuple/list literal (``int(X.Y)`` too)."""
    if not isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return set()
    found = set()
    for elt in node.elts:
        if isinstance(elt, ast.Call) and elt.args:
            elt = elt.args[0]
        if isinstance(elt, ast.Attribute) and isinstance(elt.value, ast.Name) and elt.value.id == enum \
                and elt.attr in names:
            found.add(elt.attr)
    return found


# (fact, its home, a check of one AST node that returns a problem or None)
GPU_TASKS = {"KERNEL", "MEMCPY", "MEMSET", "COMM"}
GPU_EVENTS = {"KERNEL", "MEMCPY", "MEMSET"}
DTYPE_SPELLINGS = {"bf16", "fp16", "fp32", "bfloat16", "float16", "half", "float", "c10::half", "c10::bfloat16",
                   "float32", "int8", "fp8"}
COLLECTIVE = re.compile(r"^(nccl|rccl)$|nccl\||rccl\||all_\?reduce|cross_device_reduce|multimem")
ATTENTION = re.compile(r"fmha|flash_fwd|flash_attn|scaled_dot_product\||sdpa\|")
SUFFIX = re.compile(r"^\.json\.gz$|^\.pt\.trace")
OP_LAYOUT = re.compile(r"^_?(flash_attention|efficient_attention|flash_attn)_\w+$|^paged_attention_v\d$|"
                       r"^_scaled_dot_product_\w+_attention(_backward)?$|^_(scaled_)?grouped_mm$")


def gpu_task_set(node: ast.AST) -> str | None:
    return "a set of GPU task kinds (use GPU_WORK_KINDS / LOCAL_GPU_WORK_KINDS)" \
        if len(members(node, "TaskKind", GPU_TASKS)) >= 2 else None


def gpu_event_set(node: ast.AST) -> str | None:
    return "a set of GPU event kinds (use GPU_ACTIVITY_KINDS)" \
        if len(members(node, "EventKind", GPU_EVENTS)) >= 2 else None


def dtype_table(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Dict):
        return None
    keys = {k.value.lower() for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    numeric = all(isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) for v in node.values)
    return "a dtype table (use whatif.core.dtypes)" if len(keys & DTYPE_SPELLINGS) >= 2 and numeric else None


def pattern(regex: re.Pattern[str], what: str):
    def check(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and regex.search(node.value.lower()):
            return f"{what} ({node.value[:40]!r})"
        return None
    return check


FACTS = [
    ("GPU-work task kinds", {"depgraph/graph.py"}, gpu_task_set),
    ("GPU event kinds", {"tracer/kinds.py"}, gpu_event_set),
    ("dtype sizes", {"core/dtypes.py"}, dtype_table),
    ("collective kernels", {"core/kernels.py"}, pattern(COLLECTIVE, "a collective-kernel rule")),
    ("attention kernels", {"core/kernels.py"}, pattern(ATTENTION, "an attention-kernel rule")),
    # FLOPs and bytes from shapes: op_flops_bytes (whatif ops, the cost models, the transforms)
    ("attention / grouped-GEMM argument layouts", {"core/kernels.py"}, pattern(OP_LAYOUT, "an op's argument layout")),
    # the reader registry asks KinetoReader.suffixes; the recorder names the files it writes as
    # PyTorch's profiler does (rank<k>.pt.trace.json.gz), which that reader accepts
    ("trace suffixes", {"tracer/kineto.py", "tracer/record/trace_file.py"}, pattern(SUFFIX, "a trace suffix")),
]


@pytest.mark.parametrize("fact,home,check", FACTS, ids=[f[0] for f in FACTS])
def test_each_domain_fact_is_defined_in_its_home_only(fact: str, home: set[str], check) -> None:
    bad = []
    for rel, tree in sources():
        if rel in home:
            continue
        nodes = strings(tree) if check.__name__ == "check" else ast.walk(tree)
        bad += [f"{rel}:{node.lineno}: {problem}" for node in nodes if (problem := check(node))]
    assert not bad, f"{fact} are defined in {', '.join(sorted(home))}; found elsewhere:\n" + "\n".join(bad)


@pytest.mark.parametrize("fact,home,check", FACTS, ids=[f[0] for f in FACTS])
def test_the_fact_check_finds_a_copy(fact: str, home: set[str], check) -> None:
    """The check is real: the home itself holds what it looks for."""
    found = False
    for rel, tree in sources():
        if rel in home:
            nodes = strings(tree) if check.__name__ == "check" else ast.walk(tree)
            found = found or any(check(node) for node in nodes)
    assert found, f"the check for {fact} finds nothing even in its home {home}"


TABLES = {"tasks", "edges", "resources", "steps"}
WRITERS = {"transforms/edit.py"}   # the primitives; the builder (depgraph/) makes the tables
GRAPH_EDITORS = {"transforms", "predictors", "whatif", "dashboard"}   # folders that receive built graphs


def table_writes(tree: ast.Module) -> Iterator[tuple[int, str]]:
    def is_table(node: ast.AST) -> bool:
        # graph.tasks, graph.tasks.loc, graph.tasks[...], graph.tasks.loc[...]
        while isinstance(node, (ast.Subscript, ast.Attribute)) and not (
                isinstance(node, ast.Attribute) and node.attr in TABLES):
            node = node.value
        return isinstance(node, ast.Attribute) and node.attr in TABLES

    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)) and is_table(target):
                yield node.lineno, ast.unparse(target)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append" \
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "changes":
            yield node.lineno, ast.unparse(node.func)


def test_only_the_primitives_write_graph_tables() -> None:
    bad = [f"{rel}:{line}: writes {what}"
           for rel, tree in sources()
           if rel not in WRITERS and rel.split("/")[0] in GRAPH_EDITORS
           for line, what in table_writes(tree)]
    assert not bad, "graph edits go through whatif.transforms.edit:\n" + "\n".join(bad)


def test_the_table_check_sees_a_write() -> None:
    tree = ast.parse("out.tasks.loc[ids, 'dur_ns'] = 0\ng.edges = e\ng.changes.append(c)\nx = g.tasks")
    assert [w for _, w in table_writes(tree)] == ["out.tasks.loc[ids, 'dur_ns']", "g.edges", "g.changes.append"]


SCRIPT_FOLDERS = ("bench", "examples", "tests", "tools")
"""Run with their own folder first on ``sys.path``: ``tracegen`` is ``tests/tracegen.py``."""


def script_sources() -> Iterator[tuple[str, str, ast.Module]]:
    """(folder, module name within the folder, tree) of every script and test."""
    for folder in SCRIPT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield folder, ".".join(parts), ast.parse(path.read_text(), str(path))


def imported(tree: ast.Module, package: str) -> Iterator[str]:
    """Every module name ``tree`` imports (``from x import y`` also as ``x.y``), relative ones resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                yield f"{base}.{a.name}"
                yield base
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def import_graph() -> nx.DiGraph:
    """Module -> module it imports, over the packages (``whatif.*``) and the scripts and tests
    (``<folder>/<module>``)."""
    g = nx.DiGraph()
    mods = {module_name(rel): (rel, tree) for rel, tree in sources()}

    def resolve(name: str, local: set[str], folder: str) -> str | None:
        t = name
        while t and t not in local and t not in mods:
            t = t.rpartition(".")[0]
        if not t or t == "whatif":
            return None
        return f"{folder}/{t}" if t in local else t

    for mod, (rel, tree) in mods.items():
        package = mod if rel.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        g.add_node(mod)
        for t in {resolve(name, set(), "") for name in imported(tree, package)} - {None, mod}:
            if not mod.startswith(f"{t}."):
                g.add_edge(mod, t)
    scripts = list(script_sources())
    for folder, mod, tree in scripts:
        local = {m for f, m, _ in scripts if f == folder}
        node = f"{folder}/{mod}"
        package = mod if mod in {m.rpartition(".")[0] for m in local} else mod.rpartition(".")[0]
        g.add_node(node)
        for t in {resolve(name, local, folder) for name in imported(tree, package)} - {None, node}:
            if not node.startswith(f"{t}."):
                g.add_edge(node, t)
    return g


def test_the_import_graph_sees_packages_scripts_and_tests() -> None:
    g = import_graph()
    assert g.has_edge("whatif.depgraph.build", "whatif.depgraph.rules")
    assert g.has_edge("whatif.depgraph.rules.thread", "whatif.depgraph.state")
    assert g.has_edge("tests/test_graph_rules", "tests/tracegen")
    assert g.has_edge("bench/parse_speed", "bench/common.docs")
    assert g.has_edge("tests/test_graph_rules", "whatif.depgraph.rules")


def test_no_import_cycles() -> None:
    g = import_graph()
    cycles = [c for c in nx.simple_cycles(g) if len(c) > 1]
    assert not cycles, "import cycles (TYPE_CHECKING imports included):\n" + "\n".join(
        " -> ".join([*c, c[0]]) for c in sorted(cycles)[:10])
