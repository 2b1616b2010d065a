"""Serving predictions: simulator mechanics on hand-computable cases, arrivals, workload files,
the iteration-model fit on a hand-made trace, and the `whatif serve`/`sweep` JSON."""
from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import orjson
import pytest
from tracegen import KinetoTrace

from whatif.cli import main
from whatif.predictors.serving import (
    LLMBatch,
    RequestSpec,
    SchedulerConfig,
    ServingLogError,
    WorkloadError,
    gamma_arrivals,
    poisson_arrivals,
    read_workload,
    simulate_llm,
    synthetic_workload,
)

PREFILL_NS, DECODE_NS = 10e6, 2e6


def flat(batch: LLMBatch) -> float:
    """Prefill 10 ms, decode 2 ms, whatever the batch (a mixed batch costs both)."""
    return (PREFILL_NS if batch.prefill_tokens else 0.0) + (DECODE_NS if batch.decode_context else 0.0)


def run(reqs: list[tuple[float, int, int]], **cfg: object) -> list[dict]:
    specs = [RequestSpec(i, a, p, o) for i, (a, p, o) in enumerate(reqs)]
    return simulate_llm(specs, flat, SchedulerConfig(**cfg)).requests  # type: ignore[arg-type]


def test_one_request_ttft_is_the_prefill_and_tpot_the_decode() -> None:
    (r,) = run([(0.0, 10, 3)])
    assert (r["queue_ms"], r["ttft_ms"], r["tpot_ms"], r["e2e_ms"]) == (0.0, 10.0, 2.0, 14.0)


def test_two_requests_contend_prefill_first() -> None:
    # r1 arrives during r0's prefill; its prefill runs next (prefill-prioritizing), stalling r0's decode
    r0, r1 = run([(0.0, 10, 3), (0.001, 10, 3)])
    assert (r0["ttft_ms"], r0["tpot_ms"], r0["e2e_ms"]) == (10.0, 7.0, 24.0)  # tokens at 10, 22, 24
    assert (r1["queue_ms"], r1["ttft_ms"], r1["tpot_ms"]) == (9.0, 19.0, 2.0)  # tokens at 20, 22, 24


def test_simultaneous_arrivals_share_one_prefill() -> None:
    r0, r1 = run([(0.0, 10, 2), (0.0, 10, 2)])
    assert r0["ttft_ms"] == r1["ttft_ms"] == 10.0 and r0["e2e_ms"] == r1["e2e_ms"] == 12.0


def test_max_seqs_makes_the_second_request_wait() -> None:
    r0, r1 = run([(0.0, 10, 2), (0.0, 10, 2)], max_seqs=1)
    assert r0["e2e_ms"] == 12.0 and r1["ttft_ms"] == 22.0


def test_preemption_when_the_kv_cache_is_full() -> None:
    # 6 blocks of 8 tokens; two 24-token prompts fill them; r0's first decode needs a 4th block:
    # r1 (admitted last) is preempted, waits for r0 to finish, then recomputes 24 + 1 tokens.
    r0, r1 = run([(0.0, 24, 3), (0.0, 24, 3)], kv_capacity_tokens=48, kv_block_tokens=8)
    assert (r0["e2e_ms"], r0["preemptions"]) == (14.0, 0)            # 10, 12, 14
    assert (r1["ttft_ms"], r1["e2e_ms"], r1["preemptions"]) == (10.0, 26.0, 1)  # 10, 24, 26


def test_a_request_larger_than_the_kv_cache_is_refused() -> None:
    with pytest.raises(WorkloadError, match="do not fit in the KV cache"):
        run([(0.0, 100, 3)], kv_capacity_tokens=64)


def test_static_batching_waits_for_the_batch_continuous_does_not() -> None:
    reqs = [(0.0, 10, 5), (0.001, 10, 2)]
    cont = run(reqs, policy="vllm")
    static = run(reqs, policy="static")
    assert cont[1]["ttft_ms"] == 19.0           # joins at the next iteration
    assert static[0]["e2e_ms"] == 18.0          # r0 alone: 10 + 4 x 2
    assert static[1]["ttft_ms"] == 27.0         # r1 waits for r0's batch to end (18 ms), then 10 ms


