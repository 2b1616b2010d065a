"""The example workloads (examples/): they run on CPU, log what they claim, and are correct.

Tiny configs, in-process (one subprocess run checks the ``__main__`` entry point). Timing
values are only checked for ordering, never for magnitude.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

from whatif.tracer import markers  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` the way ``python examples/<name>.py`` would see its folder
    (examples/ is not a package; the scripts import their sibling ``_runtime``)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def llm() -> ModuleType:
    return load("llm_serve")


@pytest.fixture(scope="module")
def dit() -> ModuleType:
    return load("dit_serve")


@pytest.fixture(scope="module")
def train() -> ModuleType:
    return load("train")


@pytest.fixture
def step_counter():
    """Counts ``whatif.step()`` calls while the test runs."""
    calls: list[int] = []

    def hook() -> None:
        calls.append(1)

    markers.add_step_hook(hook)
    yield calls
    markers.remove_step_hook(hook)


LLM_TINY = ["--device", "cpu", "--threads", "1", "--layers", "1", "--d-model", "32", "--heads", "2",
            "--vocab", "64", "--max-seq", "64", "--warmup", "1"]


def run_llm(llm: ModuleType, tmp_path: Path, *extra: str, name: str = "llm.json") -> dict[str, Any]:
    log = tmp_path / name
    assert llm.main([*LLM_TINY, "--log", str(log), *extra]) == 0
    return json.loads(log.read_text())


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- llm_serve


def test_llm_serves_every_request_and_logs_it(llm, tmp_path, step_counter):
    args = ["--num-requests", "6", "--rate", "200", "--prompt-min", "4", "--prompt-max", "9",
            "--output-min", "2", "--output-max", "6", "--max-batch", "4"]
    log = run_llm(llm, tmp_path, *args)
    wanted = llm.make_requests(llm.parse_args([*LLM_TINY, *args]))
    assert log["schema"] == llm.SCHEMA and log["config"]["max_batch"] == 4
    reqs = log["requests"]
    assert [r["id"] for r in reqs] == list(range(6))
    for r, w in zip(reqs, wanted):
        assert r["output_tokens"] == w.output_tokens == len(r["output_token_ids"]) == len(r["token_times_s"])
        assert r["prompt_tokens"] == len(w.prompt)
        assert r["arrival_s"] == pytest.approx(w.arrival_s)
        assert r["ttft_ms"] > 0
        assert r["arrival_s"] <= r["admitted_s"] < r["first_token_s"] <= r["finish_s"]
        assert r["e2e_ms"] >= r["ttft_ms"]
        assert r["token_times_s"] == sorted(r["token_times_s"])
        assert all(0 <= t < 64 for t in r["output_token_ids"])
        assert (r["tpot_ms"] is None) == (r["output_tokens"] == 1)
    its = log["iterations"]
    assert {it["phase"] for it in its} <= {"prefill", "decode"}
    assert all(it["start_s"] <= it["end_s"] for it in its)
    assert all(it["batch_size"] <= 4 for it in its)
    # every output token comes from exactly one iteration: prefill gives the first, decode the rest
    assert sum(it["batch_size"] for it in its) == sum(r["output_tokens"] for r in reqs)
    assert sum(it["phase"] == "prefill" for it in its) >= 1
    s = log["summary"]
    assert s["num_requests"] == 6 and s["num_iterations"] == len(its) == len(step_counter)
    assert s["num_prefill_iterations"] + s["num_decode_iterations"] == len(its)
    assert s["output_tokens"] == sum(r["output_tokens"] for r in reqs)
    assert s["ttft_ms"]["p50"] <= s["ttft_ms"]["p99"] and s["output_throughput_tok_s"] > 0


def test_llm_kv_cache_decode_matches_full_forward(llm):
    args = llm.parse_args([*LLM_TINY, "--layers", "2"])
    model = llm.build_model(args, torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(64, (n,), generator=g).tolist() for n in (12, 9)]
    prompt_lens = [5, 7]
    slots = [2, 0]  # not in order: the cache must be addressed by slot
    with torch.inference_mode():
        cache = model.new_cache(3)
        full = [model(torch.tensor([s]))[0] for s in seqs]
        logits = model.prefill([s[:n] for s, n in zip(seqs, prompt_lens)], slots, cache)
        for i, n in enumerate(prompt_lens):
            torch.testing.assert_close(logits[i], full[i][n - 1], rtol=1e-4, atol=1e-4)
        # decode both sequences together, one token per step, until the shorter one ends
        for step in range(min(len(s) - n for s, n in zip(seqs, prompt_lens))):
            pos = [n + step for n in prompt_lens]
            logits = model.decode([s[p] for s, p in zip(seqs, pos)], pos, slots, cache)
            for i, p in enumerate(pos):
                torch.testing.assert_close(logits[i], full[i][p], rtol=1e-4, atol=1e-4)
        # the decode path really reads the cache: with it wiped, the logits change
        for k, v in zip(cache.k, cache.v):
            k.zero_(), v.zero_()
        wiped = model.decode([seqs[0][5]], [5], [2], cache)
        assert not torch.allclose(wiped[0], full[0][5], atol=1e-3)


def test_llm_continuous_batching_admits_while_decoding(llm, tmp_path):
    workload = write_jsonl(tmp_path / "w.jsonl", [
        {"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 200},
        {"arrival_s": 0.005, "prompt_tokens": 6, "output_tokens": 4},
    ])
    log = run_llm(llm, tmp_path, "--workload", str(workload), "--max-seq", "256")
    its = log["iterations"]
    assert its[0]["phase"] == "prefill" and its[0]["request_ids"] == [0]
    late = [it for it in its if it["phase"] == "prefill" and it["request_ids"] == [1]]
    assert len(late) == 1 and late[0]["num_running"] == 1  # admitted while request 0 runs
    shared = [it for it in its if it["phase"] == "decode" and it["request_ids"] == [0, 1]]
    assert len(shared) == 3  # request 1's 3 decode tokens are batched with request 0
    r0, r1 = log["requests"]
    assert r1["finish_s"] < r0["finish_s"] and r0["output_tokens"] == 200 and r1["output_tokens"] == 4


def test_llm_respects_batch_and_token_limits(llm, tmp_path):
    rows = [{"arrival_s": 0.0, "prompt_tokens": 6, "output_tokens": 3} for _ in range(5)]
    workload = write_jsonl(tmp_path / "w.jsonl", rows)
    log = run_llm(llm, tmp_path, "--workload", str(workload), "--max-batch", "3",
                  "--max-batched-tokens", "12")
    its = log["iterations"]
    assert max(it["num_tokens"] for it in its if it["phase"] == "prefill") <= 12
    assert max(it["batch_size"] for it in its) <= 3
    assert max(it["num_running"] + it["batch_size"] * (it["phase"] == "prefill") for it in its) <= 3
    assert its[0]["request_ids"] == [0, 1] and its[1]["request_ids"] == [2]  # 12-token budget
    assert all(r["output_tokens"] == 3 for r in log["requests"])


def test_llm_reads_csv_workload_and_rejects_bad_lengths(llm, tmp_path, capsys):
    csv = tmp_path / "w.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,5,2\n0.01,3,1\n")
    log = run_llm(llm, tmp_path, "--workload", str(csv))
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in log["requests"]] == [(5, 2), (3, 1)]
    assert log["requests"][1]["tpot_ms"] is None
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,60,10\n")
    assert llm.main([*LLM_TINY, "--workload", str(csv)]) == 2
    assert "exceeds --max-seq" in capsys.readouterr().err


def test_llm_seed_determinism(llm, tmp_path):
    args = ["--num-requests", "5", "--rate", "100", "--prompt-min", "3", "--prompt-max", "8",
            "--output-min", "2", "--output-max", "5"]

    def fingerprint(log: dict[str, Any]) -> list[tuple]:
        return [(r["arrival_s"], r["prompt_tokens"], r["output_tokens"], r["output_token_ids"])
                for r in log["requests"]]

    a = run_llm(llm, tmp_path, *args, "--seed", "7", name="a.json")
    b = run_llm(llm, tmp_path, *args, "--seed", "7", name="b.json")
    c = run_llm(llm, tmp_path, *args, "--seed", "8", name="c.json")
    assert fingerprint(a) == fingerprint(b)
    assert [r["arrival_s"] for r in a["requests"]] != [r["arrival_s"] for r in c["requests"]]
    assert fingerprint(a) != fingerprint(c)


def test_poisson_schedule_shape(llm):
    import random
    times = llm.poisson_schedule(200, 50.0, random.Random(0))
    assert times[0] == 0.0 and times == sorted(times)
    assert 2.0 < times[-1] < 6.0  # 199 gaps of mean 20 ms
    assert llm.poisson_schedule(4, float("inf"), random.Random(0)) == [0.0] * 4


# ----------------------------------------------------------------------------- dit_serve


DIT_TINY = ["--device", "cpu", "--threads", "1", "--layers", "1", "--d-model", "32", "--heads", "2",
            "--resolution", "8", "--patch", "2", "--steps", "3"]


@pytest.mark.parametrize("frames", [1, 3])
def test_dit_sample_keeps_latent_shape(dit, frames):
    args = dit.parse_args([*DIT_TINY, "--frames", str(frames)])
    model = dit.build_model(args, torch.device("cpu"), torch.float32)
    shape = (4, 8, 8) if frames == 1 else (4, frames, 8, 8)
    assert model.latent_shape() == shape and model.num_tokens == frames * 16
    noise = torch.randn(2, *shape)
    with torch.inference_mode():
        out = dit.sample(model, noise, torch.tensor([1, 2]), steps=3, cfg_scale=4.0)
    assert out.shape == noise.shape and torch.isfinite(out).all()
    assert not torch.equal(out, noise)


def test_dit_unpatchify_inverts_patch_layout(dit):
    model = dit.build_model(dit.parse_args([*DIT_TINY, "--frames", "2"]), torch.device("cpu"),
                            torch.float32)
    x = torch.randn(1, 4, 2, 8, 8)
    # patches as the conv sees them: per frame, row-major patches, each (p, q, c)
    p = x.reshape(1, 4, 2, 4, 2, 4, 2).permute(0, 2, 3, 5, 4, 6, 1).reshape(1, 32, 16)
    assert torch.equal(model.unpatchify(p), x)


@pytest.mark.parametrize("cfg_scale,factor", [(4.0, 2), (1.0, 1)])
def test_dit_cfg_doubles_the_model_batch(dit, cfg_scale, factor):
    model = dit.build_model(dit.parse_args(DIT_TINY), torch.device("cpu"), torch.float32)
    seen: list[int] = []
    model.register_forward_pre_hook(lambda m, inputs: seen.append(inputs[0].shape[0]))
    with torch.inference_mode():
        dit.sample(model, torch.randn(3, 4, 8, 8), torch.tensor([0, 1, 2]), 2, cfg_scale)
    assert seen == [3 * factor] * 2


def test_dit_serves_and_logs_latency_per_request(dit, tmp_path, step_counter):
    log_path = tmp_path / "dit.json"
    assert dit.main([*DIT_TINY, "--num-requests", "5", "--rate", "inf", "--batch", "2",
                     "--log", str(log_path)]) == 0
    log = json.loads(log_path.read_text())
    assert log["schema"] == dit.SCHEMA and log["config"]["latent_shape"] == [4, 8, 8]
    reqs, batches = log["requests"], log["batches"]
    assert [r["id"] for r in reqs] == list(range(5))
    for r in reqs:
        assert r["arrival_s"] <= r["start_s"] <= r["end_s"]
        assert r["latency_ms"] >= r["service_ms"] > 0 and r["queue_ms"] >= 0
    assert [b["batch_size"] for b in batches] == [2, 2, 1]  # all arrive at 0: FCFS batches of 2
    assert all(b["model_batch"] == 2 * b["batch_size"] and len(b["step_ms"]) == 3 for b in batches)
    steps = log["steps"]
    assert len(steps) == 9 == len(step_counter) == log["summary"]["num_steps"]
    assert [s["step"] for s in steps[:3]] == [0, 1, 2] and steps[0]["t"] == 1.0
    assert log["summary"]["latency_ms"]["p50"] <= log["summary"]["latency_ms"]["p99"]


def test_dit_autocast_denoises_an_fp32_model_in_mixed_precision(dit, tmp_path):
    """``--autocast bf16``: the fp32 model's GEMMs and attention in bf16 (the latents move a little
    from fp32's); with a 16-bit ``--dtype`` it is refused."""
    sums = []
    for extra in ((), ("--autocast", "bf16")):
        log_path = tmp_path / f"dit{len(extra)}.json"
        assert dit.main([*DIT_TINY, "--num-requests", "1", "--rate", "inf", *extra, "--log", str(log_path)]) == 0
        log = json.loads(log_path.read_text())
        assert log["config"]["dtype"] == "float32"
        sums.append(log["batches"][0]["latent_sum"])
    assert sums[0] != sums[1] and sums[1] == pytest.approx(sums[0], rel=0.1)
    with pytest.raises(SystemExit):
        dit.parse_args([*DIT_TINY, "--autocast", "bf16", "--dtype", "bfloat16"])


