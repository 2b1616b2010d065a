"""A serving engine split like vLLM V1's: a front-end process and an engine-core process.

The front-end (the process you run) makes ``--num-requests`` requests (random prompt tokens) and
sends them over a ``multiprocessing`` queue to the engine core, a child process named
``EngineCore_0`` (``--start-method spawn|fork|forkserver``) that owns a small decoder (random
weights) and runs a continuous-batching loop: each iteration either prefills the newly arrived
requests or decodes one token for every running one, inside ``whatif.phase("prefill"|"decode")``,
and ends with ``whatif.step()``. Like vLLM's engine with its detailed trace annotation, each
iteration also runs inside a ``record_function`` range that names its batch,
``execute_{tokens}_context_{n}(sq…sk…sqsq…sqsk…)_generation_{n}(sq…sk…sqsq…sqsk…)`` (per group: the
requests, Σ tokens scheduled, Σ tokens computed after this step, Σ sq², Σ sq·sk), so
``whatif serve`` finds the iterations and their compositions in the trace alone (the ``vllm``
adapter, docs/serving.md). Finished requests go back over a second queue; the front-end
then asks the engine core to stop and joins it. ``--terminate-after N`` makes the front-end stop
the engine core with SIGTERM (``Process.terminate()``, as vLLM's shutdown does) once N requests
have come back, instead of asking; ``--fail-after N`` makes the engine core raise an exception
after N iterations (the front-end notices that it died, and exits with status 1).

``whatif record examples/engine_split.py`` traces both processes into one run folder
(docs/recording.md, "Child processes"): the engine core's model ops are in
``rank0.engine_core.<pid>.pt.trace.json.gz``.

Log (``--log OUT.json``): ``{"schema": "whatif.bench.engine_split/1", "config": {...},
"requests": [{"id", "prompt_tokens", "output_tokens", "latency_s"}], "engine": {"pid",
"exitcode"}, "summary": {"requests", "duration_s"}}``.

  python examples/engine_split.py --num-requests 4
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import whatif

STOP = None  # the front-end's "shut down" message


@dataclass
class Request:
    id: int
    prompt: list[int]
    output_len: int
    tokens: list[int] = field(default_factory=list)


class TinyDecoder(torch.nn.Module):
    """Embedding, ``layers`` pre-norm MLP blocks, LM head: enough ops to see in a trace."""

    def __init__(self, vocab: int, d_model: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(d_model),
                                                              torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(),
                                                              torch.nn.Linear(4 * d_model, d_model))
                                          for _ in range(layers))
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x[:, -1])


def execute_label(prefills: list[Request], decodes: list[Request]) -> str:
    """vLLM's detailed annotation of one iteration (prefills of whole prompts, one token per decode).

    >>> execute_label([Request(0, [1, 2, 3], 4)], [])
    'execute_3_context_1(sq3sk3sqsq9sqsk9)_generation_0(sq0sk0sqsq0sqsk0)'
    """
    def group(sq: list[int], sk: list[int]) -> str:
        return (f"(sq{sum(sq)}sk{sum(sk)}sqsq{sum(q * q for q in sq)}"
                f"sqsk{sum(q * k for q, k in zip(sq, sk))})")
    p_sq = [len(r.prompt) for r in prefills]
    d_sk = [len(r.prompt) + len(r.tokens) for r in decodes]
    return (f"execute_{sum(p_sq) + len(decodes)}_context_{len(prefills)}{group(p_sq, p_sq)}"
            f"_generation_{len(decodes)}{group([1] * len(decodes), d_sk)}")


def engine_core(requests: Any, results: Any, config: dict[str, Any]) -> None:
    """The engine-core loop: admit, prefill or decode, step; until the front-end says stop."""
    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    model = TinyDecoder(config["vocab"], config["d_model"], config["layers"]).eval()
    running: list[Request] = []
    stopping = False
    iterations = 0
    with torch.inference_mode():
        while not (stopping and not running):
            arrived: list[Request] = []
            while True:
                try:
                    item = requests.get(block=not running and not arrived and not stopping)
                except queue.Empty:
                    break
                if item is STOP:
                    stopping = True
                    break
                arrived.append(item)
            if arrived:
                with whatif.phase("prefill"), torch.profiler.record_function(execute_label(arrived, [])):
                    for req in arrived:
                        logits = model(torch.tensor([req.prompt]))
                        req.tokens.append(int(logits.argmax()))
                running += arrived
            elif running:
                with whatif.phase("decode"), torch.profiler.record_function(execute_label([], running)):
                    last = torch.tensor([[r.tokens[-1]] for r in running])
                    for req, token in zip(running, model(last).argmax(dim=-1).tolist()):
                        req.tokens.append(int(token))
            else:
                continue
            whatif.step()
            iterations += 1
            if iterations == config["fail_after"]:
                raise RuntimeError(f"engine core: failing after {iterations} iterations (--fail-after)")
            for req in [r for r in running if len(r.tokens) >= r.output_len]:
                running.remove(req)
                results.put(req)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--start-method", choices=("spawn", "fork", "forkserver"), default="spawn")
    parser.add_argument("--terminate-after", type=int, default=None, metavar="N",
                        help="stop the engine core with SIGTERM once N requests have come back")
    parser.add_argument("--fail-after", type=int, default=None, metavar="N",
                        help="the engine core raises an exception after N iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args(argv)
    config = {"vocab": args.vocab, "d_model": args.d_model, "layers": args.layers, "seed": args.seed,
              "fail_after": args.fail_after}
    ctx = mp.get_context(args.start_method)
    requests, results = ctx.Queue(), ctx.Queue()
    engine = ctx.Process(target=engine_core, args=(requests, results, config), name="EngineCore_0")
    t0 = time.perf_counter()
    engine.start()
    rng = random.Random(args.seed)
    sent: dict[int, float] = {}
    for i in range(args.num_requests):
        requests.put(Request(i, [rng.randrange(args.vocab) for _ in range(args.prompt_len)], args.output_len))
        sent[i] = time.perf_counter()
    wanted = args.num_requests if args.terminate_after is None else min(args.terminate_after, args.num_requests)
    done: list[dict[str, Any]] = []
    while len(done) < wanted:
        try:
            req = results.get(timeout=0.2)
        except queue.Empty:
            if engine.is_alive():
                continue
            break
        done.append({"id": req.id, "prompt_tokens": len(req.prompt), "output_tokens": len(req.tokens),
                     "latency_s": round(time.perf_counter() - sent[req.id], 6)})
    if engine.is_alive():
        if args.terminate_after is None:
            requests.put(STOP)
        else:
            engine.terminate()
    engine.join()
    duration_s = time.perf_counter() - t0
    print(f"engine_split: {len(done)} requests in {duration_s:.2f} s; engine core pid {engine.pid} "
          f"exit code {engine.exitcode}", file=sys.stderr)
    if args.log is not None:
        args.log.write_text(json.dumps({
            "schema": "whatif.bench.engine_split/1", "config": vars(args) | {"log": str(args.log)},
            "requests": sorted(done, key=lambda r: r["id"]), "engine": {"pid": engine.pid, "exitcode": engine.exitcode},
            "summary": {"requests": len(done), "duration_s": round(duration_s, 6)}}, indent=1))
    if len(done) < wanted:
        print(f"engine_split: the engine core died (exit code {engine.exitcode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
