"""Matching collective kernels across ranks (``depgraph/rules/collectives.py``). Point-to-point
transfers: a pipeline's send on
rank r pairs with the recv on rank r + 1 by the peers PyTorch records (``Dst Rank``/``Src Rank``),
or by a two-rank process group; the clocks of stages that share no transfer with rank 0 are
aligned through their neighbours; the replay then moves a stage's wait with the work upstream.
Collectives of subgroups that share a process group name are told apart by their ranks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.api import analyze
from whatif.collectives import CollectivesOptions, collectives
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.predictors.replay import replay
from whatif.scale.group import task_times
from whatif.scale.job import Backend, ParallelOptions, replay_job
from whatif.tracer.trace import load_trace

US = 1000
STAGES = 4
CLOCK = {0: 0, 1: 700, 2: -300, 3: 2000}     # each rank's trace clock, us ahead of true time
GEMM_US = 100                                # each stage's compute before it sends
TRANSFER_US = 40
SEND = "ncclDevKernel_SendRecv(ncclDevComm*)"


def _p2p_args(direction: str, peer: int | None, group: str) -> dict[str, object]:
    args: dict[str, object] = {"Collective name": direction, "Process Group Name": "0", "Group size": 4,
                               "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "BFloat16",
                               "Process Group Ranks": group}
    if peer is not None:
        args["Dst Rank" if direction == "send" else "Src Rank"] = peer
    return args


def pipeline(folder: Path, peers: bool = True, group: str = "[0, 1, 2, 3]") -> Path:
    """A forward pass through 4 stages: stage r receives from r - 1 (posted at true time 5 us, so
    it waits for the sender), computes a 100 us GEMM, and sends to r + 1; a transfer takes 40 us
    once both ends are there. Stage r's send starts at 140·r + 100 us and ends 40 us later."""
    folder.mkdir()
    for rank in range(STAGES):
        c, tr = CLOCK[rank], KinetoTrace(rank=rank, world_size=STAGES)
        tr.step(1, c, 1000)
        ready = 0
        if rank > 0:
            sent = 140 * (rank - 1) + GEMM_US       # the sender's arrival
            tr.runtime("cudaLaunchKernel", c + 1, 3, corr=1)
            tr.gpu(SEND, c + 5, sent + TRANSFER_US - 5, corr=1, stream=20,
                   **_p2p_args("recv", rank - 1 if peers else None, group))
            ready = sent + TRANSFER_US
        tr.runtime("cudaLaunchKernel", c + 6, 3, corr=2)
        tr.gpu("gemm", c + ready, GEMM_US, corr=2, stream=20)
        if rank < STAGES - 1:
            tr.runtime("cudaLaunchKernel", c + 10, 3, corr=3)
            tr.gpu(SEND, c + ready + GEMM_US, TRANSFER_US, corr=3, stream=20,
                   **_p2p_args("send", rank + 1 if peers else None, group))
        tr.write(folder / f"rank{rank}.pt.trace.json.gz")
    return folder


def _comm_by_rank(graph: TaskGraph) -> dict[int, list[int]]:
    t = graph.tasks
    comm = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.COMM))
    out: dict[int, list[int]] = {}
    for c in comm.tolist():
        out.setdefault(int(t.at[c, "rank"]), []).append(c)
    return out


def _barrier_groups(graph: TaskGraph) -> list[set[int]]:
    """The ranks whose collective kernels each BARRIER joins."""
    e = graph.edges[graph.edges["kind"] == int(EdgeKind.COLLECTIVE)]
    kinds, ranks = graph.tasks["kind"].to_numpy(), graph.tasks["rank"].to_numpy()
    groups: dict[int, set[int]] = {}
    for s, d in zip(e["src"].tolist(), e["dst"].tolist()):
        if kinds[d] == int(TaskKind.BARRIER) and kinds[s] == int(TaskKind.ARRIVE):
            groups.setdefault(d, set()).add(int(ranks[s]))
    return sorted(groups.values(), key=min)


def test_sends_pair_with_the_neighbours_recv(tmp_path: Path) -> None:
    a = analyze(pipeline(tmp_path / "run"))
    g = a.graph
    assert g.report["collectives_matched"] == STAGES - 1
    assert g.report["collective_kernels_unmatched"] == 0
    assert _barrier_groups(g) == [{0, 1}, {1, 2}, {2, 3}]      # not every rank's k-th send together
    # every stage on rank 0's clock (each step starts at true time 0), the last two through their neighbours
    starts = {int(g.tasks.loc[g.tasks["rank"] == r, "measured_start_ns"].min()) for r in range(STAGES)}
    assert len(starts) == 1
    assert g.report["clock_offsets_ns_max_abs"] == 2000 * US
    assert g.report["clock_unaligned_ranks"] == 0
    steps = a.steps
    assert (steps["predicted_ns"] == steps["measured_ns"]).all(), steps


def test_a_faster_first_stage_moves_every_later_stage(tmp_path: Path) -> None:
    a = analyze(pipeline(tmp_path / "run"))
    g = a.graph
    t = g.tasks
    gemm0 = int(np.flatnonzero((t["name"].astype(str) == "gemm").to_numpy() & (t["rank"].to_numpy() == 0))[0])
    faster = g.copy()
    faster.tasks.loc[gemm0, "dur_ns"] = GEMM_US * US // 2
    r = replay(faster)
    last = int(np.flatnonzero((t["name"].astype(str) == "gemm").to_numpy() & (t["rank"].to_numpy() == 3))[0])
    # the pipeline is a chain: rank 0's 50 us reach rank 3's compute through three transfers
    assert a.replay.end_ns[last] - r.end_ns[last] == GEMM_US * US // 2
    for rank, ids in _comm_by_rank(g).items():
        for c in ids:
            assert r.end_ns[c] <= a.replay.end_ns[c], (rank, c)