def test_dit_denoise_phase_is_recorded(dit):
    model = dit.build_model(dit.parse_args(DIT_TINY), torch.device("cpu"), torch.float32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.inference_mode():
            dit.sample(model, torch.randn(1, 4, 8, 8), torch.tensor([0]), 2, 4.0)
    names = [e.name for e in prof.events()]
    assert names.count("phase:denoise") == 2


# ----------------------------------------------------------------------------- train


def test_train_loss_is_finite_and_changes(train, tmp_path, step_counter):
    opt_steps: list[int] = []
    handle = register_optimizer_step_post_hook(
        lambda opt, args, kwargs: opt_steps.append(1))
    try:
        log_path = tmp_path / "train.json"
        assert train.main(["--device", "cpu", "--steps", "6", "--batch-size", "2", "--seq-len", "16",
                           "--d-model", "32", "--layers", "1", "--vocab", "64",
                           "--log", str(log_path)]) == 0
    finally:
        handle.remove()
    log = json.loads(log_path.read_text())
    losses = [s["loss"] for s in log["steps"]]
    assert len(losses) == 6 == len(opt_steps)
    assert not step_counter  # train.py leaves step detection to the recorder
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] != losses[0] and min(losses[1:]) < losses[0]
    assert log["summary"]["first_loss"] == losses[0] and log["summary"]["last_loss"] == losses[-1]


