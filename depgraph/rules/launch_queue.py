"""The launch queue: a launch call returns once its command is in the stream's queue, and that
queue holds :data:`LAUNCH_QUEUE_DEPTH` pending launches. When it is full, the call blocks until
the GPU frees an entry: a GPU slower than the CPU eventually paces the CPU, a faster one frees it.

**The evidence.** BACKGROUND.md: the CUDA runtime blocks the launching thread at ~1,024 pending
launches. An NVIDIA forum thread ("CUDA stream are blocked when launch lots of kernels (>1000)",
forums.developer.nvidia.com/t/68937, also stackoverflow.com/q/53970187) measures it: launches
return in 4-5 µs for the first ~1,000 kernels, then each takes as long as a kernel runs, and
with three streams *each* stream takes ~1,000 before blocking. HTA's queue length
(``TraceCounters.get_queue_length_time_series``) is likewise counted per stream, and its
blocked-on-full-queue time takes the maximum length as a parameter. So: per stream, in the order
the calls returned, entry k is one call's work on that stream (a graph launch is one entry).

**The rule.** The call of entry ``k`` cannot return before the work of entry ``k - depth`` on
the same stream has finished: a LAUNCH_QUEUE edge from that work's last task to the call,
bounding the call's *end* (like a SYNC edge) with latency 0. Finished, not started: the forum
measurement paces a blocked launch at the kernel's duration, and the graph's edges leave from a
task's end; on an in-order stream the two differ by one entry in 1,024.

**Consistency with the trace.** A stream whose measured queue held more entries than the depth
(pending = entries whose call returned minus entries finished; AMD's HIP queues hold more, e.g.
1,840 on ``tracelens/mi300x_resnet_act_ckpt``) gets its measured maximum + 1 as its depth,
counted in ``launch_queue_depth_raised_streams``. No shared CUDA trace comes within reach of
1,024 (the most: 1,013 on ``hta/trace_diff_test_rank1``, 958 on ``hta/negative_queue``), so the
edges do not bind in the unmodified replay. Where the work of entry ``k - depth`` still ended
after call ``k`` returned (calls from several threads, out of order), the trace contradicts the
edge: it is left out, counted in ``launch_queue_edges_out_of_order``.
"""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import EdgeRule
from .blocking import BlockingCallIssue

LAUNCH_QUEUE_DEPTH = 1024  # pending launches a stream's queue holds (see the module docstring)


class LaunchQueue(EdgeRule):
    """LAUNCH_QUEUE edges: the work of the launch ``depth`` entries back on a stream -> the launch call."""

    kind = EdgeKind.LAUNCH_QUEUE
    needs = (BlockingCallIssue,)

    def __init__(self, depth: int = LAUNCH_QUEUE_DEPTH) -> None:
        if depth < 1:
            raise ValueError("the launch queue depth must be >= 1")
        self.depth = depth

    def edges(self, state: BuildState) -> EdgeSet:
        end = state.end_ns
        launcher = state.launch_of[state.gpu_ids]
        gpu, call = state.gpu_ids[launcher >= 0], launcher[launcher >= 0]
        stream = state.column("resource")[gpu].astype(np.int64)
        # one entry per (stream, call): its last-ending task; entries per stream in call-return order
        order = np.lexsort((end[gpu], call, stream))
        gpu, call, stream = gpu[order], call[order], stream[order]
        last = np.r_[(stream[1:] != stream[:-1]) | (call[1:] != call[:-1]), True] if len(gpu) else np.zeros(0, bool)
        work, call, stream = gpu[last], call[last], stream[last]
        order = np.lexsort((call, end[call], stream))
        work, call, stream = work[order], call[order], stream[order]
        src: list[np.ndarray] = []
        dst: list[np.ndarray] = []
        report = state.report
        raised = max_pending = 0
        for s in np.unique(stream).tolist():
            on = stream == s
            w, c = work[on], call[on]
            finished = np.searchsorted(np.sort(end[w]), end[c], side="right")
            pending = int((np.arange(1, len(c) + 1) - finished).max())
            max_pending = max(max_pending, pending)
            depth = self.depth
            if pending >= depth:
                depth, raised = pending + 1, raised + 1
            src.append(w[:-depth] if len(w) > depth else w[:0])
            dst.append(c[depth:])
        s_ids = np.concatenate(src) if src else np.empty(0, dtype=np.int64)
        d_ids = np.concatenate(dst) if dst else np.empty(0, dtype=np.int64)
        ok = end[s_ids] <= end[d_ids]
        report["launch_queue_edges"] = int(ok.sum())
        report["launch_queue_max_pending"] = max_pending
        report["launch_queue_depth_raised_streams"] = raised
        report["launch_queue_edges_out_of_order"] = int((~ok).sum())
        return EdgeSet.of(self.kind, s_ids[ok], d_ids[ok], np.zeros(int(ok.sum()), dtype=np.int64))
