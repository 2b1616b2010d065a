"""`whatif ops`: the FLOP/byte formulas on hand-made shapes (GEMM, causal vs full attention, GQA,
varlen, backward, MoE grouped GEMM, embedding, paged attention), the table on a hand-made trace
with known answers (time split, counts, bounds as defined), and on a shared H100 trace (the rows
sum to every GPU activity's time, read independently from the raw JSON)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tracegen import KinetoTrace

from whatif.cli import main
from whatif.core.kernels import causal_pairs, op_flops_bytes
from whatif.documents import OpsDocument, from_json
from whatif.hardware.devices import get_device
from whatif.ops import SHORT_NS, Bound, bound, ops_table
from whatif.tracer.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
QWEN = ROOT.parent / "shared" / "traces" / "tracelens" / "hf_h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
BF16 = "c10::BFloat16"


def _sdpa(q: list[int], k: list[int], causal: bool) -> tuple[int, int]:
    got = op_flops_bytes("aten::scaled_dot_product_attention", [q, k, k, [], [], [], [], []], [BF16] * 3,
                         ["", "", "", "", "0.", str(causal), "", "False"])
    assert got is not None
    return got


def test_gemm_family():
    m, n, k = 64, 32, 128
    assert op_flops_bytes("aten::mm", [[m, k], [k, n]], [BF16] * 2) == (2 * m * n * k, (m * k + k * n + m * n) * 2)
    bias_add = m * n
    assert op_flops_bytes("aten::addmm", [[n], [m, k], [k, n], [], []], [BF16] * 3 + ["Scalar"] * 2)[0] == \
        2 * m * n * k + bias_add
    assert op_flops_bytes("aten::linear", [[4, m, k], [n, k], [n]], [BF16] * 3)[0] == 4 * (2 * m * n * k + bias_add)
    assert op_flops_bytes("aten::bmm", [[3, m, k], [3, k, n]], ["float"] * 2)[0] == 2 * 3 * m * n * k
    # MoE grouped GEMM: 96 tokens routed over 8 experts of (k, n) weights
    f, b = op_flops_bytes("aten::_grouped_mm", [[96, k], [8, k, n], [8]], [BF16, BF16, "int"])
    assert (f, b) == (2 * 96 * k * n, (96 * k + 8 * k * n + 96 * n) * 2)


def test_causal_attention_is_half_of_full_and_counts_the_triangle():
    q = [2, 8, 1024, 64]
    full, full_bytes = _sdpa(q, q, causal=False)
    half, half_bytes = _sdpa(q, q, causal=True)
    assert full == 4 * 2 * 8 * 1024 * 1024 * 64
    assert half == full * 1025 // 2048                     # S(S+1)/2 of S² pairs: half, plus the diagonal
    assert abs(half / full - 0.5) < 1e-3
    assert half_bytes == full_bytes                        # masking skips work, not the reads of Q, K, V
    assert causal_pairs(4, 4) == 10 and causal_pairs(3, 5) == 6 and causal_pairs(3, 5, bottom_right=True) == 12


def test_gqa_attention_reads_fewer_kv_heads_for_the_same_flops():
    q, kv = [1, 32, 512, 128], [1, 8, 512, 128]
    mha_f, mha_b = _sdpa(q, q, causal=False)
    gqa_f, gqa_b = _sdpa(q, kv, causal=False)
    assert gqa_f == mha_f                                   # every query head attends over all keys
    head = 512 * 128 * 2
    assert mha_b - gqa_b == 2 * (32 - 8) * head             # K and V of 24 fewer heads


def test_flash_layouts_varlen_and_backward():
    bshd = [[2, 256, 16, 64]] * 3 + [[]] * 12
    concrete = ["", "", "", "", "", "256", "256", "0.", "True", "False", "0.125", "", "", "", ""]
    fwd = op_flops_bytes("aten::_flash_attention_forward", bshd, [BF16] * 3, concrete)
    bhsd = _sdpa([2, 16, 256, 64], [2, 16, 256, 64], causal=True)
    assert fwd == bhsd                                      # same work in the (B, S, H, D) layout
    # varlen: 3 sequences packed into 600 tokens, the longest 400: 400 + two of 100 (TraceLens's rule)
    varlen = [[600, 16, 64]] * 3 + [[4], [4]] + [[]] * 10
    got = op_flops_bytes("aten::_flash_attention_forward", varlen, [BF16] * 3,
                         ["", "", "", "", "", "400", "400", "0.", "False", "False", "", "", "", "", ""])
    assert got is not None and got[0] == 4 * 16 * 64 * (400 * 400 + 2 * 100 * 100)
    bwd_args = [[2, 16, 256, 64]] * 4 + [[]] * 11
    bwd = op_flops_bytes("aten::_scaled_dot_product_flash_attention_backward", bwd_args, [BF16] * 4,
                         [""] * 11 + ["True"] + [""] * 3)
    assert bwd is not None and bwd[0] == bhsd[0] * 5 // 2   # recomputed QKᵀ plus dV, dP, dQ, dK


def test_decode_attention_sees_every_cached_key():
    # one new query against 1000 cached keys: bottom-right causal (FlashAttention) masks nothing
    f, _ = op_flops_bytes("flash_attn::_flash_attn_forward", [[4, 1, 8, 64], [4, 1000, 8, 64], [4, 1000, 8, 64]],
                          [BF16] * 3, ["", "", "", "0.", "0.125", "True"])
    assert f == 4 * 4 * 8 * 1000 * 64
    # vLLM paged attention: 4 sequences, up to 2048 cached keys each, 2 KV heads in the block cache
    paged = [[4, 8, 64], [4, 8, 64], [100, 2, 8, 16, 8], [100, 2, 64, 16]] + [[]] * 8
    f, b = op_flops_bytes("_C::paged_attention_v1", paged, [BF16] * 4,
                          ["", "", "", "", "2", "0.125", "", "", "16", "2048", "", "auto"])
    assert f == 4 * 4 * 8 * 2048 * 64 and b == (2 * 4 * 8 * 64 + 4 * 2048 * 2 * 128) * 2


def test_embedding_moves_the_rows_it_gathers():
    f, b = op_flops_bytes("aten::embedding", [[50000, 1024], [16, 128], [], [], []],
                          [BF16, "long int", "Scalar", "Scalar", "Scalar"], ["", "", "-1", "False", "False"])
    assert (f, b) == (0, 2 * 16 * 128 * 1024 * 2 + 16 * 128 * 8)


def test_the_bound_rule():
    assert bound(0.5, 100_000, 1000.0, 150.0) is Bound.LAUNCH       # launch wins over everything
    assert bound(0.4, SHORT_NS - 1, 1000.0, 150.0) is Bound.LATENCY
    assert bound(0.0, SHORT_NS, 150.0, 150.0) is Bound.COMPUTE      # at the ridge: compute
    assert bound(0.0, SHORT_NS, 149.0, 150.0) is Bound.MEMORY
    assert bound(0.0, SHORT_NS, None, 150.0) is Bound.UNKNOWN


def _known(tmp_path: Path) -> Path:
    """An mm (1024³, bf16) whose two kernels run 30 and 10 us back to back; an add of 256 floats
    launched into an idle stream by an 8 us call, running 2 us (launch-bound); a 3 us kernel
    with no launching op (latency-bound, no FLOPs)."""
    t = KinetoTrace(gpu_name="NVIDIA A100-SXM4-80GB")
    t.op("aten::mm", 0, 12, args={"External id": 1, "Input Dims": [[1024, 1024], [1024, 1024]],
                                  "Input type": [BF16, BF16], "Concrete Inputs": ["", ""]})
    t.runtime("cudaLaunchKernel", 1, 2, corr=1)
    t.gpu("sm80_xmma_gemm_bf16bf16_bf16f32", 5, 30, corr=1, **{"External id": 1})
    t.runtime("cudaLaunchKernel", 4, 2, corr=2)
    t.gpu("splitKreduce_kernel", 35, 10, corr=2, **{"External id": 1})
    t.op("aten::add", 100, 20, args={"External id": 2, "Input Dims": [[256], [256], []],
                                     "Input type": ["float", "float", "Scalar"], "Concrete Inputs": ["", "", "1"]})
    t.runtime("cudaLaunchKernel", 110, 8, corr=3)
    t.gpu("vectorized_elementwise_kernel<add>", 119, 2, corr=3, **{"External id": 2})
    t.gpu("unlaunched_elementwise_kernel", 200, 3, corr=4)
    for e in t.events:   # the runtime calls carry their op's External id too
        if e["cat"] == "cuda_runtime":
            e["args"]["External id"] = 1 if e["args"]["correlation"] < 3 else 2
    return t.write(tmp_path / "known.pt.trace.json.gz")


def test_the_table_on_known_activities(tmp_path: Path):
    doc = ops_table(load_trace(_known(tmp_path)))
    assert doc.devices == ["A100_SXM_80GB"] and doc.gpu_total_ns == 45_000
    rows = {r.op: r for r in doc.rows}
    assert [r.op for r in doc.rows] == ["aten::mm", "unlaunched_elementwise_kernel", "aten::add"]  # by time
    mm = rows["aten::mm"]
    assert (mm.count, mm.kernels, mm.total_ns, mm.mean_ns) == (1, 2, 40_000, 40_000)
    assert mm.flops == 2 * 1024 ** 3 and mm.bytes == 3 * 1024 * 1024 * 2 and mm.dtype == "bf16"
    assert mm.achieved_tflops == round(2 * 1024 ** 3 / 40_000 / 1e3, 4)
    # the roof is the A100's achievable rate for a 1024^3 bf16 GEMM (intensity 341 is past its ridge)
    a100 = get_device("A100_SXM_80GB")
    rate = a100.achievable_matrix_flops("bf16", 2 * 1024 ** 3)
    assert rate <= a100.peak_flops("bf16") and 341 > rate / a100.stream_bw_bytes_per_s
    assert mm.roofline_tflops == round(rate / 1e12, 3) and mm.bound == Bound.COMPUTE.value
    ideal_ns = 2 * 1024 ** 3 / rate * 1e9
    assert mm.roofline_pct == round(100 * ideal_ns / 40_000, 2)
    add = rows["aten::add"]
    assert add.bound == Bound.LAUNCH.value and add.flops == 256 and add.kernel_class == "elementwise"
    lone = rows["unlaunched_elementwise_kernel"]
    assert lone.bound == Bound.LATENCY.value and lone.flops is None and lone.roofline_pct is None
    by_kernel = ops_table(load_trace(tmp_path / "known.pt.trace.json.gz"), by="kernel")
    split = {r.kernel: r.flops for r in by_kernel.rows if r.op == "aten::mm"}
    assert split == {"sm80_xmma_gemm_bf16bf16_bf16f32": 0.75 * 2 * 1024 ** 3,
                     "splitKreduce_kernel": 0.25 * 2 * 1024 ** 3}        # shared by duration


def test_a_gemms_workspace_memset_does_none_of_its_flops(tmp_path: Path):
    """cuBLAS zeroes a split-K workspace with a memset before the GEMM kernel, both launched by one
    mm: the GEMM kernel does all the FLOPs, the memset none, and the op's roof is the GEMM's alone
    (shared by duration, the memset took 1/41 of the FLOPs at a memset's roof, and the shared traces'
    mid-size H100 GEMMs read 106-127 % of the achievable roof instead of 89-106 %)."""
    t = KinetoTrace(gpu_name="NVIDIA A100-SXM4-80GB")
    t.op("aten::mm", 0, 12, args={"External id": 1, "Input Dims": [[1024, 1024], [1024, 1024]],
                                  "Input type": [BF16, BF16], "Concrete Inputs": ["", ""]})
    t.runtime("cudaMemsetAsync", 1, 2, corr=1)
    t.gpu("Memset (Device)", 4, 1, corr=1, cat="gpu_memset", **{"External id": 1})
    t.runtime("cudaLaunchKernel", 4, 2, corr=2)
    t.gpu("sm80_xmma_gemm_bf16bf16_bf16f32", 6, 40, corr=2, **{"External id": 1})
    for e in t.events:
        if e["cat"] == "cuda_runtime":
            e["args"]["External id"] = 1
    path = t.write(tmp_path / "memset.pt.trace.json.gz")
    trace = load_trace(path)
    by_kernel = {r.kernel: r for r in ops_table(trace, by="kernel").rows}
    assert by_kernel["sm80_xmma_gemm_bf16bf16_bf16f32"].flops == 2 * 1024 ** 3
    assert by_kernel["Memset (Device)"].flops == 0
    mm = ops_table(trace).rows[0]
    rate = get_device("A100_SXM_80GB").achievable_matrix_flops("bf16", 2 * 1024 ** 3)
    assert (mm.op, mm.kernels, mm.flops) == ("aten::mm", 2, 2 * 1024 ** 3)
    assert mm.roofline_pct == round(100 * (2 * 1024 ** 3 / rate * 1e9) / 41_000, 2)
    # the cost model the transforms price with agrees: the memset's own work is estimated from its time
    from whatif.api import analyze, make_context
    a = analyze(path)
    facts = make_context(a.trace).require_cost("test").kernel_facts(a.graph, np.arange(len(a.graph.tasks)))
    names = a.graph.tasks["name"].astype(str).to_numpy()
    gemm, memset = int(np.flatnonzero(names == "sm80_xmma_gemm_bf16bf16_bf16f32")[0]), \
        int(np.flatnonzero(names == "Memset (Device)")[0])
    assert facts["flops"][gemm] == 2 * 1024 ** 3 and not facts["estimated"][gemm]
    assert facts["estimated"][memset] and facts["weight_bytes"][memset] == 0


def test_cli_writes_csv_parquet_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    trace = _known(tmp_path)
    csv, pq, js = tmp_path / "t.csv", tmp_path / "t.parquet", tmp_path / "t.json"
    assert main(["ops", str(trace), "-o", str(csv), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "aten::mm" in out and "compute" in out and f"wrote {csv}" in out
    frame = pd.read_csv(csv)
    assert frame["total_ns"].sum() == 45_000 and frame["op"].iloc[0] == "aten::mm"
    doc = from_json(js.read_text(), OpsDocument)
    assert doc.rows[0].flops == 2 * 1024 ** 3
    assert main(["ops", str(trace), "-o", str(csv)]) == 2            # exists: --force overwrites it
    assert "--force" in capsys.readouterr().err
    assert main(["ops", str(trace), "--by", "kernel", "-q", "-o", str(pq)]) == 0
    assert pd.read_parquet(pq)["kernels"].sum() == 4
    first = csv.read_bytes()
    assert main(["ops", str(trace), "-q", "-f", "-o", str(csv)]) == 0 and csv.read_bytes() == first


def _raw_gpu_ns(path: Path) -> int:
    """Every kernel, copy and memset of the file, summed from the raw JSON (µs, 3 decimals)."""
    events = json.loads(gzip.open(path).read())["traceEvents"]
    cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    return sum(round(e["dur"] * 1000) for e in events if e.get("ph") == "X" and e.get("cat") in cats)


@pytest.mark.skipif(not QWEN.exists(), reason="shared traces not present (../shared/traces)")
def test_the_table_of_a_shared_trace_sums_to_its_gpu_time():
    doc = ops_table(load_trace(QWEN))
    assert doc.devices == ["H100_SXM"]
    assert sum(r.total_ns for r in doc.rows) == doc.gpu_total_ns
    assert doc.gpu_total_ns == _raw_gpu_ns(QWEN)
    attention = next(r for r in doc.rows if r.op == "aten::_flash_attention_forward")
    # causal (Concrete Inputs: is_causal=True), B=16, H=16, S=559, D=64: the triangle of 559·560/2 pairs
    assert attention.flops == attention.count * 4 * 16 * 16 * (559 * 560 // 2) * 64
    assert {r.bound for r in doc.rows} >= {Bound.COMPUTE.value, Bound.MEMORY.value, Bound.LAUNCH.value}
    assert all(np.isfinite(r.roofline_pct) for r in doc.rows if r.flops is not None and r.flops > 0)


def test_a_convolution_without_its_stride_takes_its_output_from_the_next_op(shared_traces: Path):
    """ResNet-50 (2021, V100) records no stride or padding: a stride-2 1x1 convolution's output
    is read from the batch norm that takes it (28x28, not 56x56), so it is not 4x its FLOPs and far
    past the GPU's peak; a 3x3 stride-1 one keeps its 56x56 (padding 1)."""
    trace = load_trace(shared_traces / "kineto" / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    rows = {(r.op, r.shapes): r for r in ops_table(trace).rows}
    down = rows[("aten::cudnn_convolution", "[32,256,56,56] [512,256,1,1]")]
    assert down.flops == down.count * 2 * 32 * 512 * 28 * 28 * 256
    same = rows[("aten::cudnn_convolution", "[32,64,56,56] [64,64,3,3]")]
    assert same.flops == same.count * 2 * 32 * 64 * 56 * 56 * 64 * 9
    assert down.roofline_pct < 120


def test_dashboard_page_shows_the_table_numbers_first(tmp_path: Path):
    from whatif.dashboard.app import create_app
    from whatif.dashboard.pages import ops as page
    from whatif.dashboard.state import get_store

    create_app([_known(tmp_path)])
    run = next(iter(get_store().runs.values()))
    doc = page.document(run.id, "op")
    table = page.rows(doc)
    assert list(table[0])[:3] == ["total ms", "share %", "count"] and list(table[0])[-3:] == ["op", "shapes", "dtype"]
    assert [r["op"] for r in table] == [r.op for r in doc.rows] and table[0]["bound"] == "compute"
    assert table[0]["GFLOP"] == round(2 * 1024 ** 3 / 1e9, 2) and table[2]["% roof"] is not None
    text = json.dumps(page.body(run.id, "kernel").to_plotly_json(), default=str)
    assert "ops-table" in text and "splitKreduce_kernel" in text
    bars = {t.name: t.x[0] for t in page.bound_figure(doc).data}
    assert bars == {"compute": 0.04, "latency": 0.003, "launch": 0.002}


@pytest.mark.skipif(not QWEN.exists(), reason="shared traces not present (../shared/traces)")
def test_the_cost_model_prices_kernels_with_the_same_formulas():
    """One home: the trace cost model's FLOPs per kernel (what transforms scale) are the table's,
    causal attention included (it was priced 2x before Concrete Inputs were read)."""
    from whatif.depgraph.build import build_graph
    from whatif.ops import activities
    from whatif.predictors.costs import TraceCostModel

    trace = load_trace(QWEN)
    graph = build_graph(trace)
    acts = activities(trace).set_index("event")
    tasks = graph.tasks
    gpu = np.flatnonzero(tasks["event"].isin(acts.index[acts["linked"]]).to_numpy())
    facts = TraceCostModel(trace).kernel_facts(graph, gpu)
    expected = acts.loc[tasks["event"].to_numpy()[gpu], "flops"].to_numpy()
    linked = acts.loc[tasks["event"].to_numpy()[gpu]]
    # a GEMM's workspace memset does none of its op's work: 0 in the table, its own estimated here
    idle = (expected == 0) & (linked["bytes"].to_numpy() == 0) & np.isin(linked["kernel_class"].to_numpy(),
                                                                       ["memset", "copy"])
    priced = ~np.isnan(expected) & ~idle   # the cost model estimates the rest from their durations
    assert idle.sum() >= 168 and priced.sum() > 900
    assert not facts["estimated"][priced].any() and facts["estimated"][~priced].all()
    np.testing.assert_allclose(facts["flops"][priced], expected[priced], rtol=1e-9)
    flash = acts["op"].to_numpy() == "aten::_flash_attention_forward"
    assert acts.loc[flash, "flops"].sum() == 24 * 4 * 16 * 16 * (559 * 560 // 2) * 64


@pytest.mark.slow
def test_every_shared_trace_gets_a_table_that_sums_to_its_gpu_time(shared_traces: Path):
    from whatif.core.errors import WhatifError
    from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, codes

    files = sorted(p for p in shared_traces.rglob("*") if p.name.endswith((".json", ".json.gz")))
    tables = 0
    for path in files:
        try:
            trace = load_trace(path)
        except WhatifError:      # refused with one line (no GPU activity, not a GPU trace)
            continue
        ev = trace.events
        gpu_ns = int(ev["dur_ns"].to_numpy()[np.isin(ev["kind"].to_numpy(), codes(GPU_ACTIVITY_KINDS))].sum())
        doc = ops_table(trace)
        assert doc.gpu_total_ns == gpu_ns == sum(r.total_ns for r in doc.rows), path
        assert {r.bound for r in doc.rows} <= {b.value for b in Bound}, path
        assert all(r.flops is None or r.flops >= 0 for r in doc.rows), path
        tables += 1
    assert tables >= 40