@pytest.mark.slow
def test_train_runs_as_a_script(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLES / "train.py"), "--device", "cpu", "--steps", "2",
                          "--batch-size", "2", "--seq-len", "8", "--d-model", "16", "--layers", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("train: 2 steps")


TINY_TRAIN = ["--device", "cpu", "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--d-model", "32",
              "--layers", "1", "--vocab", "64"]


def _losses(train: ModuleType, tmp_path: Path, *extra: str) -> list[float]:
    log_path = tmp_path / f"train{len(list(tmp_path.iterdir()))}.json"
    assert train.main([*TINY_TRAIN, *extra, "--log", str(log_path)]) == 0
    return [s["loss"] for s in json.loads(log_path.read_text())["steps"]]


def test_train_variants_of_the_gpu_pairs(tmp_path: Path) -> None:
    """The flags the GPU harvest's pairs differ in: autocast changes the numerics a little, the SDPA
    backend only in the last bits (torch's CPU default may be its flash kernel, which sums in
    another order than math, depending on the CPU's vector units), and a DataLoader (in the thread
    or in workers) feeds other batches than the pre-made ones, the same ones whatever the number of
    workers."""
    train = load("train")
    plain = _losses(train, tmp_path)
    bf16 = _losses(train, tmp_path, "--autocast", "bf16")
    assert bf16 != plain and all(abs(a - b) < 0.05 for a, b in zip(plain, bf16))
    assert _losses(train, tmp_path, "--sdpa", "math") == pytest.approx(plain, rel=1e-5)
    inline = _losses(train, tmp_path, "--workers", "0", "--load-ms", "1")
    assert inline != plain and _losses(train, tmp_path, "--workers", "2", "--load-ms", "1") == inline
    with pytest.raises(SystemExit):
        train.parse_args([*TINY_TRAIN, "--workers", "-1"])


