"""whatif diff: kernel and step changes on hand-made pairs (exact), prediction vs actual, and the
real before/after pairs of ../shared/traces."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from test_report import SCENARIO, gpu_trace, write
from tracegen import KinetoTrace

from whatif.api import analyze, predict
from whatif.cli import main
from whatif.optree import NO_OP
from whatif.report import build_report
from whatif.report.diff import diff_document
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, EventKind, codes
from whatif.tracer.trace import load_trace
from whatif.transforms.generic import Scale
from whatif.transforms.select import Selector


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("diff")
    return (gpu_trace(d / "before.json.gz"), gpu_trace(d / "after.json.gz", gemm_us=30),
            gpu_trace(d / "after_extra.json.gz", gemm_us=30, relu_us=12, extra_kernel="add_kernel"))


def test_kernels_and_steps(pair: tuple[Path, Path, Path]) -> None:
    before, _, after = pair
    doc = diff_document(analyze(before), analyze(after))
    # step 0 (warm-up) is left out: the means are over steps 1 and 2
    assert (doc["before"]["mean_ns"], doc["after"]["mean_ns"]) == (84_000, 61_000)
    assert [s.get("excluded") for s in doc["before"]["steps"]] == ["warm-up", None, None]
    assert doc["speedup"] == round(84_000 / 61_000, 6)
    k = doc["kernels"]
    assert [r["name"] for r in k["faster"]["top"]] == ["gemm"] and k["faster"]["delta_ns"] == -30_000
    assert [r["name"] for r in k["slower"]["top"]] == ["relu"] and k["slower"]["top"][0]["delta_ns"] == 2_000
    assert [(r["name"], r["count_before"], r["count_after"]) for r in k["added"]["top"]] == [("add_kernel", 0, 1)]
    assert k["removed"]["names"] == 0 and k["same"]["names"] == 0
    gpu = {r["category"]: r for r in doc["critical_path"]}["gpu"]
    assert gpu["before_ns"] == 70_000 and gpu["after_ns"] == 47_000
    assert doc["gpu_ns_per_step"] == {"before": 70_000, "after": 47_000}


def test_prediction_vs_actual(pair: tuple[Path, Path, Path]) -> None:
    before, exact, extra = pair
    report = build_report(predict(before, [Scale(select=Selector(name="gemm"), factor=0.5)]))
    (hit,) = diff_document(analyze(before), analyze(exact), report)["prediction"]["scenarios"]
    # the scenario is the change
    assert hit["error"] == 0 and hit["actual_speedup"] == pytest.approx(hit["predicted_speedup"], abs=1e-5)
    doc = diff_document(analyze(before), analyze(extra), report)
    (miss,) = doc["prediction"]["scenarios"]
    assert doc["prediction"]["same_trace_as_before"]
    assert miss["predicted_step_ns"] == 54_000 and miss["actual_step_ns"] == 61_000
    assert miss["error"] == round(54_000 / 61_000 - 1, 6)  # promised more than delivered: the extra kernel


def test_a_speedup_of_zero_promises_no_step(pair: tuple[Path, Path, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A prediction whose speedup is 0 (a degenerate baseline, or a hand-edited file) promises no
    step time: no predicted step and no error, not a step of 0 ns and an error of -100 %."""
    before, exact, _ = pair
    assert main(["report", str(before), "-s", str(write(tmp_path / "fuse.toml", SCENARIO)), "-o", str(tmp_path / "r"),
                 "--format", "json", "-q"]) == 0
    report = orjson.loads((tmp_path / "r" / "report.json").read_bytes())
    report["prediction"]["scenarios"][0]["speedup"] = 0.0
    edited = tmp_path / "edited.json"
    edited.write_bytes(orjson.dumps(report))
    out = tmp_path / "diff.json"
    assert main(["diff", str(before), str(exact), "-p", str(edited), "--json", str(out)]) == 0
    (row,) = orjson.loads(out.read_bytes())["prediction"]["scenarios"]
    assert row["predicted_speedup"] == 0 and row["predicted_step_ns"] is None and row["error"] is None
    assert "-100.0%" not in capsys.readouterr().out


