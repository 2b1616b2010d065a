"""Serving policies and routers are classes in Enum-keyed registries (a toy one registered here,
unregistered afterwards, works in the simulator and on the command line); the serve/sweep options
are generated from the config dataclasses (each default once); whatif.api and whatif.serving do
not import each other in a cycle."""
from __future__ import annotations

import ast
import collections
import dataclasses
import re
from collections.abc import Iterator
from enum import Enum
from pathlib import Path

import orjson
import pytest
from test_serving import flat, serving_run

from whatif.cli import build_parser, main
from whatif.commands.serve import options, workload
from whatif.predictors.serving import (
    POLICIES,
    ROUTERS,
    PolicyName,
    ReplicaState,
    RequestSpec,
    Router,
    RouterName,
    SchedulerConfig,
    Work,
    WorkloadError,
    simulate_llm,
)
from whatif.predictors.serving.policies import ContinuousBatching
from whatif.serving import DitOptions, Workload

ROOT = Path(__file__).resolve().parents[1]


class ToyPolicy(str, Enum):
    SJF = "sjf"


class ShortestPromptFirst(ContinuousBatching):
    """vLLM's continuous batching, but the waiting request with the fewest prompt tokens goes first."""

    key = ToyPolicy.SJF

    def next_work(self, rep: ReplicaState) -> Work | None:
        rep.waiting = collections.deque(sorted(rep.waiting, key=lambda s: s.target - s.prefilled))
        return super().next_work(rep)


class ToyRouter(str, Enum):
    FIRST = "first"


class FirstReplica(Router):
    key = ToyRouter.FIRST

    def pick(self) -> ReplicaState:
        return self.replicas[0]


@pytest.fixture
def toy_parts() -> Iterator[None]:
    POLICIES.register(ShortestPromptFirst)
    ROUTERS.register(FirstReplica)
    try:
        yield
    finally:
        POLICIES.unregister(ToyPolicy.SJF)
        ROUTERS.unregister(ToyRouter.FIRST)
    assert POLICIES.names() == ("vllm", "static", "chunked", "disagg", "vllm-v1", "sglang")
    assert ROUTERS.names() == ("least_loaded", "round_robin")


def run(reqs: list[tuple[float, int, int]], **cfg: object) -> list[dict]:
    specs = [RequestSpec(i, a, p, o) for i, (a, p, o) in enumerate(reqs)]
    return simulate_llm(specs, flat, SchedulerConfig(**cfg)).requests  # type: ignore[arg-type]


def test_built_in_keys_and_lookup_by_name() -> None:
    assert POLICIES.names() == tuple(p.value for p in PolicyName)
    assert ROUTERS.names() == tuple(r.value for r in RouterName)
    cfg = SchedulerConfig(policy="chunked", router="round_robin")
    assert cfg.policy is PolicyName.CHUNKED and cfg.router is RouterName.ROUND_ROBIN
    assert cfg.to_dict()["policy"] == "chunked" and cfg.to_dict()["router"] == "round_robin"
    assert SchedulerConfig().policy is None and SchedulerConfig().policy_key is PolicyName.VLLM   # the engine's
    with pytest.raises(WorkloadError,
                       match=r"^unknown policy 'sjf' \(policies: vllm, static, chunked, disagg, vllm-v1, sglang\)$"):
        SchedulerConfig(policy="sjf")
    with pytest.raises(WorkloadError, match=r"^unknown router 'nearest' \(routers: least_loaded, round_robin\)$"):
        SchedulerConfig(router="nearest")


def test_a_registered_policy_and_router_run_in_the_simulator(toy_parts: None) -> None:
    # max_seqs=1, prefill 10 ms, decode 2 ms: r0 runs 0-12 ms; then FCFS takes r1 (50 tokens), SJF r2 (5 tokens)
    reqs = [(0.0, 10, 2), (0.001, 50, 2), (0.002, 5, 2)]
    fcfs = run(reqs, max_seqs=1)
    sjf = run(reqs, max_seqs=1, policy="sjf")
    assert [r["e2e_ms"] for r in fcfs] == [12.0, 23.0, 34.0]   # r1 done at 24, r2 at 36
    assert [r["e2e_ms"] for r in sjf] == [12.0, 35.0, 22.0]    # r2 done at 24, r1 at 36
    spread = run([(0.0, 10, 2), (0.0, 10, 2)], replicas=2, max_seqs=1)
    first = run([(0.0, 10, 2), (0.0, 10, 2)], replicas=2, max_seqs=1, router=ToyRouter.FIRST)
    assert {r["replica"] for r in spread} == {0, 1} and [r["e2e_ms"] for r in spread] == [12.0, 12.0]
    assert {r["replica"] for r in first} == {0} and [r["e2e_ms"] for r in first] == [12.0, 24.0]