def test_train_converted_to_bf16_trains_near_fp32(tmp_path: Path) -> None:
    """``--dtype bfloat16`` converts the model (``sample_traces/tp_memory/tp1_bf16_model``): it
    trains, a little away from fp32; with ``--autocast`` too it is refused."""
    train = load("train")
    plain = _losses(train, tmp_path)
    converted = _losses(train, tmp_path, "--dtype", "bfloat16")
    assert converted != plain and all(abs(a - b) < 0.1 for a, b in zip(plain, converted))
    with pytest.raises(SystemExit):
        train.parse_args([*TINY_TRAIN, "--dtype", "bfloat16", "--autocast", "bf16"])


@pytest.mark.slow
def test_train_tensor_parallel_ranks_train_the_same_model(tmp_path: Path) -> None:
    """``--tp 2`` as torchrun starts it: two gloo ranks, each holding its half of every sharded
    weight of the same seeded model, train it as one process does (the same losses, clipping
    included: the f/g all-reduces and the grad norm over the ranks are right); without torchrun
    it is one line and exit 2."""
    import os
    import socket

    train = load("train")
    one = train.TinyLM(64, 32, 1, 4, 16)
    half = train.TinyLM(64, 32, 1, 4, 16, tp=2, rank=1)
    sizes = {n: p.numel() for n, p in half.named_parameters()}
    full = {n: p.numel() for n, p in one.named_parameters()}
    assert sizes["blocks.0.qkv.weight"] == full["blocks.0.qkv.weight"] // 2
    assert sizes["blocks.0.mlp.2.weight"] == full["blocks.0.mlp.2.weight"] // 2
    assert sizes["blocks.0.proj.bias"] == full["blocks.0.proj.bias"] and sizes["head.weight"] == full["head.weight"]
    args = [*TINY_TRAIN, "--heads", "4", "--layers", "2", "--clip", "0.5"]
    alone = tmp_path / "alone.json"
    assert train.main([*args, "--log", str(alone)]) == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, str(EXAMPLES / "train.py"), *args, "--tp", "2", "--log", str(logs[r])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    losses = [[s["loss"] for s in json.loads(log.read_text())["steps"]] for log in (alone, *logs)]
    assert losses[1] == losses[2] and len(losses[0]) == 3
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and losses[0][-1] != losses[0][0]
    lone = subprocess.run([sys.executable, str(EXAMPLES / "train.py"), *TINY_TRAIN, "--tp", "2"],
                          capture_output=True, text=True, timeout=120)
    assert lone.returncode == 2
    assert lone.stderr.strip() == "train: error: --tp 2 needs 2 processes started by torchrun (WORLD_SIZE is 1)"


