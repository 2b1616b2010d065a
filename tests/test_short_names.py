"""Shortened kernel names stay apart: four different elementwise kernels of the Qwen H100 trace
all read ``at::native::elementwise…onst&)::{lambda(int)#1})`` in the dashboard's tables before
2026-11-28 (the functor that tells them apart is in the elided middle)."""
from __future__ import annotations

from whatif.dashboard.layout import name_cells, table
from whatif.report.diff_text import short_name, short_names

PREFIX = "void at::native::elementwise_kernel<128, {w}, at::native::gpu_kernel_impl_nocast<"
SUFFIX = ">(at::TensorIteratorBase&, {f} const&)::{{lambda(int)#1}}>(int, at::native::gpu_kernel_impl_nocast<" \
         "{f}>(at::TensorIteratorBase&, {f} const&)::{{lambda(int)#1}})"
NAMES = [PREFIX.format(w=4) + SUFFIX.format(f="at::native::BinaryFunctor<float, float, float, MulFunctor<float>>"),
         PREFIX.format(w=4) + SUFFIX.format(f="at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"),
         PREFIX.format(w=4) + SUFFIX.format(f="at::native::CUDAFunctor_add<c10::BFloat16>"),
         PREFIX.format(w=2) + SUFFIX.format(f="at::native::BinaryFunctor<float, float, float, MulFunctor<float>>")]


def test_different_names_get_different_labels_and_equal_names_equal_ones() -> None:
    assert len({short_name(n, 40) for n in NAMES}) == 1   # the collision this guards against
    labels = short_names(NAMES + NAMES[:1], 40)
    assert len(set(labels[:4])) == 4 and labels[4] == labels[0]
    assert all(len(label) <= 40 + len(" #9") for label in labels)
    assert short_names(["aten::mm", "aten::addmm"], 40) == ["aten::mm", "aten::addmm"]   # short names untouched


def test_dashboard_tables_label_each_kernel_apart_and_keep_the_full_name_in_the_tooltip() -> None:
    shown, tips = name_cells([{"name": n, "ms": 1.0} for n in NAMES], ["name"], 40)
    assert len({r["name"] for r in shown}) == 4
    assert [t["name"]["value"] for t in tips] == NAMES


def test_a_column_declared_numeric_sorts_as_numbers_before_it_has_a_value() -> None:
    rows = [{"run": "a", "ranks": None, "status": "not loaded"}]
    types = {c["id"]: c["type"] for c in table("t", rows).columns}
    assert types["ranks"] == "text"                     # nothing says it is a number yet
    declared = table("t", rows, numbers=("ranks",))
    assert [(c["id"], c["type"]) for c in declared.columns] == [("ranks", "numeric"), ("run", "text"),
                                                               ("status", "text")]
    assert {"if": {"column_id": "ranks"}, "textAlign": "left"} not in declared.style_cell_conditional
