"""The text form of a ``whatif.diff`` document (rich tables)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .markdown import ms


def _bare(name: str) -> str:
    return name.removeprefix("void ")


def short_name(name: str, width: int = 64) -> str:
    """A kernel name that fits ``width``: ``void `` dropped, the middle elided so templated names
    that differ only in their functor stay distinct."""
    name = _bare(name)
    if len(name) <= width:
        return name
    half = (width - 1) // 2
    return name[:half] + "…" + name[-(width - 1 - half):]


def _common_prefix_chars(texts: Sequence[str]) -> int:
    """Characters at the start that every one of ``texts`` shares."""
    shortest = min(len(t) for t in texts)
    for i in range(shortest):
        if len({t[i] for t in texts}) > 1:
            return i
    return shortest


def short_names(names: Sequence[str], width: int = 64) -> list[str]:
    """:func:`short_name` of each name, except that different names whose short forms would read
    the same show the part where they differ instead of the middle: ``head…differing part…tail``,
    and a ``#k`` suffix where even that cannot tell them apart. Equal names keep equal labels.

    >>> a = "void at::native::elementwise_kernel<128, 4, MulFunctor<float>>(int, Func const&)"
    >>> b = "void at::native::elementwise_kernel<128, 4, CUDAFunctor_add<BFloat16>>(int, Func const&)"
    >>> short_name(a, 40) == short_name(b, 40)
    True
    >>> print(*short_names([a, b, a], 40), sep="\\n")
    at::nativ…, MulFunctor<float>>…c const&)
    at::nativ…, CUDAFunctor_add<BF…c const&)
    at::nativ…, MulFunctor<float>>…c const&)
    """
    labels = [short_name(n, width) for n in names]
    by_label: dict[str, list[str]] = {}
    for name, label in zip(names, labels):
        same = by_label.setdefault(label, [])
        if name not in same:
            same.append(name)
    fixed: dict[str, str] = {}
    for group in (g for g in by_label.values() if len(g) > 1):
        bare = [_bare(n) for n in group]
        head = _common_prefix_chars(bare)
        edge = max(1, (width - 2) // 4)
        middle = width - 2 - 2 * edge
        seen: dict[str, int] = {}
        for full, n in zip(group, bare):
            lo = max(edge, head - 2)
            label = n[:edge] + "…" + n[lo:lo + middle] + "…" + n[len(n) - edge:] if len(n) > width else n
            seen[label] = seen.get(label, 0) + 1
            fixed[full] = label if seen[label] == 1 else f"{label} #{seen[label]}"
    return [fixed.get(n, label) for n, label in zip(names, labels)]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _class_text(classes: dict[str, int]) -> str:
    """Kernel classes largest first (the document's order).

    >>> _class_text({"gemm": 4016, "memset": 40}), _class_text({})
    ('gemm+memset', '-')
    """
    return "+".join(classes) or "-"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _render_ops(ops: dict[str, Any], console: Any, top: int) -> None:
    """The op-tree alignment: matched shares, the largest matched ops, the largest one-sided work."""
    from rich.table import Table

    b, a = ops["before"], ops["after"]
    console.print(f"ops aligned by op tree: matched {ms(b['matched_ns'])} of {ms(b['gpu_ns'])} GPU ms per step "
                  f"before ({_share(b['matched_share'])}, under aten ops {ms(b['matched_op_ns'])}), "
                  f"{ms(a['matched_ns'])} of {ms(a['gpu_ns'])} after ({_share(a['matched_share'])}, under aten ops "
                  f"{ms(a['matched_op_ns'])}); aten ops matched {ops['ops_matched']} of {b['ops']} before, "
                  f"{a['ops']} after")
    if ops["matched"]:
        tab = Table(title="matched ops (GPU time per step; a module, annotation or step: the work launched right "
                          "under it)", title_justify="left")
        tab.add_column("op", no_wrap=True, overflow="ellipsis", max_width=28)
        tab.add_column("shapes", no_wrap=True, overflow="ellipsis", max_width=24)
        for col in ("calls", "ms before", "ms after", "ratio"):
            tab.add_column(col, justify="right", no_wrap=True, min_width=len(col))
        tab.add_column("kernels before", no_wrap=True, overflow="ellipsis", max_width=18)
        tab.add_column("kernels after", no_wrap=True, overflow="ellipsis", max_width=18)
        for r in ops["matched"][:top]:
            name = r["name"] if r["kind"] == "op" else f"{r['name']} ({r['kind']})"
            tab.add_row(name, r["shapes"], f"{r['count_before']:g}", ms(r["ns_before"]), ms(r["ns_after"]),
                        "-" if r["ratio"] is None else f"{r['ratio']:.2f}", _class_text(r["classes_before"]),
                        _class_text(r["classes_after"]))
        console.print(tab)
    for side in ("before", "after"):
        rows = ops[f"only_{side}"][:top]
        if not rows:
            continue
        tab = Table(title=f"GPU work with no matched op, only in {side} (per step)", title_justify="left")
        tab.add_column("held by", no_wrap=True, overflow="ellipsis", max_width=48)
        tab.add_column("under", no_wrap=True, overflow="ellipsis", max_width=32)
        tab.add_column("calls", justify="right", no_wrap=True, min_width=5)
        tab.add_column("ms", justify="right", no_wrap=True, min_width=7)
        tab.add_column("kernels", no_wrap=True, overflow="ellipsis", max_width=40)
        for r in rows:
            tab.add_row(r["name"], r["under"] or "-", f"{r['count']:g}", ms(r["ns"]), _class_text(r["classes"]))
        console.print(tab)


def render_diff(doc: dict[str, Any], console: Any, top: int = 8, notes: Sequence[str] = ()) -> None:
    """Print steps, the ops aligned by op tree, kernel changes by name, kernel classes, critical
    path and the prediction check; ``notes`` (what the step times hold that a reader would not
    guess, e.g. a CUDA/HIP graph capture pass) follow the measured speedup, one ``note:`` line each."""
    from rich.table import Table

    b, a = doc["before"], doc["after"]
    console.print(f"[bold]before[/bold] {b['source']} ({b['device'] or 'GPU unknown'}): {b['count']} steps, "
                  f"mean {ms(b['mean_ns'])} ms, median {ms(b['median_ns'])} ms")
    console.print(f"[bold]after[/bold]  {a['source']} ({a['device'] or 'GPU unknown'}): {a['count']} steps, "
                  f"mean {ms(a['mean_ns'])} ms, median {ms(a['median_ns'])} ms")
    console.print(f"measured speedup {doc['speedup']:.3f}x (median {doc['median_speedup']:.3f}x); GPU time per step "
                  f"{ms(doc['gpu_ns_per_step']['before'])} -> {ms(doc['gpu_ns_per_step']['after'])} ms")
    for note in notes:
        console.print(f"note: {note}")
    _render_ops(doc["ops"], console, top)
    k = doc["kernels"]
    console.print("kernels by name (GPU ms per step): " + ", ".join(
        f"{c} {k[c]['names']} ({ms(k[c]['delta_ns'], True)})"
        for c in ("added", "removed", "slower", "faster", "same")))
    for change in ("slower", "faster", "added", "removed"):
        rows = k[change]["top"][:top]
        if not rows:
            continue
        tab = Table(title=f"{change} kernels (per step)", title_justify="left")
        tab.add_column("name", no_wrap=True)
        for col in ("calls before", "calls after", "ms before", "ms after", "change ms"):
            tab.add_column(col, justify="right", no_wrap=True)
        for r in rows:
            tab.add_row(short_name(r["name"]), f"{r['count_before']:g}", f"{r['count_after']:g}", ms(r["ns_before"]),
                        ms(r["ns_after"]), ms(r["delta_ns"], True))
        console.print(tab)
    cls = Table(title="GPU time per step by kernel class (ms)", title_justify="left")
    for col in ("class", "before", "after", "change"):
        cls.add_column(col, justify="right" if col != "class" else "left")
    for r in doc["kernel_classes"]:
        cls.add_row(r["class"], ms(r["ns_before"]), ms(r["ns_after"]), ms(r["delta_ns"], True))
    console.print(cls)
    cp = Table(title="Critical path, mean per step (ms)", title_justify="left")
    for col in ("category", "before", "after", "change"):
        cp.add_column(col, justify="right" if col != "category" else "left")
    for r in doc["critical_path"]:
        cp.add_row(r["category"], ms(r["before_ns"]), ms(r["after_ns"]), ms(r["delta_ns"], True))
    console.print(cp)
    pred = doc["prediction"]
    if pred is None:
        return
    if not pred["same_trace_as_before"]:
        console.print(f"note: the prediction was made on {pred['source']} (mean step "
                      f"{ms(pred['baseline_measured_ns'])} ms), not on the before trace; compared by speedup")
    tab = Table(title="Prediction vs actual (predicted step = before mean / predicted speedup)", title_justify="left")
    tab.add_column("scenario", overflow="ellipsis", no_wrap=True, max_width=40)
    for col in ("predicted ms", "actual ms", "predicted speedup", "actual speedup", "error"):
        tab.add_column(col, justify="right", no_wrap=True)
    for s in pred["scenarios"]:
        promised = "-" if s["predicted_step_ns"] is None else ms(s["predicted_step_ns"])
        tab.add_row(s["name"], promised, ms(s["actual_step_ns"]), f"{s['predicted_speedup']:.3f}x",
                    "-" if s["actual_speedup"] is None else f"{s['actual_speedup']:.3f}x", _pct(s["error"]))
    console.print(tab)
