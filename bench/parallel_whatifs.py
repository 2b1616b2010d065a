"""Worked examples of docs/multi-gpu.md: pim_offload, pipeline/data parallel, overlap, reshard on the
hand-made LLM traces of tests/_llm_tracegen.py (H100-like kernel rates), the interference factor
calibrated on the shared HTA traces, and sequence_parallel's modes on the DiT-like trace of
tests/test_parallel_sequence.py. Run: .venv/bin/python bench/parallel_whatifs.py (~15 s)."""
from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from _llm_tracegen import llm_trace  # noqa: E402
from test_parallel import transformer_trace  # noqa: E402

from whatif.api import analyze, make_context  # noqa: E402
from whatif.depgraph.graph import TaskKind  # noqa: E402
from whatif.predictors.replay import replay  # noqa: E402
from whatif.predictors.steps import step_times  # noqa: E402
from whatif.transforms.base import TransformError  # noqa: E402
from whatif.transforms.parallel.data import DataParallel  # noqa: E402
from whatif.transforms.parallel.layers import backward_blocks, find_blocks  # noqa: E402
from whatif.transforms.parallel.overlap import Overlap  # noqa: E402
from whatif.transforms.parallel.pim import PimOffload, search_pim  # noqa: E402
from whatif.transforms.parallel.pipeline import PipelineParallel  # noqa: E402
from whatif.transforms.parallel.reshard import search_reshard  # noqa: E402
from whatif.transforms.parallel.sequence import SequenceParallel  # noqa: E402
from whatif.transforms.parallel.tensor import TensorParallel  # noqa: E402
from whatif.transforms.sharing import calibrated_interference  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 20)


def ms(graph) -> float:
    return step_times(replay(graph))["predicted_ns"].sum() / 1e6


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    print("## pim_offload (attacc; 2 layers, hidden 4096, ffn 11008, KV 2048 tokens; per step)")
    for batch, tokens in ((1, 1), (8, 1), (32, 1), (1, 512)):
        a = analyze(llm_trace(tmp / f"pim{batch}_{tokens}.json.gz", batch=batch, new_tokens=tokens))
        ctx = make_context(a.trace)
        s = search_pim(a.graph, ctx, max_intensity=1e9)
        g = PimOffload(max_intensity=1e9).apply(a.graph, ctx) if s.breakdown["offloaded"] else a.graph
        print(f"batch {batch} x {tokens} tokens: {s.summary()}; replay {ms(a.graph) / 2:.3f} -> {ms(g) / 2:.3f} ms")
        if (batch, tokens) == (1, 1):
            print(s.candidates.assign(**{c: s.candidates[c] / 2e3 for c in s.candidates if c.endswith("_ns")})
                  .round(1).to_string(index=False))
            r = search_pim(a.graph, ctx, weight_reuse=1)
            print(f"weight_reuse=1: {r.summary()}")
            print(r.candidates.assign(**{c: r.candidates[c] / 2e3 for c in r.candidates if c.endswith("_ns")})
                  .round(1).to_string(index=False))
    print("\n## pipeline_parallel / data_parallel (training step, 4 layers, 1024 tokens)")
    t = analyze(llm_trace(tmp / "train.json.gz", new_tokens=1024, kv_tokens=1024, layers=4, backward=True, steps=1))
    ctx = make_context(t.trace)
    print(f"1 GPU: {ms(t.graph):.2f} ms")
    for m in (1, 4, 16):
        print(f"pp4 1f1b m={m}: {ms(PipelineParallel(degree=4, micro_batches=m).apply(t.graph, ctx)):.2f} ms")
    for d in (2, 8):
        g = DataParallel(degree=d).apply(t.graph, ctx)
        comm = g.tasks["dur_ns"].to_numpy()[g.tasks["kind"].to_numpy() == int(TaskKind.COMM)]
        print(f"dp{d}: {ms(g):.2f} ms ({len(comm)} buckets, {comm.sum() / 1e6:.2f} ms of all-reduce)")
    print("\n## pipeline_parallel serving at equal in-flight sequences vs tensor_parallel (8 layers; x one GPU)")
    for name, kw in (("decode, 8 sequences", {"batch": 8, "new_tokens": 1, "kv_tokens": 2048}),
                     ("prefill, 1024 tokens", {"new_tokens": 1024, "kv_tokens": 1024})):
        a = analyze(llm_trace(tmp / f"pp_{kw['new_tokens']}.json.gz", layers=8, steps=2, **kw))
        ctx = make_context(a.trace)
        one = ms(a.graph)
        pp4 = ms(PipelineParallel(degree=4, schedule="serving").apply(a.graph, ctx)) / one
        tp4 = ms(TensorParallel(degree=4, topology="dgx_h100").apply(a.graph, ctx)) / one
        print(f"{name}: pp4 {pp4:.2f}, tp4 {tp4:.2f}")
    a = analyze(llm_trace(tmp / "pp8.json.gz", new_tokens=1024, kv_tokens=1024, layers=8, steps=3))
    per_step = step_times(replay(PipelineParallel(degree=8, schedule="serving", stage=7).apply(
        a.graph, make_context(a.trace))))["predicted_ns"] / 1e6
    print("pp8 stage 7 of an 8-layer prefill, ms per step: " + ", ".join(f"{x:.2f}" for x in per_step))
    print("\n## tensor_parallel(2) on the training step: backward gradient GEMMs and attention backward")
    bwd = backward_blocks(t.graph, find_blocks(t.graph))
    tp2 = TensorParallel(degree=2, topology="dgx_h100").apply(t.graph, make_context(t.trace))
    d0, d1 = t.graph.tasks["dur_ns"].to_numpy(), tp2.tasks["dur_ns"].to_numpy()
    for label, sel in (("gradient GEMMs", bwd["part"] != "bwd_attention"), ("attention backward",
                                                                             bwd["part"] == "bwd_attention")):
        ids = bwd.loc[sel, "task"].to_numpy()
        print(f"{label}: {d0[ids].sum() / 1e6:.2f} -> {d1[ids].sum() / 1e6:.2f} ms "
              f"({d1[ids].sum() / d0[ids].sum():.2f}x)")
    comm = tp2.tasks[tp2.tasks["kind"] == int(TaskKind.COMM)]
    print(f"collectives: {len(comm)} ({ms(t.graph):.2f} -> {ms(tp2):.2f} ms per step)")

    print("\n## overlap after tensor_parallel(8, dgx_h100) (512 tokens, 4 layers)")
    s = analyze(llm_trace(tmp / "serve.json.gz", new_tokens=512, layers=4, steps=1))
    ctx = make_context(s.trace)
    tp = TensorParallel(degree=8, topology="dgx_h100").apply(s.graph, ctx)
    print(f"1 GPU {ms(s.graph):.3f} ms, tp8 {ms(tp):.3f} ms")
    for n in (2, 4):
        for phi in (1.0, 1.15, 1.3):
            overlapped = Overlap(nano_batches=n, interference=phi, topology='dgx_h100').apply(tp, ctx)
            print(f"n={n} phi={phi}: {ms(overlapped):.3f} ms")
    for name in ("nccl_data_a100_rank0of2.json.gz", "negative_queue_a100_rank0of16.json.gz"):
        p = SHARED / "hta" / name
        if p.exists():
            print(f"interference calibrated on {name}: {calibrated_interference(analyze(p).graph)}")
    print("\n## reshard (8 GPUs, 8 layers, batch 8, 1 prefill of 1024 tokens + 4 decode steps)")
    r = analyze(llm_trace(tmp / "phased.json.gz", kv_tokens=1024, layers=8, batch=8, steps=5,
                          phases=("prefill", "decode", "decode", "decode", "decode")))
    res = search_reshard(r.graph, make_context(r.trace), gpus=8, prefill_batch=8, decode_batch=8, prompt_tokens=1024)
    print(res.table.round(3).to_string(index=False))
    print(res.why)
    print(res.assumptions)
    sequence_parallel(tmp)


