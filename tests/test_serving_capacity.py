"""Serving capacity from the memory model and the engines' defaults (pinned against hand
calculations for two model/GPU pairs), the real engines' policies on hand-worked scenarios, and
the workloads users have: fixed and BurstGPT arrivals, shared prompt prefixes."""
from __future__ import annotations

import itertools
import math
import random
import statistics
import sys
from pathlib import Path

import pytest

from whatif.hardware.devices import get_device
from whatif.predictors.serving import (
    LLMBatch,
    RequestSpec,
    SchedulerConfig,
    WorkloadError,
    simulate_llm,
    synthetic_workload,
)
from whatif.predictors.serving.arrivals import BURSTGPT_SHAPE, Arrivals, draw_arrivals, with_prefix_share
from whatif.predictors.serving.engine_defaults import GIB, GpuMemory, engine_profile

sys.path.insert(0, str(Path(__file__).parent))
from _llm_tracegen import llm_trace

ROOT = Path(__file__).resolve().parents[1]


def gemm_weight_bytes(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, elem: int = 2) -> int:
    """Forward GEMM weights of a Llama block stack: QKV, output, gate+up and down projections."""
    d = hidden // heads
    return layers * (hidden * (heads + 2 * kv_heads) * d + hidden * hidden + 3 * hidden * ffn) * elem