def test_peers_from_a_two_rank_group(tmp_path: Path) -> None:
    """Without ``Dst Rank``/``Src Rank`` (older profilers) a pair's own process group names the peer."""
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        tr = KinetoTrace(rank=rank, world_size=2)
        tr.step(1, 0, 300)
        tr.runtime("cudaLaunchKernel", 1, 3, corr=1)
        direction, arrive = ("send", 100) if rank == 0 else ("recv", 20)
        tr.gpu(SEND, arrive, 140 - arrive, corr=1, stream=20, **_p2p_args(direction, None, "[0, 1]"))
        tr.write(run / f"rank{rank}.pt.trace.json.gz")
    g = analyze(run).graph
    assert _barrier_groups(g) == [{0, 1}]
    doc = collectives(load_trace(run), g, CollectivesOptions(ranks_per_node=8))
    (call,) = doc.calls
    assert (call.key, call.kind, call.ranks, call.straggler, call.span) == (
        "send/recv 0->1@0", "send_recv", [0, 1], 0, "intra-node")
    assert (call.skew_ns, call.transfer_ns) == (80 * US, 40 * US)


def test_unknown_peers_are_not_matched_across_stages(tmp_path: Path) -> None:
    """A send whose peer the trace does not say is matched with nothing: before, the k-th send of
    every stage was one collective and each stage waited for the slowest."""
    a = analyze(pipeline(tmp_path / "run", peers=False))
    g = a.graph
    assert g.report["collectives_matched"] == 0
    assert g.report["collective_kernels_unmatched"] == 2 * (STAGES - 1)
    assert _barrier_groups(g) == []


def test_report_names_each_transfer_by_its_ends(tmp_path: Path) -> None:
    run = pipeline(tmp_path / "run")
    doc = collectives(load_trace(run), options=CollectivesOptions(ranks_per_node=2))
    assert [(c.key, c.ranks, c.straggler, c.span) for c in doc.calls] == [
        ("send/recv 0->1@0", [0, 1], 0, "intra-node"),
        ("send/recv 1->2@0", [1, 2], 1, "inter-node"),
        ("send/recv 2->3@0", [2, 3], 2, "intra-node")]
    for i, c in enumerate(doc.calls):
        assert c.transfer_ns == TRANSFER_US * US
        assert c.skew_ns == (140 * i + GEMM_US - 5) * US              # the recv posted at 5 us waits
        assert c.message_bytes == pytest.approx((1 << 20) * 2)


@pytest.mark.parametrize("groups", [2, 4])
def test_rank_groups_pair_the_transfers_as_one_process(tmp_path: Path, groups: int) -> None:
    """``whatif job``: each rank group keys its own sends and recvs; the pairs and the clocks
    (aligned through the neighbours) are the one-process build's, task for task."""
    run = pipeline(tmp_path / "run")
    a = analyze(run)
    expected = task_times(a.graph, a.replay.start_ns, a.replay.end_ns)
    job = replay_job(run, ParallelOptions(groups=groups, backend=Backend.INLINE), with_tasks=True)
    assert job.collectives == STAGES - 1 and job.task_times is not None
    got = job.task_times.sort_values(list(expected.columns)).reset_index(drop=True)
    assert got.equals(expected.sort_values(list(expected.columns)).reset_index(drop=True))


def test_subgroups_sharing_a_name_are_two_collectives(tmp_path: Path) -> None:
    """Two tensor-parallel pairs whose process groups are both named "3" (``split_group`` names a
    group on each rank by that rank's count of groups): each pair's all-reduce waits for its own
    partner only. Before, the four ranks' k-th all-reduces were one call."""
    run = tmp_path / "run"
    run.mkdir()
    arrive = {0: 10, 1: 60, 2: 200, 3: 220}     # the second pair arrives much later
    for rank in range(4):
        tr = KinetoTrace(rank=rank, world_size=4)
        tr.step(1, 0, 400)
        tr.runtime("cudaLaunchKernel", 1, 3, corr=1)
        pair = "[0, 1]" if rank < 2 else "[2, 3]"
        end = 100 if rank < 2 else 260
        tr.gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)", arrive[rank], end - arrive[rank], corr=1,
               stream=20, **{"Collective name": "allreduce", "Process Group Name": "3", "Group size": 2,
                             "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "BFloat16",
                             "Process Group Ranks": pair})
        tr.write(run / f"rank{rank}.pt.trace.json.gz")
    a = analyze(run)
    assert _barrier_groups(a.graph) == [{0, 1}, {2, 3}]
    assert a.graph.report["clock_unaligned_ranks"] == 2        # no call links the second pair to rank 0
    assert (a.steps["predicted_ns"] == a.steps["measured_ns"]).all()
    doc = collectives(load_trace(run), a.graph, CollectivesOptions(ranks_per_node=8))
    assert [(c.key, c.occurrence, c.ranks, c.transfer_ns) for c in doc.calls] == [
        ("allreduce@3", 0, [0, 1], 40 * US), ("allreduce@3", 0, [2, 3], 40 * US)]
