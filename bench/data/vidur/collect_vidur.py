"""Turn Vidur peer runs into the compact files of this folder (README.md beside this file).

Run in the Vidur venv from the Vidur checkout (it imports Vidur's MemoryPlanner for the number of
KV blocks the scheduler had): ``python collect_vidur.py OUT_DIR RUN_DIR...``.
"""
import glob
import gzip
import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, ".")
from vidur.config import ReplicaConfig
from vidur.entities.replica import Replica
from vidur.scheduler.utils.memory_planner import MemoryPlanner


def write_gz(frame: pd.DataFrame, path: Path) -> None:
    """CSV, gzip with a fixed mtime and no name, so the same run gives the same bytes."""
    buf = io.StringIO()
    frame.to_csv(buf, index=False, float_format="%.6f")
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue().encode())


def num_blocks(cfg: dict) -> tuple[int, int]:
    """(KV blocks, request slots) as Vidur's base replica scheduler computes them when num_blocks is unset."""
    rc = cfg["cluster_config"]["replica_config"]
    sc = cfg["cluster_config"]["replica_scheduler_config"]
    rep_cfg = ReplicaConfig(model_name=rc["model_name"], device=rc["device"], network_device=rc["network_device"],
                            tensor_parallel_size=rc["tensor_parallel_size"],
                            num_pipeline_stages=rc["num_pipeline_stages"],
                            memory_margin_fraction=rc["memory_margin_fraction"])
    max_tokens = cfg["request_generator_config"]["length_generator_config"]["max_tokens"]
    replica = Replica(rep_cfg, type("GeneratorConfig", (), {"max_tokens": max_tokens})())
    slots = int(MemoryPlanner(rep_cfg, replica).get_max_request_slots())
    return (max_tokens // sc["block_size"]) * slots, slots


def collect(run: Path, out: Path) -> tuple[str, dict]:
    cfg = json.load(open(glob.glob(f"{run}/*/config.json")[0]))
    rm = pd.read_csv(glob.glob(f"{run}/*/request_metrics.csv")[0]).sort_values("Request Id")
    batches = [json.loads(line) for line in open(run / "batches.jsonl")]
    rows = [(b["batch_id"], b["scheduled_at"], b["completed_at"], r[0], r[1], r[2], int(r[3]))
            for b in batches for r in b["requests"]]
    bt = pd.DataFrame(rows, columns=["batch_id", "start_s", "end_s", "request_id", "context_before", "tokens",
                                     "is_prefill"])
    rid = rm["Request Id"].to_numpy()
    arrival = bt.groupby("request_id").start_s.min().loc[rid].to_numpy() - rm.request_scheduling_delay.to_numpy()
    from_end = bt.groupby("request_id").end_s.max().loc[rid].to_numpy() - rm.request_e2e_time.to_numpy()
    assert np.allclose(arrival, from_end, atol=1e-9), "arrival times disagree"
    req = pd.DataFrame({
        "request_id": rid, "arrival_s": arrival,
        "prompt_tokens": rm.request_num_prefill_tokens.to_numpy(),
        "output_tokens": rm.request_num_decode_tokens.to_numpy(),
        "ttft_s": rm.prefill_e2e_time.to_numpy(), "e2e_s": rm.request_e2e_time.to_numpy(),
        "scheduling_delay_s": rm.request_scheduling_delay.to_numpy(),
        "vidur_tpot_s": rm.decode_time_execution_plus_preemption_normalized.to_numpy(),
        "restarts": rm.request_num_restarts.to_numpy()})
    gen = cfg["request_generator_config"]
    tag = f"u{gen['length_generator_config']['max_tokens']}_qps{gen['interval_generator_config']['qps']:g}"
    req.to_csv(out / f"requests_{tag}.csv", index=False, float_format="%.9f")
    write_gz(bt.drop_duplicates("batch_id")[["batch_id", "start_s", "end_s"]], out / f"batches_{tag}.csv.gz")
    write_gz(bt[["batch_id", "request_id", "context_before", "tokens", "is_prefill"]],
             out / f"batch_requests_{tag}.csv.gz")
    blocks, slots = num_blocks(cfg)
    rc = cfg["cluster_config"]["replica_config"]
    return tag, {"qps": gen["interval_generator_config"]["qps"], "num_requests": len(req), "batches": len(batches),
                 "seed": cfg["seed"], "request_generator": gen,
                 "replica_scheduler": cfg["cluster_config"]["replica_scheduler_config"], "num_blocks": blocks,
                 "max_request_slots": slots, "model": rc["model_name"], "device": rc["device"],
                 "tensor_parallel_size": rc["tensor_parallel_size"],
                 "execution_time_predictor": cfg["execution_time_predictor_config"]}


def main() -> None:
    out = Path(sys.argv[1])
    runs = dict(collect(Path(r), out) for r in sys.argv[2:])
    (out / "runs.json").write_text(json.dumps(runs, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
