"""What the example servers share: device/threads/dtype choice, arrival schedules, sleeping in
wall-clock time, and summary statistics (whatif's own) (times in seconds unless a name says ``_ms``).

Imported as a sibling module (``python examples/x.py`` and ``whatif record examples/x.py`` both put
``examples/`` first on ``sys.path``).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import time
from collections.abc import Callable
from typing import Any

import torch

# The same percentile/stats definitions as the serving predictor's, so measured and predicted
# metrics are computed alike.
from whatif.predictors.serving.metrics import percentile, stats  # noqa: F401  (re-exported)

SDPA_BACKENDS = ("auto", "math", "flash", "efficient", "cudnn")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""``--autocast``'s choices besides ``off``."""


def add_runtime_args(parser: argparse.ArgumentParser, dtype: bool = True) -> None:
    """The ``--device``, ``--threads`` and ``--sdpa`` flags (and ``--dtype`` when ``dtype``) every
    example takes."""
    parser.add_argument("--device", default=None, help="cpu or cuda[:N]; None: cuda if available")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads; None: 1 on cpu (intra-op threads make timings erratic "
                             "on small shared machines), unchanged on cuda; 0: torch's default")
    parser.add_argument("--sdpa", default="auto", choices=SDPA_BACKENDS,
                        help="scaled-dot-product-attention backend (auto: torch's choice; on Hopper GPUs that can "
                             "be cuDNN, which builds a plan for every new sequence length)")
    if dtype:
        parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                            help="auto: bfloat16 on cuda, float32 on cpu")


def pick_device(name: str | None) -> torch.device:
    """``name``, or cuda when available, else cpu."""
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def set_threads(threads: int | None, device: torch.device) -> None:
    """``torch.set_num_threads``: ``threads`` if > 0, else 1 on cpu when not given."""
    if threads is None and device.type == "cpu":
        threads = 1
    if threads:
        torch.set_num_threads(threads)


def attention_backend(name: str) -> contextlib.AbstractContextManager[Any]:
    """``--sdpa``: a context forcing one scaled-dot-product-attention backend (``auto``: none)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name])


def join_torchrun(ranks: int, flags: str, device: torch.device) -> str | None:
    """Join torchrun's process group of ``ranks`` processes (nccl on a GPU, gloo on the CPU) and
    return None, or say why it cannot (``flags``: the options that asked for them)."""
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != ranks:
        return f"{flags} needs {ranks} processes started by torchrun (WORLD_SIZE is {world})"
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        return f"{flags} needs torchrun's {', '.join(missing)} in the environment"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return None


class Collectives:
    """All-reduce, all-to-all, all-gather and ring send/receive among ``ranks`` (this rank one of them):
    torch.distributed's (``group``: the group already made for them, None for every rank) on a
    GPU; on the CPU a gloo process group of its own with one communication thread, each collective
    followed by a one-element all-reduce of a tensor allocated once (the fence).

    Why, on the CPU: gloo's work object holds a collective's tensors and its thread may release
    them after the call has returned, so the last reference to a buffer can die on that thread,
    where the profiler records no allocator event, and the recording would hold the block to its
    end. With one thread running the works in order, the fence's return means the collective's
    work is released, and this thread frees its buffers, recorded. (A gloo group made by
    ``dist.new_group`` ignores ``pg_options``: it always runs two threads.) Sends and receives
    need no fence: gloo runs them outside its threads, and their work objects, which hold the
    tensors, are dropped here (:class:`Pending`)."""

    def __init__(self, ranks: list[int], device: torch.device, name: str, group: Any = None) -> None:
        import datetime

        import torch.distributed as dist
        self.group = group
        self.ranks = ranks
        self.index = ranks.index(dist.get_rank())
        self.gloo: Any = None
        self._tag = 0
        if device.type == "cpu":
            options = dist.ProcessGroupGloo._Options()
            options._threads = 1
            options._devices = [dist.ProcessGroupGloo.create_default_device()]
            options._timeout = datetime.timedelta(minutes=10)
            store = dist.PrefixStore(name, dist.distributed_c10d._get_default_store())
            self.gloo = dist.ProcessGroupGloo(store, self.index, len(ranks), options)
            self.fence = torch.zeros(1)

    def _fenced(self, work: Any) -> None:
        work.wait()
        self.gloo.allreduce([self.fence]).wait()

    def all_reduce(self, x: torch.Tensor) -> None:
        """Sum ``x`` over the ranks, in place."""
        if self.gloo is None:
            import torch.distributed as dist
            dist.all_reduce(x, group=self.group)
        else:
            self._fenced(self.gloo.allreduce([x]))

    def all_to_all(self, got: torch.Tensor, send: torch.Tensor) -> None:
        """``all_to_all_single``: rank r's ``send`` chunk i lands in rank i's ``got`` chunk r."""
        if self.gloo is None:
            import torch.distributed as dist
            dist.all_to_all_single(got, send, group=self.group)
        else:
            self._fenced(self.gloo.alltoall_base(got, send, [], []))

    def all_gather(self, parts: list[torch.Tensor], x: torch.Tensor) -> None:
        """Every rank's ``x`` into ``parts``, in rank order."""
        if self.gloo is None:
            import torch.distributed as dist
            dist.all_gather(parts, x, group=self.group)
        else:
            self._fenced(self.gloo.allgather([parts], [x]))

    def send_recv(self, gots: list[torch.Tensor], sends: list[torch.Tensor]) -> Pending:
        """Start sending each of ``sends`` to the next rank of the ring (the ranks in their order)
        and receiving the previous rank's into the matching one of ``gots``; returns what to wait
        for. The sent tensors must be contiguous."""
        nxt, prev = (self.index + 1) % len(self.ranks), (self.index - 1) % len(self.ranks)
        if self.gloo is None:
            import torch.distributed as dist
            ops = [dist.P2POp(dist.isend, s, self.ranks[nxt], self.group) for s in sends]
            ops += [dist.P2POp(dist.irecv, g, self.ranks[prev], self.group) for g in gots]
            return Pending(dist.batch_isend_irecv(ops))
        works = []
        for send, got in zip(sends, gots):
            self._tag += 1
            works += [self.gloo.send([send], nxt, self._tag), self.gloo.recv([got], prev, self._tag)]
        return Pending(works)


class Pending:
    """Point-to-point transfers started and not yet waited for: :meth:`wait` waits for them and
    drops them, so the tensors they hold are released here (as ring-flash-attention's
    ``RingComm.wait`` does)."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        self.works = []


def mixed_precision(name: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``--autocast``: ``torch.autocast`` to the named 16-bit dtype on ``device`` (``off``: none)."""
    if name == "off":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[name])


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on cuda, float32 on cpu; else the named torch dtype."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def poisson_schedule(n: int, rate: float, rng: random.Random) -> list[float]:
    """``n`` arrival times in seconds: first at 0, then exponential gaps of mean ``1/rate``."""
    times, t = [], 0.0
    for i in range(n):
        if i and rate > 0 and math.isfinite(rate):
            t += rng.expovariate(rate)
        times.append(t)
    return times


def sleep_until(target_s: float, clock: Callable[[], float]) -> None:
    """Sleep until ``clock() >= target_s`` (seconds); busy-waits the last millisecond."""
    while (left := target_s - clock()) > 0:
        if left > 2e-3:
            time.sleep(left - 1e-3)


def json_safe(d: dict[str, Any]) -> dict[str, Any]:
    """Non-finite floats (``--rate inf``) as strings, so the log is strict JSON."""
    return {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}