def test_chunked_prefill_splits_a_long_prompt_and_mixes_decodes() -> None:
    # chunk budget 40 tokens: a 100-token prompt takes 3 iterations (40, 40, 20)
    (r,) = run([(0.0, 100, 2)], policy="chunked", chunk_tokens=40, max_batched_tokens=40)
    assert r["ttft_ms"] == 30.0 and r["e2e_ms"] == 32.0
    # a decode that shares an iteration with a chunk pays for both (10 + 2 ms)
    r0, r1 = run([(0.0, 10, 3), (0.005, 10, 2)], policy="chunked")
    assert (r0["ttft_ms"], r0["e2e_ms"]) == (10.0, 24.0)  # tokens at 10, 22 (mixed iteration), 24
    assert r1["ttft_ms"] == 17.0


def test_disaggregation_hands_the_kv_cache_to_a_decode_replica() -> None:
    (r,) = run([(0.0, 10, 3)], policy="disagg", kv_transfer_ns_per_token=100_000.0)  # 1 ms for 10 tokens
    assert (r["ttft_ms"], r["e2e_ms"]) == (10.0, 15.0)  # 10 prefill, 1 transfer, 2 x 2 decode


def test_replicas_serve_in_parallel() -> None:
    r0, r1 = run([(0.0, 10, 2), (0.0, 10, 2)], replicas=2, max_seqs=1)
    assert r0["e2e_ms"] == r1["e2e_ms"] == 12.0 and {r0["replica"], r1["replica"]} == {0, 1}


def test_summary_throughput_and_goodput() -> None:
    specs = [RequestSpec(0, 0.0, 10, 3)]
    s = simulate_llm(specs, flat, SchedulerConfig(), slo_ttft_ms=5.0).summary
    assert s["throughput_tokens_per_s"] == pytest.approx(3 / 0.014)
    assert s["slo"]["attainment"] == 0.0 and s["busy_fraction"] == pytest.approx(1.0)
    assert set(s["ttft_ms"]) == {"mean", "p50", "p90", "p99"}


def test_arrivals_are_deterministic_with_a_seed() -> None:
    a = poisson_arrivals(50, 10.0, random.Random(3))
    assert a == poisson_arrivals(50, 10.0, random.Random(3)) != poisson_arrivals(50, 10.0, random.Random(4))
    assert a[0] == 0.0 and a == sorted(a)
    g = gamma_arrivals(2000, 10.0, 3.0, random.Random(1))
    assert g == gamma_arrivals(2000, 10.0, 3.0, random.Random(1))
    gaps = [y - x for x, y in itertools.pairwise(g)]
    mean = sum(gaps) / len(gaps)
    cv = (sum((x - mean) ** 2 for x in gaps) / len(gaps)) ** 0.5 / mean
    assert mean == pytest.approx(0.1, rel=0.15) and cv == pytest.approx(3.0, rel=0.2)
    assert poisson_arrivals(3, float("inf"), random.Random(0)) == [0.0, 0.0, 0.0]


def test_synthetic_workload_draws_what_the_example_draws() -> None:
    # examples/llm_serve.py: Random(seed); Poisson arrivals; then randint(prompt), randint(output) per request
    rng = random.Random(7)
    arrivals = poisson_arrivals(5, 4.0, rng)
    expected = [(a, rng.randint(16, 64), rng.randint(32, 128)) for a in arrivals]
    got = synthetic_workload(5, 4.0, (16, 64), (32, 128), seed=7)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in got] == expected


@pytest.mark.parametrize("name,text,message", [
    ("w.csv", "arrival_s,prompt_tokens\n0,10\n", "w.csv:1: no column 'output_tokens'"),
    ("w.csv", "arrival_s,prompt_tokens,output_tokens\n0,ten,3\n", "w.csv:2: prompt_tokens = 'ten' is not a number"),
    ("w.csv", "arrival_s,prompt_tokens,output_tokens\n-1,10,3\n", "w.csv:2: arrival_s = '-1' must be finite"),
    ("w.csv", "arrival_s,prompt_tokens,output_tokens\n0,10.5,3\n", "w.csv:2: prompt_tokens = '10.5' is not a whole"),
    ("w.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n{oops\n', "w.jsonl:2: not a JSON object"),
    ("w.jsonl", '{"arrival_s": 0, "prompt_tokens": 1}\n', "w.jsonl:1: missing 'output_tokens'"),
    ("w.csv", "", "w.csv: empty CSV file"),
])
def test_workload_file_errors_are_one_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(WorkloadError) as exc:
        read_workload(tmp_path / name)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_workload_file_column_mapping_and_units(tmp_path: Path) -> None:
    (tmp_path / "w.csv").write_text("ts,in,out\n1500,10,3\n500,20,4\n")
    reqs = read_workload(tmp_path / "w.csv", {"arrival_s": "ts", "prompt_tokens": "in", "output_tokens": "out"}, 1e-3)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 20, 4), (1.0, 10, 3)]