def test_llama2_7b_on_a100_80gb_under_vllm(tmp_path: Path) -> None:
    """Llama-2-7B (32 layers, 32 KV heads of 128, fp16) on an A100-SXM4-80GB under vLLM V1's
    defaults: 0.9 × 80 GiB − 12.95 GB of GEMM weights over 512 KiB a token; blocks of 16; the
    A100 is kept out of the large-GPU tier, so 256 sequences and 2,048 batched tokens."""
    from whatif.api import analyze
    from whatif.serving import recorded_capacity

    a = analyze(llm_trace(tmp_path / "llama2.json.gz", layers=32, heads=32, ffn=11008, steps=1,
                          gpu_name="NVIDIA A100-SXM4-80GB"))
    cap = recorded_capacity(a.graph, scheduler=SchedulerConfig(engine_profile="vllm"))
    weights = gemm_weight_bytes(32, 4096, 32, 32, 11008)
    assert weights == 12_952_010_752
    per_token = 2 * 32 * 32 * 128 * 2
    assert per_token == 512 * 1024
    tokens = math.floor((0.9 * 80 * 2**30 - weights) // per_token)
    assert (cap.kv_tokens, cap.kv_blocks) == (tokens, tokens // 16) == (122_752, 7_672)
    assert (cap.weights_bytes, cap.kv_bytes_per_token, cap.block_tokens) == (weights, per_token, 16)
    assert (cap.max_seqs, cap.max_batched_tokens, cap.memory_fraction) == (256, 2048, 0.9)
    a100 = get_device("A100_SXM_80GB")
    assert cap.kv_transfer_ns_per_token == pytest.approx(per_token / a100.peer_copy_bw_bytes_per_s * 1e9)
    assert "122,752 tokens = 7,672 blocks of 16" in cap.describe() and "32 KV heads of 128" in cap.describe()


def test_gqa_8b_on_h100_under_sglang(tmp_path: Path) -> None:
    """A Llama-3-8B-shaped model (32 layers, 32 query and 8 KV heads, FFN 14336, bf16) on an H100
    80 GB under SGLang's defaults: chunked_prefill_size 8,192 and cuda_graph_max_bs 256 for a GPU
    of 60–90 GiB, so reserved = 512 + 8192·1.5 + 256·2 + 1/8·1024 = 13,440 MiB and
    mem_fraction_static = round((81,920 − 13,440) / 81,920, 3) = 0.836; the pool is what that
    leaves after the weights, at 128 KiB a token (GQA), in pages of 1 token; running requests
    min(tokens // 2, clamp(tokens / 8192 · 512, 2048, 4096))."""
    from whatif.api import analyze
    from whatif.serving import recorded_capacity

    a = analyze(llm_trace(tmp_path / "gqa.json.gz", layers=32, heads=32, kv_heads=8, ffn=14336, steps=1))
    cap = recorded_capacity(a.graph, scheduler=SchedulerConfig(engine_profile="sglang"))
    reserved_mib = 512 + 8192 * 1.5 + 256 * 2 + 1 / 8 * 1024
    fraction = round((81920 - reserved_mib) / 81920, 3)
    assert (reserved_mib, fraction) == (13440, 0.836)
    weights = gemm_weight_bytes(32, 4096, 32, 8, 14336)
    per_token = 2 * 32 * 8 * 128 * 2
    tokens = int((fraction * 80 * 2**30 - weights) // per_token)
    assert (cap.memory_fraction, cap.kv_bytes_per_token, cap.block_tokens) == (0.836, 128 * 1024, 1)
    assert (cap.kv_tokens, cap.kv_blocks) == (tokens, tokens) == (441_384, 441_384)
    assert cap.max_seqs == min(tokens // 2, min(max(int(tokens / 8192 * 512), 2048), 4096)) == 4096
    assert cap.max_batched_tokens == 8192
    vllm = recorded_capacity(a.graph, scheduler=SchedulerConfig(engine_profile="vllm"))
    assert (vllm.max_seqs, vllm.max_batched_tokens) == (1024, 8192)   # H100: vLLM's large-GPU tier
    assert vllm.kv_tokens == int((0.9 * 80 * 2**30 - weights) // per_token) > cap.kv_tokens


def test_engine_figures_without_a_memory_model_and_overrides() -> None:
    """Without a model shape or GPU the KV cache is unlimited and the engine's GPU-less defaults
    apply (vLLM's for a GPU it cannot query, SGLang's fallbacks); every figure can be given."""
    from whatif.api import analyze
    from whatif.serving import recorded_capacity

    cpu = analyze(ROOT / "sample_traces" / "llm_serve")
    examples = recorded_capacity(cpu.graph)
    assert (examples.kv_tokens, examples.max_seqs, examples.max_batched_tokens, examples.block_tokens) == \
        (None, 8, 512, 16)
    assert examples.kv_source.startswith("unlimited: ") and "transformer block" in examples.kv_source
    v1 = recorded_capacity(cpu.graph, scheduler=SchedulerConfig(engine_profile="vllm"))
    v0 = recorded_capacity(cpu.graph, scheduler=SchedulerConfig(engine_profile="vllm-v0", max_model_len=4096))
    sg = recorded_capacity(cpu.graph, scheduler=SchedulerConfig(engine_profile="sglang"))
    assert (v1.max_seqs, v1.max_batched_tokens, v0.max_seqs, v0.max_batched_tokens) == (256, 2048, 256, 4096)
    assert (sg.max_seqs, sg.max_batched_tokens, sg.memory_fraction, sg.block_tokens) == (4096, 4096, 0.88, 1)
    cfg = SchedulerConfig(engine_profile="vllm", max_seqs=4, kv_capacity_tokens=4096, kv_block_tokens=32)
    given = cfg.capacity(v1)
    assert (given.max_seqs, given.max_batched_tokens, given.kv_tokens, given.kv_blocks) == (4, 2048, 4096, 128)
    assert given.given == ("block_tokens", "kv_tokens", "max_seqs") and given.kv_source == "given"
    sg_given = SchedulerConfig(engine_profile="sglang", kv_capacity_tokens=3000).capacity(sg)   # SGLang's rule
    assert (sg_given.max_seqs, sg_given.given) == (min(3000 // 2, 2048), ("kv_tokens",))
    v1_small = SchedulerConfig(engine_profile="vllm", max_batched_tokens=128).capacity(v1)   # not above the budget
    assert (v1_small.max_seqs, v1_small.max_batched_tokens) == (128, 128)
    assert cfg.policy_key.value == "vllm-v1" and SchedulerConfig(engine_profile="sglang").policy_key.value == "sglang"
    with pytest.raises(WorkloadError, match=r"^unknown engine 'trt' \(engines: examples, vllm, vllm-v0, sglang\)$"):
        SchedulerConfig(engine_profile="trt")


def test_mi300x_tier_of_sglang() -> None:
    """192 GiB is SGLang's top tier: 16,384-token chunks, CUDA graphs to batch 512."""
    mi300x = GpuMemory("MI300X", 192 * GIB)
    sg = engine_profile("sglang")
    assert sg.max_batched_tokens(mi300x, 8192) == 16384
    assert sg.memory_fraction(mi300x) == round((196608 - (512 + 16384 * 1.5 + 512 * 2 + 128)) / 196608, 3) == 0.867


PREFILL_NS, DECODE_NS = 10e6, 2e6


def recording(batches: list[LLMBatch]):
    def time_ns(batch: LLMBatch) -> float:
        batches.append(batch)
        return (PREFILL_NS if batch.prefill_tokens else 0.0) + (DECODE_NS if batch.decode_context else 0.0)
    return time_ns


def test_vllm_v1_mixes_decodes_and_prompt_chunks_in_one_budget() -> None:
    """Budget 16 tokens: r0's 10-token prompt alone (t 0–10 ms); then r0's decode (1 token) and
    the first 15 tokens of r1's 30-token prompt in one iteration (10–22); then r0's decode and r1's
    last 15 (22–34: r1's first token); then r1's decode (34–36)."""
    batches: list[LLMBatch] = []
    reqs = [RequestSpec(0, 0.0, 10, 3), RequestSpec(1, 0.001, 30, 2)]
    res = simulate_llm(reqs, recording(batches), SchedulerConfig(engine_profile="vllm", max_batched_tokens=16))
    assert [(b.prefill_tokens, b.prefill_cached, len(b.decode_context)) for b in batches] == [
        ((10,), (0,), 0), ((15,), (0,), 1), ((15,), (15,), 1), ((), (), 1)]
    r0, r1 = res.requests
    assert (r0["ttft_ms"], r0["e2e_ms"], r1["ttft_ms"], r1["e2e_ms"]) == (10.0, 34.0, 33.0, 35.0)
    assert res.iterations == {"prefill": 1, "decode": 1, "mixed": 2}


def test_vllm_v1_preempts_the_latest_admitted_when_blocks_run_out() -> None:
    """Two 8-token prompts in a 24-token cache of 8-token blocks: after both prefills (2 blocks)
    the first decode needs a third block for r0 and a fourth for r1, so r1 (admitted last) is
    preempted and waits to prefill its prompt and token again."""
    batches: list[LLMBatch] = []
    reqs = [RequestSpec(0, 0.0, 8, 3), RequestSpec(1, 0.0, 8, 3)]
    res = simulate_llm(reqs, recording(batches), SchedulerConfig(engine_profile="vllm", kv_capacity_tokens=24,
                                                                  kv_block_tokens=8))
    assert [r["preemptions"] for r in res.requests] == [0, 1]
    assert batches[0].prefill_tokens == (8, 8) and batches[1].decode_context == (9,)   # r0 alone
    assert (9,) in [b.prefill_tokens for b in batches]   # r1 re-prefills prompt + its first token


def test_sglang_admits_until_the_new_token_ratio_estimate_fills_the_pool() -> None:
    """Pool of 1,000 tokens, prompts of 100 with 400 output tokens each. r0: 100 + 400 < 1,000 →
    admitted (room left 500; r1 needs 500, not < 500: the batch ends). Next iteration: free 900 −
    r0's 399 remaining × 0.7 = 620.7 > 500 → r1 admitted. Then free 800 − 2 × 399 × 0.7 = 241.4
    < 500 → decode both; r2 waits."""
    batches: list[LLMBatch] = []
    reqs = [RequestSpec(i, 0.0, 100, 400) for i in range(3)]
    res = simulate_llm(reqs, recording(batches), SchedulerConfig(engine_profile="sglang", kv_capacity_tokens=1000))
    assert [b.prefill_tokens for b in batches[:2]] == [(100,), (100,)]
    assert batches[2].prefill_tokens == () and len(batches[2].decode_context) == 2
    assert res.requests[2]["ttft_ms"] > res.requests[1]["ttft_ms"] + 100 * DECODE_NS / 1e6
    assert sum(r["preemptions"] for r in res.requests) == 0


def test_shared_prefixes_lower_ttft_when_the_engine_caches_them() -> None:
    """Half of every later prompt cached: fewer prompt tokens computed, so a token-priced prefill
    is shorter and TTFT falls; with prefix caching off nothing changes."""
    def by_tokens(batch: LLMBatch) -> float:
        return 1e5 * sum(batch.prefill_tokens) + 1e6 * bool(batch.decode_context)

    reqs = synthetic_workload(30, 20.0, (200, 400), (8, 16), seed=1)
    shared = with_prefix_share(reqs, 0.5)
    assert [r.cached_tokens for r in shared[:3]] == [0, shared[1].prompt_tokens // 2, shared[2].prompt_tokens // 2]

    def mean_ttft(requests: list[RequestSpec], **cfg: object) -> float:
        rows = simulate_llm(requests, by_tokens, SchedulerConfig(engine_profile="vllm", **cfg)).requests  # type: ignore[arg-type]
        return statistics.mean(r["ttft_ms"] for r in rows)

    assert mean_ttft(shared) < 0.7 * mean_ttft(reqs)
    assert mean_ttft(shared, prefix_caching=False) == mean_ttft(reqs)
    with pytest.raises(WorkloadError, match="prefix-share must be in"):
        with_prefix_share(reqs, 1.5)


def test_burstgpt_and_fixed_arrivals() -> None:
    """BurstGPT's generator draws gamma gaps of shape 0.5 (CV √2) at the rate asked; fixed
    arrivals are exactly 1/rate apart."""
    assert BURSTGPT_SHAPE == 0.5
    times = draw_arrivals(20001, 4.0, random.Random(0), Arrivals.BURSTGPT)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(math.sqrt(2), rel=0.05)
    assert draw_arrivals(4, 5.0, random.Random(0), Arrivals.FIXED) == [0.0, 0.2, 0.4, 0.6000000000000001]
    assert draw_arrivals(3, math.inf, random.Random(0), Arrivals.FIXED) == [0.0, 0.0, 0.0]
    with pytest.raises(WorkloadError, match="gamma arrivals need --cv"):
        draw_arrivals(3, 1.0, random.Random(0), Arrivals.GAMMA)
    from whatif.serving import Workload

    assert Workload(rate=2, num_requests=3, arrivals="fixed").llm_requests()[2].arrival_s == 1.0
    assert Workload(rate=2, cv=3.0).kind is Arrivals.GAMMA and Workload(rate=2).kind is Arrivals.POISSON
    with pytest.raises(WorkloadError, match=r"^unknown arrivals 'bursty' \(poisson, gamma, burstgpt, fixed\)$"):
        Workload(rate=2, arrivals="bursty")  # type: ignore[arg-type]


def test_serve_and_sweep_print_and_write_the_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--engine-profile vllm` runs vLLM V1's policy with its caps (a figure given on the command line
    replaces the engine's), prints one capacity line and writes it to the JSON beside the
    workload's arrivals and prefix share."""
    import orjson
    from test_serving import serving_run

    from whatif.cli import main

    run_dir, log = serving_run(tmp_path)
    out = tmp_path / "serve.json"
    assert main(["serve", str(run_dir), "--iterations-log", str(log), "--rate", "50", "--arrivals", "fixed",
                 "--prefix-share", "0.5", "--num-requests", "4", "--prompt-tokens", "100", "--output-tokens", "3",
                 "--engine-profile", "vllm", "--max-seqs", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "capacity per replica: vllm: KV unlimited" in text and "4 seqs, 2,048 batched tokens" in text
    doc = orjson.loads(out.read_bytes())
    sched, (s,) = doc["scheduler"], doc["scenarios"]
    assert (sched["engine_profile"], sched["policy"], sched["max_seqs"], sched["max_batched_tokens"]) == \
        ("vllm", "vllm-v1", 4, 2048)
    assert sched["prefix_caching"] is True and sched["capacity"]["given"] == ["max_seqs"]
    assert s["capacity"]["max_seqs"] == 4 and s["capacity"]["kv_tokens"] is None
    assert (doc["workload"]["arrivals"], doc["workload"]["prefix_share"]) == ("fixed", 0.5)
    assert main(["sweep", str(run_dir), "--iterations-log", str(log), "--rates", "10", "--num-requests", "3",
                 "--engine-profile", "sglang"]) == 0
    assert "capacity per replica: sglang: KV unlimited" in capsys.readouterr().out


def dit_model():
    """A launch-free DiT step: 1 ms of GPU work per model-batch element at 64 tokens, attention half of it."""
    from whatif.predictors.serving import DitStepModel

    return DitStepModel(tokens_ref=64, attn=(0.0, 0.5e6), rest=(0.0, 0.5e6), cpu=(0.0, 0.0), overlap_ns=0.0,
                        batch_overhead_ns=0.0, n=1, mape=0.0, loo_mape=0.0)


def test_dit_batches_share_one_shape() -> None:
    """Two requests at t=0 with max batch 2: one batch when they share steps and tokens (2 steps of
    model batch 4 at 64 tokens: 2 × 4 ms), two batches in arrival order when their steps differ."""
    from whatif.predictors.serving import simulate_dit

    same = simulate_dit([0.0, 0.0], dit_model(), 2, 64, 2)
    assert same.summary["num_batches"] == 1 and [r["latency_ms"] for r in same.requests] == [8.0, 8.0]
    apart = simulate_dit([0.0, 0.0], dit_model(), 2, 64, 2, shapes=[(2, 64), (4, 64)])
    assert apart.summary["num_batches"] == 2 and [r["latency_ms"] for r in apart.requests] == [4.0, 12.0]
    assert apart.iterations == {"denoise": 6}


def test_dit_workload_files_give_resolution_and_steps(tmp_path: Path) -> None:
    """A DiT workload file's rows may carry their resolution and steps; bad rows are one line naming
    the file and row; a resolution the recorded patch does not divide names the request."""
    from whatif.predictors.serving.arrivals import read_dit_workload
    from whatif.serving import Workload, serve

    f = tmp_path / "dit.csv"
    f.write_text("ts,res,steps\n0,16,\n0.5,32,3\n")
    reqs = read_dit_workload(f, {"arrival_s": "ts", "resolution": "res"})
    assert [(r.arrival_s, r.resolution, r.steps) for r in reqs] == [(0.0, 16, None), (0.5, 32, 3)]
    for body, message in (("arrival_s,resolution\n0,abc\n", r"dit.csv:2: resolution = 'abc' is not a number$"),
                          ("arrival_s,steps\n0,1\n1,2.5\n", r"dit.csv:3: steps = '2.5' is not a whole number$"),
                          ("arrival_s,steps\n0,0\n", r"dit.csv:2: steps must be >= 1$"),
                          ("t,steps\n0,1\n", r"dit.csv:1: no column 'arrival_s' in the header \(t, steps\)"),
                          ("arrival_s\n-1\n", r"dit.csv:2: arrival_s = '-1' must be finite and >= 0$")):
        f.write_text(body)
        with pytest.raises(WorkloadError, match=message):
            read_dit_workload(f)
    dit = ROOT / "sample_traces" / "dit_serve"
    small, large = tmp_path / "small.csv", tmp_path / "large.csv"
    small.write_text("arrival_s,resolution,steps\n0,16,2\n1,16,2\n")
    large.write_text("arrival_s,resolution,steps\n0,32,2\n1,32,2\n")
    lat = [serve(dit, workload=Workload(file=w)).scenarios[0].e2e_ms.get("mean") for w in (small, large)]
    assert lat[1] > lat[0]
    large.write_text("arrival_s,resolution\n0,15\n")
    with pytest.raises(WorkloadError, match=r"^request 0: resolution 15 is not a multiple of the recorded patch"):
        serve(dit, workload=Workload(file=large))


def test_disaggregated_hand_off_is_priced_over_the_peer_link() -> None:
    """Prefill on one replica (10 ms), then the prompt's KV cache crosses the A100's NVLink:
    10 tokens × 512 KiB over its peer bandwidth; the decode replica's two tokens follow (2 ms each)."""
    from whatif.predictors.serving.capacity import engine_capacity
    from whatif.transforms.parallel.memory import ModelShape

    a100 = get_device("A100_SXM_80GB")
    shape = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, weight_bytes=13.5e9)
    cap = engine_capacity("vllm-v0", shape, GpuMemory(a100.name, a100.mem_bytes),
                          peer_bw_bytes_per_s=a100.peer_copy_bw_bytes_per_s)
    hand_off_ms = 10 * 512 * 1024 / a100.peer_copy_bw_bytes_per_s * 1e3
    (r,) = simulate_llm([RequestSpec(0, 0.0, 10, 3)], recording([]), SchedulerConfig(policy="disagg"),
                        capacity=cap).requests
    assert r["ttft_ms"] == 10.0 and r["e2e_ms"] == pytest.approx(14.0 + hand_off_ms)
    (given,) = simulate_llm([RequestSpec(0, 0.0, 10, 3)], recording([]),
                            SchedulerConfig(policy="disagg", kv_transfer_ns_per_token=1e5), capacity=cap).requests
    assert given["e2e_ms"] == pytest.approx(15.0)


@pytest.mark.parametrize(("flags", "named"), [(["--engine-profile", "trt"], "--engine-profile"),
                                               (["--prefix-share", "1.5"], "--prefix-share"),
                                               (["--arrivals", "bursty"], "--arrivals")])
def test_bad_engine_and_workload_options_are_usage_errors(flags: list[str], named: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from whatif.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(ROOT / "sample_traces" / "llm_serve"), "--rate", "1", *flags])
    assert exit_.value.code == 2 and named in capsys.readouterr().err
