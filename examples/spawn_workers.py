"""Data-parallel training started by ``torch.multiprocessing.spawn``: ``--workers`` processes,
each a rank of a gloo process group (rendezvous through a file, no network port), each training
a small MLP on its own random batches and averaging gradients with ``all_reduce``; a
``whatif.step()`` ends every step.

The process you run only spawns the workers and waits: under ``whatif record`` each worker is
traced into the run folder as its rank (``rank<k>.child.<pid>.pt.trace.json.gz``; docs/recording.md,
"Child processes").

  python examples/spawn_workers.py --workers 2 --steps 4
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import whatif


def worker(rank: int, workers: int, steps: int, width: int, rendezvous: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=workers)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(), torch.nn.Linear(4 * width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x, y = torch.randn(32, width), torch.randn(32, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= workers
        optimizer.step()
        whatif.step()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spawn-workers-") as folder:
        mp.spawn(worker, args=(args.workers, args.steps, args.width, str(Path(folder) / "rendezvous")),
                 nprocs=args.workers)
    print(f"spawn_workers: {args.workers} workers x {args.steps} steps done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