# ----------------------------------------------------------------------------- fit on a hand-made trace
# Each iteration: step begins, 6 us later its phase op starts, the step ends 3 us after the op ->
# iteration time = op + 9 us. Decode op = 100 + 20 us per sequence - 1, prefill op = 200 + 2 us per token - 1.

PROMPTS = [10, 20, 30, 40, 25]
SCHEDULE = [("prefill", [0]), ("decode", [0]), ("prefill", [1, 2]), ("decode", [0, 1, 2]), ("decode", [0, 1, 2]),
            ("prefill", [3]), ("decode", [0, 1, 2, 3]), ("decode", [0, 1, 2, 3]), ("prefill", [4]),
            ("decode", [1, 2, 3, 4]), ("decode", [2, 3, 4]), ("decode", [4])]


def iteration_us(phase: str, ids: list[int]) -> float:
    return 208 + 2 * sum(PROMPTS[i] for i in ids) if phase == "prefill" else 108 + 20 * len(ids)


def serving_run(tmp_path: Path, warmup_us: float = 0.0) -> tuple[Path, Path]:
    """A serving loop following the law of :func:`iteration_us`; ``warmup_us``: start-up cost
    inside the first iteration (ProfilerStep#0)."""
    tr, t = KinetoTrace(gpu_name=""), 0.0
    iterations = []
    for n, (phase, ids) in enumerate(SCHEDULE):
        total = iteration_us(phase, ids) + (warmup_us if n == 0 else 0.0)
        tr.step(n, t, total)
        tr.annotation(f"phase:{phase}", t + 5, total - 7)
        tr.op("aten::linear", t + 6, total - 9)
        iterations.append({"index": n, "phase": phase, "request_ids": ids, "batch_size": len(ids),
                           "duration_ms": (total - 7) / 1e3})
        t += total
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tr.write(run_dir / "rank0.pt.trace.json.gz")
    log = tmp_path / "serve.log"
    log.write_text(json.dumps({"schema": "whatif.examples.llm_serve/1", "config": {},
                               "requests": [{"id": i, "prompt_tokens": p} for i, p in enumerate(PROMPTS)],
                               "iterations": iterations}))
    return run_dir, log


def test_fit_recovers_the_iteration_law(tmp_path: Path) -> None:
    from whatif.api import analyze
    from whatif.predictors.serving import fit_llm_model
    from whatif.predictors.serving.iteration_model import replayed_iterations
    from whatif.predictors.serving.logs import llm_compositions, read_log

    run_dir, log = serving_run(tmp_path)
    model = fit_llm_model(replayed_iterations(analyze(run_dir).replay), llm_compositions(read_log(log)))
    assert model.loop_overhead_ns == 6_000
    dec, pre = model.fits["decode"], model.fits["prefill"]
    assert dec.features == ("seqs",) and dec.coef["seqs"] == pytest.approx(20_000) and dec.r2 == pytest.approx(1.0)
    assert pre.features == ("tokens",) and pre.coef["tokens"] == pytest.approx(2_000)
    assert model.time_ns(LLMBatch(decode_context=(50,) * 7)) == pytest.approx((108 + 140) * 1e3)
    assert model.time_ns(LLMBatch(prefill_tokens=(100,), prefill_cached=(0,))) == pytest.approx(408e3)


