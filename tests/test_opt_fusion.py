"""The ``fuse`` and ``cuda_graph`` optimizations: exact effects on hand-made traces, direction and
rough size on real shared traces."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tracegen import KinetoTrace

from whatif.api import Analysis, analyze, make_context, predict
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.hardware.roofline import fixed_latency_ns
from whatif.predictors.replay import replay
from whatif.predictors.steps import critical_path, step_times
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.cuda_graph import CudaGraph, graph_launch_cost_ns
from whatif.transforms.optimizations.fuse import Fuse
from whatif.transforms.select import Selector

US = 1000
CHAIN = [("gemm_kernel", "aten::mm"), ("vectorized_elementwise_kernel<add>", "aten::add"),
         ("vectorized_elementwise_kernel<gelu>", "aten::gelu"), ("layer_norm_kernel", "aten::layer_norm"),
         ("gemm_kernel", "aten::mm")]


def cpu_bound(kernel_us: float = 3, sync_after: int | None = None) -> KinetoTrace:
    """One step; per op: 2 us of Python, an 8 us launch, 2 us more Python; short kernels; a final
    device synchronize. The CPU thread is the critical path."""
    tr = KinetoTrace()
    tr.step(0, 0, 200)
    t = 5
    for i, (name, op) in enumerate(CHAIN):
        tr.op(op, t, 12)
        tr.runtime("cudaLaunchKernel", t + 2, 8, corr=i + 1)
        tr.gpu(name, t + 12, kernel_us, corr=i + 1)
        t += 15
        if sync_after == i:
            tr.runtime("cudaStreamSynchronize", t, 10, corr=100 + i)
            tr.cuda_sync("Stream Sync", t + 9, 0.5, corr=100 + i, stream=7)
            t += 12
    tr.runtime("cudaDeviceSynchronize", t, 20, corr=99)
    return tr


def gpu_bound(kernel_us: float = 50) -> KinetoTrace:
    """One step; launches every 8 us, each kernel much longer (queued, 1 us apart on the stream)."""
    tr = KinetoTrace()
    t_gpu = 20
    for i, (name, op) in enumerate(CHAIN):
        tr.op(op, 3 + 8 * i, 7)
        tr.runtime("cudaLaunchKernel", 5 + 8 * i, 3, corr=i + 1)
        tr.gpu(name, t_gpu, kernel_us, corr=i + 1)
        t_gpu += kernel_us + 1
    end = 5 + 8 * len(CHAIN)
    tr.runtime("cudaDeviceSynchronize", end, t_gpu - end, corr=99)
    tr.step(0, 0, t_gpu + 2)
    return tr


def load(tr: KinetoTrace, tmp_path: Path, name: str = "t.json.gz") -> Analysis:
    return analyze(tr.write(tmp_path / name))


def total(graph: TaskGraph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


def names(graph: TaskGraph) -> list[str]:
    return graph.tasks["name"].astype(str).tolist()


def snapshot(graph: TaskGraph) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    return graph.tasks.copy(), graph.edges.copy(), len(graph.changes)


def assert_unchanged(graph: TaskGraph, snap: tuple[pd.DataFrame, pd.DataFrame, int]) -> None:
    pd.testing.assert_frame_equal(graph.tasks, snap[0])
    pd.testing.assert_frame_equal(graph.edges, snap[1])
    assert len(graph.changes) == snap[2]


# -- fuse -----------------------------------------------------------------------------------------

def test_fuse_merges_the_memory_bound_chain_and_drops_its_launches(tmp_path: Path) -> None:
    a = load(cpu_bound(), tmp_path)
    g, ctx = a.graph, make_context(a.trace)
    snap = snapshot(g)
    members = Fuse().match(g, ctx)
    assert [names(g)[i] for i in members] == [n for n, _ in CHAIN[1:4]]
    h = Fuse().apply(g, ctx)
    assert_unchanged(g, snap)
    kinds = h.tasks["kind"].to_numpy()
    assert (kinds == int(TaskKind.KERNEL)).sum() == 3          # gemm, fused, gemm
    assert (kinds == int(TaskKind.CPU_CALL)).sum() == (g.tasks["kind"] == int(TaskKind.CPU_CALL)).sum() - 2
    fused = [n for n in names(h) if n.startswith("fused[3]")]
    assert fused == ["fused[3]: vectorized_elementwise_kernel<add> + vectorized_elementwise_kernel<gelu> + "
                     "layer_norm_kernel"]
    change = h.changes[-1]
    assert change.transform == "fuse" and change.tasks == 3
    assert "fuse 3 tasks into 1 (and drop 2 launches)" in str(change) and "1 chains of 3 kernels" in change.reason
    assert "MB saved" in change.reason
    # CPU-bound: exactly the two dropped launch calls (8 us each) leave the critical path; the
    # CPU gaps (Python between ops) stay
    assert total(g) - total(h) == 2 * 8 * US


def test_fused_time_is_unique_bytes_over_bandwidth(tmp_path: Path) -> None:
    a = load(gpu_bound(kernel_us=50), tmp_path)
    g, ctx = a.graph, make_context(a.trace)
    h = Fuse().apply(g, ctx)
    fused = h.tasks["dur_ns"].to_numpy()[np.char.startswith(np.asarray(names(h)), "fused")]
    # Three elementwise-like kernels of 50 us, bytes estimated from time (b = busy x BW): links
    # save 2 x b/3 each, so unique = 3b - 4b/3 = 5b/3 and T = t0 + 5/3 x busy.
    t0 = fixed_latency_ns(find_device(ctx.device))      # the recorded GPU's fixed kernel latency
    busy = 50 * US - t0
    assert fused.tolist() == [t0 + round(busy * 5 / 3)]
    assert 50 * US <= fused[0] <= 150 * US
    # GPU-bound: the step shrinks by the GPU time saved plus the two 1 us stream gaps inside the chain
    assert total(g) - total(h) == 150 * US - fused[0] + 2 * US


def test_fuse_parameters_select_pattern_and_chain_bounds(tmp_path: Path) -> None:
    a = load(cpu_bound(), tmp_path)
    g, ctx = a.graph, make_context(a.trace)
    sel = Fuse(select=Selector(name="add|gelu")).match(g, ctx)
    assert [names(g)[i] for i in sel] == [n for n, _ in CHAIN[1:3]]
    pat = Fuse(pattern=["gelu", "layer_norm"]).apply(g, ctx)
    assert any(n.startswith("fused[2]: vectorized_elementwise_kernel<gelu> + layer_norm") for n in names(pat))
    # a pattern may name any kernel class: the GEMM and its epilogue
    epi = Fuse(pattern=["gemm", "add"]).apply(g, ctx)
    assert total(epi) <= total(g)
    cut = Fuse(max_chain=2).apply(g, ctx)
    assert sum(n.startswith("fused[2]") for n in names(cut)) == 1 and "layer_norm_kernel" in names(cut)
    with pytest.raises(TransformError, match="no chains of memory-bound kernels"):
        Fuse(min_chain=4).apply(g, ctx)
    with pytest.raises(TransformError, match="min_chain"):
        Fuse(min_chain=1).apply(g, ctx)
    with pytest.raises(TransformError, match="bad pattern"):
        Fuse(pattern=["(", "x"]).apply(g, ctx)


def test_a_sync_between_launches_breaks_the_chain(tmp_path: Path) -> None:
    a = load(cpu_bound(sync_after=1), tmp_path)   # synchronize after the add's launch
    g, ctx = a.graph, make_context(a.trace)
    members = Fuse().match(g, ctx)
    assert [names(g)[i] for i in members] == [n for n, _ in CHAIN[2:4]]


# -- cuda_graph ------------------------------------------------------------------------------------

def test_cuda_graph_removes_the_cpu_launch_path_of_a_cpu_bound_step(tmp_path: Path) -> None:
    a = load(cpu_bound(), tmp_path)
    g, ctx = a.graph, make_context(a.trace)
    snap = snapshot(g)
    h = CudaGraph().apply(g, ctx)
    assert_unchanged(g, snap)
    assert names(h).count("cudaGraphLaunch") == 1 and names(h).count("cudaLaunchKernel") == 0
    assert "cudaDeviceSynchronize" in names(h)
    kern = lambda x: sorted(x.tasks.loc[x.tasks["kind"] == int(TaskKind.KERNEL), "dur_ns"].tolist())  # noqa: E731
    assert kern(h) == kern(g)
    assert {c.transform for c in h.changes[len(g.changes):]} == {"cuda_graph"}
    assert "5 launch calls -> 1 graph launches" in h.changes[len(g.changes)].reason
    # removed: 4 launch calls (8 us) and the 4 CPU gaps between the 5 launches (7 us each);
    # the first launch call (8 us) became a 10 us graph launch
    assert total(g) - total(h) == (4 * 8 + 4 * 7 - (10 - 8)) * US
    assert critical_path(replay(h), 0).breakdown_ns["launch"] < critical_path(a.replay, 0).breakdown_ns["launch"]


def test_cuda_graph_barely_moves_a_gpu_bound_step(tmp_path: Path) -> None:
    a = load(gpu_bound(kernel_us=200), tmp_path)
    g, ctx = a.graph, make_context(a.trace)
    h = CudaGraph(launch_us=5).apply(g, ctx)
    assert abs(total(h) - total(g)) <= 0.01 * total(g)


def test_cuda_graph_splits_at_syncs_and_respects_the_region(tmp_path: Path) -> None:
    a = load(cpu_bound(sync_after=1), tmp_path)
    g, ctx = a.graph, make_context(a.trace)
    h = CudaGraph().apply(g, ctx)
    assert names(h).count("cudaGraphLaunch") == 2 and "cudaStreamSynchronize" in names(h)
    assert total(h) < total(g)
    # a region of GEMMs only: each is alone between other launches, nothing worth a graph
    with pytest.raises(TransformError, match="no 2\\+ GPU tasks"):
        CudaGraph(region=Selector(name="gemm")).apply(g, ctx)
    part = CudaGraph(region=Selector(name="gelu|layer_norm")).apply(g, ctx)
    assert names(part).count("cudaGraphLaunch") == 1 and names(part).count("cudaLaunchKernel") == 3
    with pytest.raises(TransformError, match="kernel_gap_us must be a finite number >= 0"):
        CudaGraph(kernel_gap_us=-1)


def test_scenario_file_fuse_then_cuda_graph(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "fused graphs"\n\n[[transform]]\nname = "fuse"\nmax_chain = 8\n\n'
                        '[[transform]]\nname = "cuda_graph"\nlaunch_us = 10\nkernel_gap_us = 0.5\n')
    a = load(cpu_bound(), tmp_path)
    p = predict(a, [scenario])
    (res,) = p.scenarios
    times = [total(g) for g in res.graphs]
    assert total(a.graph) > times[0] > times[1]
    # graph first, then fuse: kernels launched by one graph launch still fuse
    ctx = make_context(a.trace)
    g = CudaGraph().apply(a.graph, ctx)
    assert any(n.startswith("fused[3]") for n in names(Fuse().apply(g, ctx)))


# -- real traces -----------------------------------------------------------------------------------

QWEN = "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
BERT = "tracelens/hf_h100/gaunernst_bert-small-uncased__1016001.json.gz"
NEG_QUEUE = "hta/negative_queue_a100_rank0of16.json.gz"
VLLM_GRAPH = "tracelens/vllm_decode_full_graph_execution_mi300x.json.gz"


@pytest.fixture(scope="module")
def real(shared_traces: Path):
    cache: dict[str, tuple[Analysis, object]] = {}

    def get(rel: str) -> tuple[Analysis, object]:
        if rel not in cache:
            a = analyze(shared_traces / rel)
            cache[rel] = (a, make_context(a.trace))
        return cache[rel]
    return get


@pytest.mark.parametrize("rel", [QWEN, BERT, NEG_QUEUE, VLLM_GRAPH])
def test_fuse_never_slows_a_real_trace(real, rel: str) -> None:
    a, ctx = real(rel)
    h = Fuse().apply(a.graph, ctx)
    before = a.steps["predicted_ns"].to_numpy()
    after = step_times(replay(h))["predicted_ns"].to_numpy()
    assert (after <= before).all()
    assert after.sum() < before.sum()
    assert len(h.tasks) < len(a.graph.tasks)


def test_cuda_graph_speeds_up_hf_decode(real) -> None:
    a, ctx = real(QWEN)
    h = CudaGraph().apply(a.graph, ctx)
    r = replay(h)
    before, after = a.steps["predicted_ns"].sum(), step_times(r)["predicted_ns"].sum()
    # GPU busy 45.6 of the 49.4 ms step: the launch path's share (cpu + launch on the critical
    # path, 4.7 ms) mostly goes; the step gets 3-8 % faster, bounded by the kernels' own time
    assert 1.02 < before / after < 1.08
    gpu_busy = a.graph.tasks.loc[a.graph.tasks["kind"].isin([4, 5, 6]), "dur_ns"].sum()
    assert after >= gpu_busy
    old, new = a.critical_path(0).breakdown_ns, critical_path(r, 0).breakdown_ns
    assert new["cpu"] + new["launch"] < 0.2 * (old["cpu"] + old["launch"])


def test_cuda_graph_on_a_cpu_bound_and_a_gpu_bound_trace(real) -> None:
    a, ctx = real(BERT)                    # tiny model: the Python launch path is the step
    fast = step_times(replay(CudaGraph().apply(a.graph, ctx)))["predicted_ns"].sum()
    assert a.steps["predicted_ns"].sum() / fast > 2
    a, ctx = real(NEG_QUEUE)               # GPU-bound training steps
    h = CudaGraph().apply(a.graph, ctx)
    ratio = a.steps["predicted_ns"].to_numpy() / step_times(replay(h))["predicted_ns"].to_numpy()
    assert (ratio > 0.99).all() and ratio.mean() < 1.1
    kern = a.graph.tasks["kind"] == int(TaskKind.KERNEL)
    assert h.tasks.loc[h.tasks["kind"] == int(TaskKind.KERNEL), "dur_ns"].sum() == a.graph.tasks.loc[kern,
                                                                                                       "dur_ns"].sum()


def test_cuda_graph_leaves_a_captured_trace_alone(real) -> None:
    a, ctx = real(VLLM_GRAPH)              # a real full-graph decode step (hipGraphLaunch)
    fixed, per_node, count = graph_launch_cost_ns(a.graph)
    assert count == 1 and fixed == 0 and 1_000 < per_node < 1_400      # ~1.2 us per node
    h = CudaGraph().apply(a.graph, ctx)
    before, after = a.steps["predicted_ns"].sum(), step_times(replay(h))["predicted_ns"].sum()
    assert abs(before - after) < 0.01 * before


# -- docs/writing-a-transform.md: every code block runs --------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-transform.md"


def test_writing_a_transform_code_blocks_run(shared_traces: Path, tmp_path: Path, monkeypatch, capsys,
                                             transform_registry) -> None:
    import re
    import shlex
    import sys
    import types

    import tomllib

    from whatif.cli import main

    text = DOC.read_text().replace("../shared/traces/", f"{shared_traces}/")
    blocks = re.findall(r"```(\w+)\n(.*?)```", text, flags=re.S)
    assert [lang for lang, _ in blocks].count("python") >= 4
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("writing_a_transform")     # dataclasses and get_type_hints look it up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for lang, code in blocks:
        if lang == "python":
            exec(compile(code, str(DOC), "exec", dont_inherit=True), namespace)  # noqa: S102
        elif lang == "toml":
            data = tomllib.loads(code)
            first = code.splitlines()[0]
            if "transform" in data:
                assert first.startswith("# ") and first.endswith(".toml"), "name scenario blocks with a # FILE line"
                (tmp_path / first[2:]).write_text(code)
            else:
                assert "whatif.transforms" in data["project"]["entry-points"]
        elif lang == "bash":
            for line in code.splitlines():
                args = shlex.split(line, comments=True)
                assert args[0] == "whatif"
                assert main(args[1:]) == 0, line
        else:
            raise AssertionError(f"unexpected code block language {lang!r}")
    assert "faster_attention" in transform_registry.names()  # @register in the doc; removed after the test
    assert (tmp_path / "prediction.json").exists()
    out = capsys.readouterr().out
    assert "x)" in out and "fuse" in out