# (GPUs, mode, ulysses degree, heads): 24 heads checked, 0 = the trace's recorded shapes (none: unchecked)
SP_CONFIGS = ((8, "ulysses", 0, 24), (8, "ring", 0, 24), (8, "torus", 0, 24), (8, "usp", 2, 24), (8, "usp", 4, 24),
              (16, "ulysses", 0, 24), (16, "ulysses", 0, 0), (16, "ring", 0, 24), (16, "torus", 0, 24),
              (16, "usp", 8, 24), (16, "usp", 4, 24), (16, "usp", 2, 24))


def _first_block(durs: list[int]) -> str:
    """``n x d us`` for a block's transfers (equal ones grouped)."""
    if not durs:
        return "-"
    return " + ".join(f"{n} x {d / 1e3:.1f}" if n > 1 else f"{d / 1e3:.1f}" for d, n in Counter(durs).items())


def sequence_parallel(tmp: Path) -> None:
    """Each mode's step and, for the first transformer block of rank 0, its all-to-alls, its hops
    (or one-sided transfers) and its attention pieces (the local block, then the blocks on received
    K, V with their merges), in us (2 blocks per step)."""
    print("\n## sequence_parallel (DiT-like, 2 blocks, 32,768 tokens, hidden 3072 = 24 heads x 128, FFN 12,288; "
          "dgx_h100)")
    d = analyze(transformer_trace(tmp / "dit.json.gz", layers=2, tokens=32768, hidden=3072, ffn=4 * 3072,
                                  gpu_name="NVIDIA H100 80GB HBM3"))
    ctx = make_context(d.trace)
    print(f"1 GPU: {ms(d.graph):.2f} ms per step")
    print("| P x machines | mode | step (ms) | all-to-alls, us | hops or transfers, us | attention pieces, us |")
    print("|---|---|---|---|---|---|")
    for p, mode, u, heads in SP_CONFIGS:
        label = (f"usp {u}x{p // u}" if mode == "usp" else mode) + ("" if heads else ", heads unchecked")
        try:
            g = SequenceParallel(mode=mode, degree=p, ulysses_degree=u, heads=heads,
                                 topology="dgx_h100").apply(d.graph, ctx)
        except TransformError as exc:   # the refusal is the result
            print(f"| {p} x {p // 8} | {label} | refused: {str(exc).split(': ', 1)[1]} | | | |")
            continue
        t = g.tasks[g.tasks["rank"] == g.tasks["rank"].min()]
        names, durs = t["name"].astype(str), t["dur_ns"].to_numpy()
        comm = t["kind"].to_numpy() == int(TaskKind.COMM)
        a2a = [int(x) for x in durs[comm & names.str.startswith("sp all_to_all").to_numpy()]]
        hops = [int(x) for x in durs[comm & ~names.str.startswith("sp all_to_all").to_numpy()]]
        local = [int(x) for x in durs[names.str.contains("flash").to_numpy() & ~comm]]
        received = [int(x) for x in durs[names.str.contains("attention block").to_numpy() & ~comm]]
        pieces = local[:1] + received[:len(received) // len(local)]   # the first block's, local then received
        print(f"| {p} x {p // 8} | {label} | {ms(g):.2f} | {_first_block(a2a[:len(a2a) // 2])} | "
              f"{_first_block(hops[:len(hops) // 2])} | {_first_block(pieces)} |")


if __name__ == "__main__":
    main()