def _torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    import os
    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}


def _serve_ranks(tmp_path: Path, args: list[str], sp: int, ring: int) -> list[float]:
    """``dit_serve.py --sp sp --ring ring`` as torchrun starts it (gloo ranks); each batch's latent
    sum from the log, which only rank 0 writes."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logs = [tmp_path / f"sp{sp}_ring{ring}_rank{r}.json" for r in range(sp)]
    procs = [subprocess.Popen([sys.executable, str(EXAMPLES / "dit_serve.py"), *args, "--sp", str(sp), "--ring",
                               str(ring), "--log", str(logs[r])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_torchrun_env(r, sp, port))
             for r in range(sp)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * sp, outs
    assert logs[0].exists() and not any(log.exists() for log in logs[1:])
    return [b["latent_sum"] for b in json.loads(logs[0].read_text())["batches"]]


@pytest.mark.slow
def test_dit_sequence_parallel_ranks_serve_the_same_images(tmp_path: Path) -> None:
    """``--sp P`` as torchrun starts it: gloo ranks, each running the blocks on 1/P of the tokens,
    with Ulysses' all-to-alls (``--sp 2``), Ring attention's K, V passed round (``--ring 2``) and
    both (USP, ``--sp 4 --ring 2``), denoise to the latents one process does (the ring's running
    softmax to float rounding); the batches are logged once (rank 0). ``--sp`` needs torchrun and
    ``--rate inf``, a ``--ring`` that divides it and heads the Ulysses degree divides: one line and
    exit 2 otherwise."""
    args = ["--device", "cpu", "--rate", "inf", "--num-requests", "2", "--batch", "2", "--steps", "2",
            "--layers", "2", "--d-model", "32", "--heads", "4", "--resolution", "8", "--warmup", "0"]
    alone = tmp_path / "alone.json"
    assert load("dit_serve").main([*args, "--log", str(alone)]) == 0
    want = [b["latent_sum"] for b in json.loads(alone.read_text())["batches"]]
    assert len(want) == 1
    assert _serve_ranks(tmp_path, args, 2, 1) == pytest.approx(want, rel=1e-5)
    assert _serve_ranks(tmp_path, args, 2, 2) == pytest.approx(want, rel=1e-4)
    assert _serve_ranks(tmp_path, args, 4, 2) == pytest.approx(want, rel=1e-4)
    for extra, message in ((["--sp", "2"], "dit_serve: error: --sp 2 needs 2 processes started by torchrun "
                                           "(WORLD_SIZE is 1)"),
                           (["--sp", "2", "--rate", "5"], "--sp needs --rate inf"),
                           (["--sp", "4", "--ring", "3"], "--ring 3 must divide --sp 4")):
        lone = subprocess.run([sys.executable, str(EXAMPLES / "dit_serve.py"), *args, *extra],
                              capture_output=True, text=True, timeout=120)
        assert lone.returncode == 2 and message in lone.stderr.strip().splitlines()[-1]
    with pytest.raises(ValueError, match=r"heads 4 is not a multiple of the Ulysses degree 3 \(--sp / --ring\)"):
        load("dit_serve").Attention(32, 4, sp=3)
    assert load("dit_serve").Attention(32, 4, sp=6, ring=3).ulysses == 2


def test_sequence_parallel_groups_put_ulysses_on_neighbours() -> None:
    """yunchang's layout: a Ulysses group is neighbouring ranks (one machine's, where the
    all-to-all is fast), a ring takes one rank of each Ulysses group; Ring alone is one ring of
    every rank, Ulysses alone one group of every rank."""
    sets = load("dit_serve").sp_rank_sets
    assert sets(8, 2) == {"every": [list(range(8))], "ulysses": [[0, 1, 2, 3], [4, 5, 6, 7]],
                          "ring": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    assert sets(4, 4)["ring"] == [[0, 1, 2, 3]] and sets(4, 4)["ulysses"] == [[0], [1], [2], [3]]
    assert sets(4, 1)["ulysses"] == [[0, 1, 2, 3]] and sets(4, 1)["ring"] == [[0], [1], [2], [3]]


@pytest.mark.slow
def test_train_pipeline_stages_train_the_same_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--pp 2 --micro-batches 4`` as torchrun starts it: two gloo ranks, each holding its stage's
    blocks of the same seeded model (the first also the embeddings, the last the LM head), train
    it with 1F1B as one process does (the same losses, clipping over both stages included); so do
    GPipe, four ranks of ``--tp 2 --pp 2`` and gradient accumulation over the micro-batches in one
    process; bad splits are one line."""
    import os
    import socket

    train = load("train")
    first, last = train.TinyLM(64, 32, 4, 4, 16, pp=2, stage=0), train.TinyLM(64, 32, 4, 4, 16, pp=2, stage=1)
    assert (len(first.blocks), len(last.blocks)) == (2, 2)
    assert hasattr(first, "embed") and not hasattr(first, "head") and hasattr(last, "head") and not hasattr(last, "pos")
    one = train.TinyLM(64, 32, 4, 4, 16)
    assert sum(p.numel() for p in first.parameters()) + sum(p.numel() for p in last.parameters()) == \
        sum(p.numel() for p in one.parameters())
    args = [*TINY_TRAIN, "--heads", "4", "--layers", "4", "--batch-size", "4", "--clip", "0.5"]
    alone, accumulated = tmp_path / "alone.json", tmp_path / "accumulated.json"
    assert train.main([*args, "--log", str(alone)]) == 0
    assert train.main([*args, "--micro-batches", "4", "--log", str(accumulated)]) == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logs = []
    for plan, ranks in ((["--pp", "2"], 2), (["--tp", "2", "--pp", "2"], 4),   # rank = stage x tp + its tp rank
                        (["--pp", "2", "--schedule", "gpipe"], 2)):
        logs.append([tmp_path / f"{'-'.join(plan)}.{r}.json" for r in range(ranks)])
        procs = [subprocess.Popen([sys.executable, str(EXAMPLES / "train.py"), *args, *plan, "--micro-batches", "4",
                                   "--log", str(logs[-1][r])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                                  "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
                                                  "MASTER_PORT": str(port + len(logs))})
                 for r in range(ranks)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * ranks, outs
    losses = [[s["loss"] for s in json.loads(log.read_text())["steps"]]
              for log in (alone, accumulated, *logs[0], *logs[1], *logs[2])]
    assert losses[2:4] == [losses[2]] * 2 and losses[4:8] == [losses[4]] * 4 and losses[8:] == [losses[8]] * 2
    assert len(losses[0]) == 3 and losses[0][-1] != losses[0][0]
    for other in losses[1:]:
        assert other == pytest.approx(losses[0], rel=1e-5)
    for bad, message in ((["--pp", "2", "--compile"], "--micro-batches and --pp run the model eagerly"),
                         (["--micro-batches", "3"], "is not a multiple of --micro-batches 3")):
        with pytest.raises(SystemExit):
            train.parse_args([*args, *bad])
        assert message in capsys.readouterr().err
    lone = subprocess.run([sys.executable, str(EXAMPLES / "train.py"), *args, "--layers", "3", "--pp", "2"],
                          capture_output=True, text=True, timeout=120)
    assert lone.returncode == 2 and lone.stderr.strip() == "train: error: layers 3 is not a multiple of --pp 2"


def test_every_example_takes_an_attention_backend() -> None:
    for name in ("train", "llm_serve", "dit_serve"):
        module = load(name)
        assert module.parse_args(["--sdpa", "math"]).sdpa == "math"
        assert module.parse_args([]).sdpa == "auto"
        with pytest.raises(SystemExit):
            module.parse_args(["--sdpa", "fastest"])


def test_train_loader_spends_its_load_time_per_batch() -> None:
    train = load("train")
    args = train.parse_args([*TINY_TRAIN, "--workers", "0", "--load-ms", "20"])
    data = train.TokenDataset(args)
    assert len(data) == 3 * 2
    t0 = time.perf_counter()
    item = data[1]
    assert time.perf_counter() - t0 >= 0.010  # half a batch's 20 ms, batch size 2
    assert item.shape == (17,) and int(item.max()) < 64 and torch.equal(item, data[1])


def test_decode_steps_and_shapes(tmp_path: Path) -> None:
    """examples/decode.py: one whatif.step() per decode step plus one after the warm-up, the log's
    schema, and --tp 2 holding one rank's half of every sharded weight."""
    decode = load("decode")
    marks: list[int] = []

    def hook() -> None:
        marks.append(1)
    markers.add_step_hook(hook)
    try:
        log_path = tmp_path / "decode.json"
        assert decode.main(["--device", "cpu", "--dtype", "fp32", "--steps", "4", "--warmup", "1", "--d-model", "64",
                            "--heads", "4", "--layers", "1", "--context", "16", "--batch", "2",
                            "--log", str(log_path)]) == 0
    finally:
        markers.remove_step_hook(hook)
    log = json.loads(log_path.read_text())
    assert log["schema"] == "whatif.bench.decode/1" and len(log["steps"]) == 4 == len(marks) - 1
    args = decode.parse_args(["--d-model", "64", "--heads", "4", "--tp", "2"])
    layer = decode.Decoder(args).layers[0]
    assert layer.qkv.out_features == 3 * 32 and layer.proj.in_features == 32 and layer.up.out_features == 128
    with pytest.raises(SystemExit):
        decode.parse_args(["--device", "cpu", "--cuda-graph"])
    with pytest.raises(SystemExit):
        decode.parse_args(["--heads", "3", "--tp", "2"])


def test_dit_warm_up_runs_every_batch_size_the_server_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call at a new batch shape pays kernel selection (63 ms against 4 on an H200): the
    warm-up makes one at every size from 1 to --batch requests, so no request is charged for it."""
    dit = load("dit_serve")
    args = dit.parse_args(["--device", "cpu", "--batch", "3", "--layers", "1", "--d-model", "32", "--heads", "2",
                           "--resolution", "4"])
    model = dit.build_model(args, torch.device("cpu"), torch.float32)
    sizes: list[int] = []
    real = dit.guided_velocity

    def spy(model_: Any, x: Any, *rest: Any) -> Any:
        sizes.append(x.shape[0])
        return real(model_, x, *rest)
    monkeypatch.setattr(dit, "guided_velocity", spy)
    with torch.inference_mode():
        dit.warm_up(model, args, torch.device("cpu"), torch.float32)
    assert sizes == [1, 2, 3]