def test_cli_with_report_json(pair: tuple[Path, Path, Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    before, _, after = pair
    sc = write(tmp_path / "fuse.toml", SCENARIO)
    assert main(["report", str(before), "-s", str(sc), "-o", str(tmp_path / "r"), "--format", "json", "-q"]) == 0
    out = tmp_path / "diff.json"
    assert main(["diff", str(before), str(after), "-p", str(tmp_path / "r" / "report.json"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Prediction vs actual" in text and "fuse" in text and "added kernels" in text
    assert "ops aligned by op tree" in text and "only in after" in text
    doc = orjson.loads(out.read_bytes())
    assert (doc["schema"], doc["version"]) == ("whatif.diff", 1)
    assert list(doc) == ["schema", "version", "whatif_version", "before", "after", "speedup", "median_speedup",
                         "gpu_ns_per_step", "ops", "kernels", "kernel_classes", "critical_path", "prediction"]
    assert main(["diff", str(before), str(after), "-p", str(sc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fuse.toml: not a JSON report" in err[0]
    assert main(["diff", str(before), str(tmp_path / "nope.json")]) == 2


def test_cli_include_warmup_counts_step_0(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    before, _, after = pair
    default, wide = tmp_path / "d.json", tmp_path / "w.json"
    assert main(["diff", str(before), str(after), "--json", str(default), "-q"]) == 0
    assert main(["diff", str(before), str(after), "--include-warmup", "--json", str(wide), "-q"]) == 0
    d, w = orjson.loads(default.read_bytes()), orjson.loads(wide.read_bytes())
    assert d["before"]["count"] == 2 and w["before"]["count"] == 3
    assert [s.get("excluded") for s in w["before"]["steps"]] == [None, None, None]
    assert w["before"]["mean_ns"] == sum(s["measured_ns"] for s in w["before"]["steps"]) // 3


# (op, input dims, child op or None, kernel, us) per step; the two "vendors" name every kernel
# differently, lower attention through different aten ops, and differ in one op's shapes and one op
H100 = [("aten::linear", [[4, 8], [16, 8], [16]], "aten::addmm", "sm90_xmma_gemm_bf16bf16_bf16f32_tn", 30),
        ("aten::scaled_dot_product_attention", [[1, 2, 4, 8]], "aten::_scaled_dot_product_flash_attention",
         "flash_fwd_kernel", 20),
        ("aten::relu", [[4, 16]], None, "vectorized_elementwise_kernel", 10),
        ("aten::mul", [[4, 16], [4, 16]], None, "vectorized_elementwise_kernel", 5)]
MI300 = [("aten::linear", [[4, 8], [16, 8], [16]], "aten::addmm", "Cijk_Alik_Bljk_BBS_BH_MT64x64", 40),
         ("aten::scaled_dot_product_attention", [[1, 2, 4, 8]], "aten::_scaled_dot_product_efficient_attention",
          "attn_fwd", 25),
         ("aten::relu", [[4, 16]], None, "elementwise_kernel", 8),
         ("aten::mul", [[4, 32], [4, 32]], None, "elementwise_kernel", 6),
         ("aten::add", [[4, 16], [4, 16]], None, "elementwise_kernel", 4)]


def vendor_trace(path: Path, ops: list[tuple[str, list[list[int]], str | None, str, float]], gpu_name: str,
                 orphan_us: float = 0) -> Path:
    """Three steps of ``ops`` (each launching one kernel, through its child op when it has one),
    then a device synchronize; ``orphan_us``: a kernel per step with no launch call in the file."""
    tr = KinetoTrace(gpu_name=gpu_name)
    corr, t0 = 0, 0.0
    for n in range(3):
        gpu_t = t0 + 10 * len(ops) + 5
        for i, (op, dims, child, kernel, us) in enumerate(ops):
            corr += 1
            tr.op(op, t0 + 1 + 10 * i, 9, args={"Input Dims": dims})
            if child:
                tr.op(child, t0 + 2 + 10 * i, 7, args={"Input Dims": dims})
            tr.runtime("cudaLaunchKernel", t0 + 3 + 10 * i, 4, corr=corr)
            tr.gpu(kernel, gpu_t, us, corr=corr)
            gpu_t += us
        if orphan_us:
            tr.gpu("orphan_elementwise_kernel", gpu_t, orphan_us, corr=100_000 + n)
            gpu_t += orphan_us
        corr += 1
        t0 = tr.synced_step(n, t0, t0 + 1 + 10 * len(ops), gpu_t, corr)
    return tr.write(path)


def test_ops_align_across_vendors(tmp_path: Path) -> None:
    before = vendor_trace(tmp_path / "h100.json.gz", H100, "NVIDIA H100 80GB HBM3")
    after = vendor_trace(tmp_path / "mi300.json.gz", MI300, "AMD Instinct MI300X", orphan_us=3)
    doc = diff_document(analyze(before), analyze(after))
    ops = doc["ops"]
    assert doc["kernels"]["same"]["names"] == 0 and doc["kernels"]["slower"]["names"] == 0  # names: nothing
    got = {r["name"]: (r["count_before"], r["ns_before"], r["ns_after"], r["classes_before"], r["classes_after"])
           for r in ops["matched"]}
    assert got == {
        "aten::addmm": (1, 30_000, 40_000, {"gemm": 30_000}, {"gemm": 40_000}),
        # different lowerings: the kernels count for the lowest common op
        "aten::scaled_dot_product_attention": (1, 20_000, 25_000, {"attention": 20_000}, {"attention": 25_000}),
        "aten::relu": (1, 10_000, 8_000, {"elementwise": 10_000}, {"elementwise": 8_000})}
    assert [r["name"] for r in ops["matched"]] == ["aten::addmm", "aten::scaled_dot_product_attention", "aten::relu"]
    assert ops["matched"][0]["ratio"] == round(40 / 30, 6)
    assert [(r["name"], r["shapes"], r["under"], r["count"], r["ns"]) for r in ops["only_before"]] == [
        ("aten::mul", "[[4, 16], [4, 16]]", "ProfilerStep#*", 1, 5_000)]  # other shapes do not match
    assert [(r["name"], r["shapes"], r["count"], r["ns"]) for r in ops["only_after"]] == [
        ("aten::mul", "[[4, 32], [4, 32]]", 1, 6_000), ("aten::add", "[[4, 16], [4, 16]]", 1, 4_000),
        (NO_OP, "", 1, 3_000)]
    assert ops["before"] == {"gpu_ns": 65_000, "matched_ns": 60_000, "unmatched_ns": 5_000,
                             "matched_share": round(60 / 65, 6), "matched_op_ns": 60_000, "ops": 18}
    assert ops["after"] == {"gpu_ns": 86_000, "matched_ns": 73_000, "unmatched_ns": 13_000,
                            "matched_share": round(73 / 86, 6), "matched_op_ns": 73_000, "ops": 21}
    assert ops["ops_matched"] == 12  # linear, addmm, sdpa, relu in each of the 3 steps (the whole trace)
    _adds_up(doc)
    again = diff_document(analyze(before), analyze(after))
    assert orjson.dumps(again) == orjson.dumps(doc)


def compiled_trace(path: Path, graph_hash: str, kernel_us: float) -> Path:
    """Three steps of one Triton kernel launched right under a compiled graph's annotation."""
    tr = KinetoTrace()
    t0 = 0.0
    for n in range(3):
        tr.annotation(f"## Call CompiledFxGraph {graph_hash} ##", t0 + 1, 8)
        tr.runtime("cuLaunchKernel", t0 + 2, 4, corr=2 * n + 1)
        tr.gpu("triton_poi_fused_add_0", t0 + 10, kernel_us, corr=2 * n + 1)
        t0 = tr.synced_step(n, t0, t0 + 9, t0 + 10 + kernel_us, 2 * n + 2)
    return tr.write(path)


def test_compiled_graphs_match_whatever_their_hash(tmp_path: Path) -> None:
    before = compiled_trace(tmp_path / "a.json.gz", "fvjmd63htmfdi5w7aufk2x5kqz7y6tcoyia5", 10)
    after = compiled_trace(tmp_path / "b.json.gz", "fjs75i4jmhjizyb5d2n4c6ohbmzk6a6xq3u2", 7)
    ops = diff_document(analyze(before), analyze(after))["ops"]
    assert [(r["kind"], r["name"], r["count_before"], r["ns_before"], r["ns_after"]) for r in ops["matched"]] == [
        ("annotation", "## Call CompiledFxGraph * ##", 1, 10_000, 7_000)]
    assert ops["before"]["matched_share"] == 1.0 and ops["before"]["matched_op_ns"] == 0 and ops["ops_matched"] == 0
    other = compiled_trace(tmp_path / "c.json.gz", "not a hash", 7)  # another name: nothing in common
    ops = diff_document(analyze(before), analyze(other))["ops"]
    assert ops["matched"] == [] and [r["name"] for r in ops["only_after"]] == ["## Call CompiledFxGraph not a hash ##"]


def test_the_same_trace_matches_every_op(pair: tuple[Path, Path, Path]) -> None:
    before, exact, _ = pair
    ops = diff_document(analyze(before), analyze(exact))["ops"]
    assert ops["before"]["matched_share"] == ops["after"]["matched_share"] == 1.0
    assert [(r["name"], r["ns_before"], r["ns_after"]) for r in ops["matched"]] == [
        ("aten::mm", 60_000, 30_000), ("aten::relu", 10_000, 10_000)]
    assert ops["only_before"] == ops["only_after"] == []


KINETO = "kineto/resnet50_num_workers_{}__worker0.{}.pt.trace.json.gz"


@pytest.mark.shared
def test_resnet_num_workers_pair(shared_traces: Path) -> None:
    """DataLoader num_workers 0 -> 4 on a V100: CPU time on the critical path drops, steps get faster."""
    doc = diff_document(analyze(shared_traces / KINETO.format(0, 1623143089861)),
                        analyze(shared_traces / KINETO.format(4, 1623212756351)))
    assert doc["before"]["count"] == doc["after"]["count"] == 6
    assert 1.2 < doc["speedup"] < 1.3 and 1.35 < doc["median_speedup"] < 1.45
    path = {r["category"]: r["delta_ns"] for r in doc["critical_path"]}
    assert path["cpu"] < -20e6 and path["gpu"] < -20e6 and path["launch"] > 10e6
    assert abs(doc["gpu_ns_per_step"]["after"] / doc["gpu_ns_per_step"]["before"] - 1) < 0.05  # same GPU work


HF = "tracelens/hf_{}/{}.json.gz"


def _adds_up(doc: dict[str, Any]) -> None:
    """Each side's matched plus one-sided time is its GPU time per step, and so is the sum of the
    listed groups (each rounded to the ns)."""
    ops = doc["ops"]
    for side in ("before", "after"):
        s = ops[side]
        assert s["matched_ns"] + s["unmatched_ns"] == s["gpu_ns"] == doc["gpu_ns_per_step"][side]
        listed = sum(r[f"ns_{side}"] for r in ops["matched"]) + sum(r["ns"] for r in ops[f"only_{side}"])
        assert abs(listed - s["gpu_ns"]) <= len(ops["matched"]) + len(ops[f"only_{side}"])
        assert abs(sum(r[f"ns_{side}"] for r in ops["matched"]) - s["matched_ns"]) <= len(ops["matched"])


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize(("model", "share"), [("Qwen_Qwen1.5-0.5B-Chat__1016005", 0.69),
                                              ("gaunernst_bert-small-uncased__1016001", 0.999),
                                              ("Falconsai_nsfw_image_detection__1016002", 0.999)])
def test_h100_vs_mi300x_pairs_align_by_op(shared_traces: Path, model: str, share: float) -> None:
    """The same HF model on two vendors: kernel names barely overlap, the op trees do. What is
    left unmatched on Qwen is GPU work whose launches precede the file's CPU events."""
    doc = diff_document(analyze(shared_traces / HF.format("h100", model)),
                        analyze(shared_traces / HF.format("mi300", model)))
    assert "H100" in doc["before"]["device"] and "MI300X" in doc["after"]["device"]
    _adds_up(doc)
    ops = doc["ops"]
    assert ops["before"]["matched_share"] >= share and ops["after"]["matched_share"] >= share
    assert {r["name"] for r in ops["only_before"] + ops["only_after"]} <= {NO_OP}
    gemm = [r for r in ops["matched"] if r["name"] == "aten::addmm"]
    assert gemm and all(next(iter(r["classes_before"])) == next(iter(r["classes_after"])) == "gemm" for r in gemm)
    if model.startswith("Qwen"):
        k = doc["kernels"]  # by name: nearly nothing in common
        assert k["added"]["names"] > 10 and k["removed"]["names"] > 10 and k["same"]["names"] == 0
        # independently, from the raw events: the GPU work no launch call of the file correlates with
        for side in ("h100", "mi300"):
            ev = load_trace(shared_traces / HF.format(side, model)).events
            (step_ns,) = ev.loc[ev["name"].astype(str).str.startswith("ProfilerStep#")
                                & (ev["kind"] == EventKind.ANNOTATION), "ts_ns"]
            gpu = ev[ev["kind"].isin(codes(GPU_ACTIVITY_KINDS)) & (ev["ts_ns"] >= step_ns)]  # 8 kernels before it
            calls = ev[ev["kind"].isin([EventKind.RUNTIME, EventKind.DRIVER])]
            orphan = gpu[~gpu["correlation"].isin(calls["correlation"])]
            (only,) = ops["only_before" if side == "h100" else "only_after"]
            assert (only["count"], only["ns"]) == (len(orphan), orphan["dur_ns"].sum()) and len(orphan) > 400
            assert ops["before" if side == "h100" else "after"]["gpu_ns"] == gpu["dur_ns"].sum()


@pytest.mark.shared
def test_resnet_pair_aligns_nearly_everything(shared_traces: Path) -> None:
    """Same program, same GPU: every op matches, 6 steps to 6 steps."""
    doc = diff_document(analyze(shared_traces / KINETO.format(0, 1623143089861)),
                        analyze(shared_traces / KINETO.format(4, 1623212756351)))
    _adds_up(doc)
    ops = doc["ops"]
    assert ops["before"]["matched_share"] > 0.999 and ops["after"]["matched_share"] > 0.999
    assert ops["before"]["ops"] == ops["after"]["ops"] == ops["ops_matched"]
    conv = {(r["name"], r["shapes"]): r for r in ops["matched"]}
    fwd = [r for (n, _), r in conv.items() if n == "aten::cudnn_convolution"]
    assert fwd and all(r["count_before"] == r["count_after"] for r in fwd)


@pytest.mark.shared
@pytest.mark.slow
def test_xdit_pair_matches_the_compiled_graph_by_its_annotation(shared_traces: Path) -> None:
    """AITER + SageAttention on one MI300X: the compiled graph's annotation names differ by their
    hash only, so the trees match all through; the Triton work recorded into the CUDA graph has no
    aten op above it and compares under its annotation."""
    doc = diff_document(analyze(shared_traces / "tracelens/xdit_flux1_baseline_mi300x.json.gz"),
                        analyze(shared_traces / "tracelens/xdit_flux1_aiter_sage_mi300x.json.gz"))
    _adds_up(doc)
    ops = doc["ops"]
    assert ops["before"]["matched_share"] == ops["after"]["matched_share"] == 1.0
    assert ops["before"]["ops"] == ops["after"]["ops"] == ops["ops_matched"]
    assert 0.3 < ops["before"]["matched_op_ns"] / ops["before"]["gpu_ns"] < 0.6
    top = ops["matched"][0]
    assert (top["kind"], top["name"]) == ("annotation", "CUDAGraphNode.record (dynamo_timed)")
    assert top["ns_before"] + ops["before"]["matched_op_ns"] <= ops["before"]["matched_ns"]


@pytest.mark.shared
def test_hta_trace_compare_pair(shared_traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    assert main(["diff", str(shared_traces / "hta/trace_compare/base.json.gz"),
                 str(shared_traces / "hta/trace_compare/test.json.gz"), "--json", str(out), "-q"]) == 0
    doc = orjson.loads(out.read_bytes())
    assert doc["before"]["count"] == doc["after"]["count"] == 2 and doc["speedup"] > 1