def test_a_registered_policy_is_a_command_line_choice(toy_parts: None, tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "run", "--rate", "1", "--policy", "sjf", "--router", "first"])
    sched = options(args)["scheduler"]
    assert sched.policy is ToyPolicy.SJF and sched.router is ToyRouter.FIRST
    run_dir, log = serving_run(tmp_path)

    def served_order(policy: str) -> list[int]:
        """Request ids by first-token time; the three arrive at once, one runs at a time."""
        out = tmp_path / f"{policy}.json"
        assert main(["serve", str(run_dir), "--iterations-log", str(log), "--rate", "inf", "--num-requests", "3",
                     "--prompt-tokens", "10:100", "--output-tokens", "2", "--max-seqs", "1", "--policy", policy,
                     "--requests", "--json", str(out), "-q"]) == 0
        doc = orjson.loads(out.read_bytes())
        assert doc["scheduler"]["policy"] == policy
        reqs = doc["scenarios"][0]["requests"]
        assert [r["prompt_tokens"] for r in sorted(reqs, key=lambda r: r["id"])] == [59, 15, 75]  # seed 0's draw
        return [r["id"] for r in sorted(reqs, key=lambda r: r["ttft_ms"])]

    assert served_order("vllm") == [0, 1, 2]   # first come, first served
    assert served_order("sjf") == [1, 0, 2]    # 15, 59, 75 prompt tokens


def test_registry_refuses_clashes_and_bad_keys() -> None:
    class Clash(str, Enum):
        VLLM = "vllm"

    class Copy(ContinuousBatching):
        key = Clash.VLLM

    class NoKey(ContinuousBatching):
        pass

    with pytest.raises(TypeError, match=r"policy name 'vllm' is taken by <PolicyName\.VLLM"):
        POLICIES.register(Copy)
    with pytest.raises(TypeError, match=r"NoKey.key must be a member of a str Enum"):
        POLICIES.register(NoKey)
    with pytest.raises(TypeError, match="is not a Router"):
        ROUTERS.register(ContinuousBatching)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- generated options

def parse(*argv: str) -> object:
    return build_parser().parse_args(["serve", "run", *argv])


def test_options_without_flags_are_the_dataclass_defaults() -> None:
    args = parse()
    assert options(args)["scheduler"] == SchedulerConfig()
    assert options(args)["dit"] == DitOptions()
    assert workload(args) == Workload()
    sweep_args = build_parser().parse_args(["sweep", "run", "--rates", "1,2"])
    assert workload(sweep_args) == Workload() and "_dc_rate" not in vars(sweep_args)


def test_every_config_field_has_its_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    for cls in (SchedulerConfig, Workload, DitOptions):
        for f in dataclasses.fields(cls):
            flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            assert re.search(rf"(?<![\w-]){flag}(?![\w-])", text), f"{cls.__name__}.{f.name} has no option {flag}"
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    assert "adapter found the iterations, else examples" in text
    assert "(default: the engine's)" in text and "(default 16:64)" in text


def test_flags_map_onto_the_fields() -> None:
    args = parse("--max-batch", "4", "--kv-transfer-us-per-token", "2.5", "--policy", "disagg", "--router",
                 "round_robin", "--prefill-replicas", "2", "--chunk-tokens", "64", "--workload", "w.csv",
                 "--column", "arrival_s=ts", "--column", "prompt_tokens=in", "--time-unit", "ms", "--prompt-tokens",
                 "8", "--output-tokens", "3:9", "--seed", "5", "--no-cfg", "--steps", "20", "--rate", "inf")
    sched, dit, w = options(args)["scheduler"], options(args)["dit"], workload(args)
    assert sched == SchedulerConfig(policy=PolicyName.DISAGG, max_seqs=4, prefill_replicas=2, chunk_tokens=64,
                                    kv_transfer_ns_per_token=2500.0, router=RouterName.ROUND_ROBIN)
    assert dit == DitOptions(steps=20, cfg=False)
    assert w == Workload(rate=float("inf"), prompt_tokens=(8, 8), output_tokens=(3, 9), seed=5, file=Path("w.csv"),
                         columns={"arrival_s": "ts", "prompt_tokens": "in"}, time_unit="ms")


@pytest.mark.parametrize("argv,message", [
    (["--prompt-tokens", "x"], "argument --prompt-tokens: expected N or MIN:MAX tokens, got 'x'"),
    (["--column", "ts"], "argument --column: expected FIELD=COLUMN, got 'ts'"),
    (["--policy", "sjf"], "argument --policy: invalid choice: 'sjf'"),
    (["--max-seqs", "many"], "argument --max-seqs/--max-batch: must be an integer >= 1 and <= 2147483647, got 'many'"),
])
def test_bad_options_are_one_line_usage_errors(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "run", "--rate", "1", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# ----------------------------------------------------------------------------- no import cycle

def _imports(path: Path, module: str) -> set[str]:
    """Every whatif module ``path`` imports, inside functions and TYPE_CHECKING blocks included."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found


def test_the_front_door_has_no_import_cycle() -> None:
    modules = {}
    for path in (ROOT / "whatif").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {m: _imports(p, m) & set(modules) for m, p in modules.items()}
    assert "whatif.analysis" in graph["whatif.serving"] and "whatif.serving" in graph["whatif.api"]

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m == goal:
                return True
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        return False

    cycles = sorted(f"{m} -> {n}" for m in graph for n in graph[m] if reaches(n, m))
    assert not cycles, cycles


