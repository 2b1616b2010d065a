"""The saved Vidur peer runs (bench/data/vidur, read by bench/serving_vidur.py) load and agree with
themselves: every request's latencies, the batches that served it, and its token counts."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "data" / "vidur"
sys.path.insert(0, str(REPO / "bench"))
from serving_vidur import compositions, load_run  # noqa: E402

TAGS = ("u1536_qps2", "u1536_qps6", "u2048_qps2", "u2048_qps6")


@pytest.fixture(scope="module", params=TAGS)
def run(request):
    return load_run(request.param)


def test_runs_json_describes_each_saved_run():
    runs = json.loads((DATA / "runs.json").read_text())
    assert sorted(runs) == sorted(TAGS)
    for tag, meta in runs.items():
        assert tag == f"u{meta['request_generator']['length_generator_config']['max_tokens']}_qps{meta['qps']:g}"
        assert meta["replica_scheduler"]["name"] == "vllm"
        assert meta["model"] == "meta-llama/Llama-2-7b-hf" and meta["tensor_parallel_size"] == 1
        max_tokens = meta["request_generator"]["length_generator_config"]["max_tokens"]
        assert meta["num_blocks"] == max_tokens // meta["replica_scheduler"]["block_size"] * meta["max_request_slots"]


def test_request_latencies_are_ordered(run):
    r = run.requests
    assert len(r) == 1000 and r.request_id.is_unique
    assert (r.ttft_s > 0).all() and (r.ttft_s <= r.e2e_s).all()
    assert (r.scheduling_delay_s >= 0).all() and (r.scheduling_delay_s <= r.ttft_s).all()
    assert (r.output_tokens >= 2).all() and (r.prompt_tokens >= 1).all()


def test_batches_run_one_at_a_time(run):
    b = run.batches.sort_values("batch_id")
    assert (b.end_s > b.start_s).all()
    assert (b.start_s.to_numpy()[1:] >= b.end_s.to_numpy()[:-1] - 1e-6).all()


def test_batches_are_prefill_only_or_decode_only(run):
    kinds = run.members.groupby("batch_id").is_prefill.agg(["min", "max"])
    assert (kinds["min"] == kinds["max"]).all()


def test_batch_compositions_add_up_to_each_request(run):
    """A request that was never preempted is prefilled once (its whole prompt, nothing cached) and
    then decoded output - 1 times, attending to one more token each time; a restarted one is
    prefilled once more per restart."""
    m = run.members.merge(run.batches, on="batch_id").sort_values(["request_id", "batch_id"])
    req = run.requests.set_index("request_id")
    prefills = m[m.is_prefill == 1].groupby("request_id").size()
    assert (prefills == req.restarts.loc[prefills.index] + 1).all() and len(prefills) == len(req)
    assert (req.restarts == 0).mean() > 0.99
    kept = req.index[req.restarts == 0]
    m = m[m.request_id.isin(kept)]
    req = req.loc[kept]
    pre = m[m.is_prefill == 1].set_index("request_id")
    assert (pre.tokens == req.prompt_tokens.loc[pre.index]).all() and (pre.context_before == 0).all()
    dec = m[m.is_prefill == 0]
    assert (dec.tokens == 1).all()
    counts = dec.groupby("request_id").size()
    assert (counts == req.output_tokens.loc[counts.index] - 1).all() and len(counts) == len(req)
    step = dec.groupby("request_id").cumcount().to_numpy()
    first_ctx = req.prompt_tokens.loc[dec.request_id].to_numpy() + 1
    assert (dec.context_before.to_numpy() == first_ctx + step).all()
    # the first token comes at the end of the prefill batch, the last at the end of the last decode
    arrival = req.arrival_s.loc[pre.index]
    assert np.allclose(pre.end_s - arrival, req.ttft_s.loc[pre.index], atol=2e-6)
    last = m.groupby("request_id").end_s.max()
    assert np.allclose(last - req.arrival_s.loc[last.index], req.e2e_s.loc[last.index], atol=2e-6)


@pytest.mark.parametrize("workload", ["u1536", "u2048"])
def test_each_workload_is_served_at_two_rates(workload):
    """Same lengths, arrival times scaled by the rate (Vidur draws both from one seeded stream)."""
    r2, r6 = (pd.read_csv(DATA / f"requests_{workload}_{q}.csv") for q in ("qps2", "qps6"))
    assert (r2.prompt_tokens == r6.prompt_tokens).all() and (r2.output_tokens == r6.output_tokens).all()
    assert np.allclose(np.diff(r2.arrival_s) / 3, np.diff(r6.arrival_s), atol=1e-6)


def test_compositions_follow_the_batch_log(run):
    comps = compositions(run)
    assert len(comps) == len(run.batches)
    first = run.members[run.members.batch_id == run.batches.batch_id.min()]
    phase, batch = comps[0]
    assert phase == "prefill" and batch.prefill_tokens == tuple(first.tokens)
    n_dec = sum(len(b.decode_context) for _, b in comps)
    n_pre = sum(sum(b.prefill_tokens) for _, b in comps)
    assert n_dec == int((run.members.is_prefill == 0).sum())
    assert n_pre == int(run.members.tokens[run.members.is_prefill == 1].sum())
    assert n_pre >= int(run.requests.prompt_tokens.sum())