def test_fit_leaves_the_warmup_step_out_unless_asked(tmp_path: Path) -> None:
    run_dir, log = serving_run(tmp_path, warmup_us=500)
    out, wide = tmp_path / "serve.json", tmp_path / "serve_all.json"
    flags = ["serve", str(run_dir), "--iterations-log", str(log), "--rate", "inf", "--num-requests", "1",
             "--prompt-tokens", "100", "--output-tokens", "3", "-q"]
    assert main([*flags, "--json", str(out)]) == 0
    assert main([*flags, "--include-warmup", "--json", str(wide)]) == 0
    (s,) = orjson.loads(out.read_bytes())["scenarios"]
    (w,) = orjson.loads(wide.read_bytes())["scenarios"]
    model, with_warmup = s["iteration_model"], w["iteration_model"]
    assert model["excluded_iterations"] == [{"step": 0, "phase": "prefill", "excluded": "warm-up"}]
    assert model["phases"]["prefill"]["n"] == 3 and model["phases"]["prefill"]["r2"] == pytest.approx(1.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(0.408)   # the law, start-up not priced into prefills
    assert with_warmup["excluded_iterations"] == [] and with_warmup["phases"]["prefill"]["n"] == 4
    assert with_warmup["phases"]["prefill"]["r2"] < 0.99 and abs(w["ttft_ms"]["mean"] - 0.408) > 0.005
    curve = tmp_path / "sweep.json"
    assert main(["sweep", str(run_dir), "--iterations-log", str(log), "--rates", "10", "--num-requests", "3",
                 "--include-warmup", "--json", str(curve), "-q"]) == 0
    assert orjson.loads(curve.read_bytes())["curves"][0]["iteration_model"]["phases"]["prefill"]["n"] == 4


def test_serve_cli_json_keys_and_hand_computed_latency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, log = serving_run(tmp_path)
    out = tmp_path / "serve.json"
    assert main(["serve", str(run_dir), "--iterations-log", str(log), "--rate", "inf", "--num-requests", "1",
                 "--prompt-tokens", "100", "--output-tokens", "3", "--json", str(out), "--requests"]) == 0
    doc = orjson.loads(out.read_bytes())
    assert doc["schema"] == "whatif.serving/1" and doc["kind"] == "llm"
    (s,) = doc["scenarios"]
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert {"mean", "p50", "p99"} <= set(s[key])
    assert s["ttft_ms"]["mean"] == pytest.approx(0.408)   # prefill of 100 tokens: 208 + 200 us
    assert s["tpot_ms"]["mean"] == pytest.approx(0.128)   # decode of one sequence: 108 + 20 us
    assert s["throughput_tokens_per_s"] == pytest.approx(3 / (0.408 + 2 * 0.128) * 1e3)
    assert len(s["requests"]) == 1 and "TTFT" in capsys.readouterr().out


def test_sweep_cli_gives_one_point_per_rate(tmp_path: Path) -> None:
    run_dir, log = serving_run(tmp_path)
    out, html = tmp_path / "sweep.json", tmp_path / "sweep.html"
    assert main(["sweep", str(run_dir), "--iterations-log", str(log), "--rates", "10,100,1000", "--num-requests", "30",
                 "--prompt-tokens", "10:40", "--output-tokens", "2:8", "--json", str(out), "--html", str(html),
                 "-q"]) == 0
    doc = orjson.loads(out.read_bytes())
    (curve,) = doc["curves"]
    assert [p["rate_req_per_s"] for p in curve["points"]] == [10.0, 100.0, 1000.0]
    ttft = [p["ttft_ms"]["mean"] for p in curve["points"]]
    assert ttft[0] <= ttft[1] <= ttft[2] and html.stat().st_size > 0
    page = html.read_text()
    assert "<script src=\"http" not in page and "Plotly.newPlot" in page   # plotly inline: renders offline


def test_serve_without_a_log_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _ = serving_run(tmp_path)
    assert main(["serve", str(run_dir), "--rate", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("whatif: ") and "--iterations-log" in err and err.count("\n") == 1


def test_an_undefined_loo_error_says_why() -> None:
    """A phase fitted as a constant (too few or identical iterations) has no leave-one-out error:
    its line says why, not ``nan%``."""
    from whatif.commands.serve import describe_phase_fit
    from whatif.documents import PhaseFitEntry

    def fit(n: int, loo: float) -> PhaseFitEntry:
        return PhaseFitEntry(phase="prefill", features=[], intercept_ns=1e6, coef={}, n=n, r2=0.0, mape=0.1,
                             loo_mape=loo, candidates={})
    assert describe_phase_fit("prefill", fit(1, float("nan"))) == \
        "prefill: constant (n=1, R²=0.00, MAPE 10.0%, LOO n/a (one iteration))"
    assert describe_phase_fit("prefill", fit(3, float("nan"))).endswith("LOO n/a (too few distinct iterations to fit))")
    assert describe_phase_fit("prefill", fit(3, 0.052)).endswith("LOO 5.2%)")


def test_python_serve_on_the_sample_run_a_faster_scenario_lowers_ttft_and_tpot() -> None:
    from whatif.api import Workload, serve, sweep
    from whatif.documents import LlmServingDocument, ServingDocument, from_json, to_json

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve"
    doc = serve(sample, [sample.parents[1] / "scenarios" / "faster_linear.toml"], Workload(rate=10, num_requests=20))
    assert isinstance(doc, LlmServingDocument)
    assert doc.schema == "whatif.serving/1" and doc.kind == "llm" and doc.log.endswith("serving.log")
    base, fast = doc.scenarios
    assert base.name == "baseline" and fast.name == "linear 2x faster"
    for s in (base, fast):
        assert s.ttft_ms.get("mean") and s.ttft_ms.get("p99") and s.throughput_tokens_per_s and s.e2e_ms.get("mean")
    assert fast.ttft_ms.get("mean") < base.ttft_ms.get("mean") and fast.tpot_ms.get("mean") < base.tpot_ms.get("mean")
    curves = sweep(sample, [5, 40], workload=Workload(num_requests=10)).curves
    assert [p.rate_req_per_s for p in curves[0].points] == [5.0, 40.0]
    assert from_json(to_json(doc), ServingDocument) == doc  # the JSON reads back to the same document


def test_python_serve_errors_are_one_line(tmp_path: Path) -> None:
    from whatif.api import Workload, serve

    run_dir, _ = serving_run(tmp_path)
    with pytest.raises(ServingLogError, match=r"no serving log.*--iterations-log") as info:
        serve(run_dir, workload=Workload(rate=1))
    assert "\n" not in str(info.value)
    with pytest.raises(WorkloadError, match="rate"):
        serve(run_dir, workload=Workload())


def test_kv_capacity_from_the_memory_model(tmp_path) -> None:
    """Without --kv-capacity the serving simulator's KV capacity comes from the recorded model and
    GPU (vLLM's 0.9 of memory less the weights, over the KV bytes per token); a recording without
    transformer blocks (the CPU example servers) stays unlimited and says why."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from _llm_tracegen import llm_trace

    from whatif.api import analyze
    from whatif.predictors.serving.simulator import SchedulerConfig
    from whatif.serving import recorded_kv_capacity

    a = analyze(llm_trace(tmp_path / "gqa.json.gz", new_tokens=16, layers=8, heads=32, kv_heads=8, steps=1))
    tokens, source = recorded_kv_capacity(a.graph)
    weights = 8 * (4096 * (32 + 16) * 128 + 4096 ** 2 + 3 * 4096 * 11008) * 2
    per_token = 2 * 8 * 8 * 128 * 2
    assert tokens == int((0.9 * 80 * 2**30 - weights) // per_token)          # H100 80 GB in the catalog
    assert source.startswith("memory model") and "8 KV heads" in source
    cpu = analyze(Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve")
    none, why = recorded_kv_capacity(cpu.graph)
    assert none is None and why.startswith("unlimited: ") and "transformer block" in why
    assert SchedulerConfig().kv_capacity_tokens is None


def test_kv_capacity_after_a_scenarios_transforms(tmp_path) -> None:
    """A scenario's transforms place the replica: tensor parallelism over t GPUs holds the weights
    and KV heads t ways (t× the tokens, plus what the weights freed); PIM stacks that run decode
    attention hold the KV cache in what their capacity leaves after offloaded weights (AttAcc)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from _llm_tracegen import llm_trace

    from whatif.api import analyze, make_context
    from whatif.serving import recorded_kv_capacity
    from whatif.transforms.parallel.pim import PimOffload
    from whatif.transforms.parallel.tensor import TensorParallel
    from whatif.transforms.placement import Placement
    from whatif.transforms.scenario import scenario_placement

    a = analyze(llm_trace(tmp_path / "gqa.json.gz", batch=16, new_tokens=1, layers=8, heads=32, kv_heads=8, steps=1))
    ctx = make_context(a.trace)
    weights = 8 * (4096 * (32 + 16) * 128 + 4096 ** 2 + 3 * 4096 * 11008) * 2
    one, _ = recorded_kv_capacity(a.graph)
    tp = TensorParallel(degree=2, topology="dgx_h100")
    p = scenario_placement([tp], [a.graph], ctx)
    assert p == Placement(tensor=2)
    two, source = recorded_kv_capacity(a.graph, p)
    assert two == int((0.9 * 80 * 2**30 - weights / 2) // (2 * 8 * 4 * 128 * 2)) and two > 2 * one
    assert "tensor 2 x pipeline 1" in source
    pim = PimOffload(max_intensity=4)   # batch 16: the GEMMs (intensity ~16) stay, decode attention goes
    g = tp.apply(a.graph, ctx)
    p = scenario_placement([tp, pim], [a.graph, g], ctx)
    assert p.tensor == 2 and p.weights_moved_bytes == 0 and p.kv_home_bytes == 80e9
    pim_tokens, source = recorded_kv_capacity(a.graph, p)
    assert pim_tokens == int(80e9 // (2 * 8 * 4 * 128 * 2)) and "attacc PIM stacks" in source


def test_kv_capacity_on_another_gpu_and_with_narrower_weights(tmp_path) -> None:
    """`gpu` puts the replica in the destination's memory (an H200's 141 GB hold more KV than the
    recorded H100's 80 GiB; an L40S's 48 GB less); `precision` fp8 stores the bf16 weights in half
    the bytes and int4 weight-only in a quarter, which the KV cache gets; a `gpu` move of only some
    kernels keeps the recorded memory."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from _llm_tracegen import llm_trace

    from whatif.api import analyze, make_context
    from whatif.hardware.devices import get_device
    from whatif.serving import recorded_kv_capacity
    from whatif.transforms.optimizations.gpu import Gpu
    from whatif.transforms.optimizations.precision import Precision
    from whatif.transforms.placement import Placement
    from whatif.transforms.scenario import scenario_placement
    from whatif.transforms.select import Selector

    a = analyze(llm_trace(tmp_path / "gqa.json.gz", batch=16, new_tokens=1, layers=8, heads=32, kv_heads=8, steps=1))
    ctx = make_context(a.trace)
    weights = 8 * (4096 * (32 + 16) * 128 + 4096 ** 2 + 3 * 4096 * 11008) * 2
    per_token = 2 * 8 * 8 * 128 * 2
    one, _ = recorded_kv_capacity(a.graph)
    for dest in ("H200", "L40S"):
        p = scenario_placement([Gpu(device=dest)], [a.graph], ctx)
        assert p == Placement(device=dest)
        tokens, source = recorded_kv_capacity(a.graph, p)
        assert tokens == int((0.9 * get_device(dest).mem_bytes - weights) // per_token)
        assert f"on {dest}" in source
        assert (tokens > one) == (dest == "H200")
    part = Gpu(device="H200", select=Selector(kind="kernel", name="gemm"))
    assert scenario_placement([part], [a.graph], ctx) == Placement()
    for dtype, scale in (("fp8", 0.5), ("int4_weight", 0.25)):
        p = scenario_placement([Precision(dtype=dtype)], [a.graph], ctx)
        assert p.weights_scale == pytest.approx(scale)
        tokens, source = recorded_kv_capacity(a.graph, p)
        assert tokens == int((0.9 * 80 * 2**30 - weights * p.weights_scale) // per_token) > one
        assert f"weights at {scale:g}x" in source
    both = scenario_placement([Precision(dtype="fp8"), Gpu(device="H200")], [a.graph, a.graph], ctx)
    assert both == Placement(device="H200", weights_scale=0.5)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["iterations"][0].update(phase="denoise"), "Invalid enum value 'denoise'"),
    (lambda d: d["iterations"][0].update(request_ids=[99]), "iteration 0 names request 99"),
    (lambda d: d["requests"][0].update(prompt_tokens=2 ** 40), "Expected `int` <="),
    (lambda d: d["iterations"][1].update(duration_ms=-1), "Expected `float` >= 0"),
    (lambda d: d.update(iterations=[]), "has no iterations"),
    (lambda d: d.update(schema="whatif.examples.other/1"), "not a serving log (expected schema"),
])
def test_a_corrupt_serving_log_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit,
                                           message: str) -> None:
    run_dir, log = serving_run(tmp_path)
    doc = json.loads(log.read_text())
    edit(doc)
    log.write_text(json.dumps(doc))
    assert main(["serve", str(run_dir), "--iterations-log", str(log), "--rate", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"whatif: {log}: ") and message in err and err.count("\n") == 1


def test_a_dit_log_with_bad_config_is_one_line(tmp_path: Path) -> None:
    from whatif.predictors.serving.logs import ServingLogError, read_log

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "dit_serve" / "serving.log"
    doc = json.loads(sample.read_text())
    assert read_log(sample).config.patch == doc["config"]["patch"]
    doc["config"]["patch"] = 0
    (tmp_path / "dit.log").write_text(json.dumps(doc))
    with pytest.raises(ServingLogError, match=r"Expected `int` >= 1 - at `\$.config.patch`"):
        read_log(tmp_path / "dit.log")
