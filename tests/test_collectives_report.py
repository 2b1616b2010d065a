"""whatif collectives (issue 15 item 5): per call across ranks, bus bandwidth by nccl-tests'
conventions, arrival skew, the straggler and what it cost, intra- vs inter-node, per-rank totals;
checked against hand calculations on a hand-made 4-rank job on 2 nodes with skewed clocks."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from tracegen import KinetoTrace

from whatif.cli import main
from whatif.collectives import CollectivesOptions, bus_factor, collectives
from whatif.documents import CollectivesDocument, from_json
from whatif.tracer.trace import load_trace

US = 1000
MiB = 2**20
AR_NELEMS = 32 * MiB       # bf16: 64 MiB all-reduce over the 4 ranks
AG_NELEMS = 8 * MiB        # bf16: 16 MiB all-gather output over ranks {0, 1}
# per rank: arrival at the all-reduce (us, true time), clock offset of the rank's trace (us)
ARRIVE = {0: 0, 1: 10, 2: 30, 3: 5}
CLOCK = {0: 0, 1: 700, 2: -300, 3: 2000}


def job(folder: Path) -> Path:
    """4 ranks, 2 per node: an all-reduce on all 4 (ends at 130 us everywhere: 100 us of transfer
    after rank 2, the last, arrives at 30), then an all-gather on ranks 0 and 1 (arrivals 200 and
    240, ends 300)."""
    folder.mkdir()
    for rank in range(4):
        c = CLOCK[rank]
        tr = KinetoTrace(rank=rank, world_size=4)
        tr.step(1, c - 10, 400)
        tr.runtime("cudaLaunchKernel", c + ARRIVE[rank] - 5, 3, corr=1)
        tr.gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)", c + ARRIVE[rank], 130 - ARRIVE[rank],
               corr=1, stream=20, **{"Collective name": "allreduce", "Process Group Name": "0", "Group size": 4,
                                     "In msg nelems": AR_NELEMS, "Out msg nelems": AR_NELEMS, "dtype": "BFloat16",
                                     "Process Group Ranks": "[0, 1, 2, 3]"})
        if rank < 2:
            arrive = 200 + 40 * rank
            tr.runtime("cudaLaunchKernel", c + arrive - 5, 3, corr=2)
            tr.gpu("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", c + arrive, 300 - arrive, corr=2, stream=20,
                   **{"Collective name": "_allgather_base", "Process Group Name": "1", "Group size": 2,
                      "In msg nelems": AG_NELEMS // 2, "Out msg nelems": AG_NELEMS, "dtype": "BFloat16",
                      "Process Group Ranks": "[0, 1]"})
        tr.gpu("gemm", c + 320, 20, corr=3)
        tr.runtime("cudaLaunchKernel", c + 310, 3, corr=3)
        tr.write(folder / f"rank{rank}.pt.trace.json.gz")
    return folder


def test_hand_calculation(tmp_path: Path) -> None:
    doc = collectives(load_trace(job(tmp_path / "job")), options=CollectivesOptions(ranks_per_node=2))
    ar, ag = doc.calls
    assert (ar.key, ar.kind, ar.group_size, ar.ranks, ar.span) == ("allreduce@0", "all_reduce", 4, [0, 1, 2, 3],
                                                                   "inter-node")
    assert (ar.skew_ns, ar.transfer_ns, ar.straggler) == (30 * US, 100 * US, 2)
    assert ar.waited_ns == (30 + 20 + 0 + 25) * US
    nbytes = AR_NELEMS * 2
    assert ar.message_bytes == nbytes
    assert ar.algbw_gbps == pytest.approx(nbytes / (100 * US), rel=1e-6)          # bytes/ns = GB/s
    assert ar.busbw_gbps == pytest.approx(nbytes / (100 * US) * 2 * 3 / 4, rel=1e-6)  # 2(n-1)/n
    assert (ag.key, ag.kind, ag.ranks, ag.span, ag.straggler) == ("_allgather_base@1", "all_gather", [0, 1],
                                                                  "intra-node", 1)
    assert (ag.skew_ns, ag.transfer_ns, ag.waited_ns) == (40 * US, 60 * US, 40 * US)
    assert ag.busbw_gbps == pytest.approx(AG_NELEMS * 2 / (60 * US) * 1 / 2, rel=1e-6)  # (n-1)/n, output size
    ranks = {r.rank: r for r in doc.ranks}
    assert (ranks[2].straggler_calls, ranks[2].caused_wait_ns, ranks[2].waited_ns) == (1, 75 * US, 0)
    assert (ranks[1].straggler_calls, ranks[1].caused_wait_ns, ranks[1].waited_ns) == (1, 40 * US, 20 * US)
    assert ranks[0].waited_ns == (30 + 40) * US and ranks[3].calls == 1
    assert sum(r.waited_ns for r in doc.ranks) == sum(r.caused_wait_ns for r in doc.ranks)


def test_one_rank_loaded_is_a_lower_bound(tmp_path: Path) -> None:
    folder = job(tmp_path / "job")
    doc = collectives(load_trace(folder / "rank2.pt.trace.json.gz"))
    ar = doc.calls[0]
    assert ar.ranks == [2] and ar.straggler is None and ar.skew_ns == 0 and ar.waited_ns == 0
    assert ar.transfer_ns == 100 * US  # rank 2 arrived last: its kernel is the transfer alone
    assert ar.span == "unknown" and doc.ranks_per_node is None  # deviceProperties lists one GPU: node unknown


def test_bus_factor_follows_nccl_tests() -> None:
    assert bus_factor("all_reduce", 2) == 1.0 and bus_factor("reduce_scatter", 8) == 7 / 8
    assert bus_factor("all_to_all", 4) == 3 / 4 and bus_factor("send_recv", 2) == 1.0


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = job(tmp_path / "job")
    assert main(["collectives", str(folder), "--ranks-per-node", "2", "--json", str(tmp_path / "c.json"),
                 "-o", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert "all_reduce" in out and "inter-node" in out and "allreduce@0 #0" in out
    doc = from_json((tmp_path / "c.json").read_text(), CollectivesDocument)
    assert [c.key for c in doc.calls] == ["allreduce@0", "_allgather_base@1"]
    table = pd.read_csv(tmp_path / "c.csv")
    assert table["waited_ns"].tolist() == [75 * US, 40 * US] and table["ranks"].tolist() == ["0 1 2 3", "0 1"]
    assert main(["collectives", str(folder), "-o", str(tmp_path / "c.csv")]) == 2
    assert "exists; --force" in capsys.readouterr().err


def test_shared_single_rank_sizes_from_the_trace(shared_traces: Path) -> None:
    doc = collectives(load_trace(shared_traces / "hta" / "nccl_data_a100_rank0of2.json.gz"))
    assert len(doc.calls) == 21 and {c.kind for c in doc.calls} == {"all_reduce", "broadcast"}
    assert doc.ranks_per_node == 8 and {c.span for c in doc.calls} == {"intra-node"}  # group [0, 1]
    c = next(c for c in doc.calls if c.kind == "all_reduce")
    assert c.message_bytes == 2049000 * 4 and c.group_size == 2
    assert c.busbw_gbps == pytest.approx(c.message_bytes / c.transfer_ns, rel=1e-6)


def test_dashboard_page_shows_the_document(tmp_path: Path) -> None:
    """The Collectives page's callback renders the same straggler and waiting as the document."""
    pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
    import json

    from whatif.dashboard.app import create_app
    from whatif.dashboard.state import get_store

    folder = job(tmp_path / "job")
    app = create_app([folder])
    run_id = next(iter(app.layout().children[0].children[-1].options))["value"]
    body = {"output": "..coll-body.children...coll-poll.disabled...coll-waiting.data...coll-error.children..",
            "outputs": [{"id": "coll-body", "property": "children"}, {"id": "coll-poll", "property": "disabled"},
                        {"id": "coll-waiting", "property": "data"}, {"id": "coll-error", "property": "children"}],
            "inputs": [{"id": "run", "property": "value", "value": run_id},
                       {"id": "coll-ready", "property": "data", "value": None}], "changedPropIds": ["run.value"]}
    client = app.server.test_client()
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200
    if b"working:" in r.data:   # the first call starts the job; the page's poller calls again when it is done
        get_store().jobs.wait(("collectives", run_id), timeout_s=120)
        r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200 and b"working:" not in r.data
    text = json.dumps(json.loads(r.data)["response"]["coll-body"]["children"])
    doc = collectives(load_trace(folder))
    assert f"{sum(c.waited_ns for c in doc.calls) / 1e6:,.3f}" in text  # 0.115 ms of waiting
    assert "rank 2: 0.075 ms" in text                                   # the worst straggler
