"""The long fuzzing campaign (issue 20): structure-aware mutations of small traces
(tests/_fuzz.py, 14 mutation classes of traces and mutated serving logs), each input run through
``whatif analyze``, ``predict``, ``export``, ``report`` (traces, in turn) or ``serve`` (serving logs) in a forked child
with an address-space cap and a timeout, so that a crash, a hang and a memory blow-up each count
instead of stopping the campaign. Prints inputs tried, analyzed, refused and crashed per class.

Run: .venv/bin/python bench/fuzz.py [--minutes 30] [--seed 1] [--memory-gib 4] [--timeout-s 60]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import _fuzz  # noqa: E402


def _child(path: str, out: str, command: str, memory_bytes: int, conn) -> None:   # noqa: ANN001 - a Connection
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    try:
        code, err = _fuzz.run_cli(Path(path), Path(out), command)
        conn.send((_fuzz.classify(code, err), err.strip()[:200]))
    except MemoryError:
        conn.send(("crash", "MemoryError (over the cap)"))
    except BaseException as exc:   # noqa: BLE001 - every escape is a crash
        conn.send(("crash", f"{type(exc).__name__}: {str(exc)[:200]}"))


def run_one(path: Path, out: Path, command: str, memory_bytes: int, timeout_s: float) -> tuple[str, str]:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(str(path), str(out), command, memory_bytes, child))
    proc.start()
    child.close()
    if parent.poll(timeout_s):
        result = parent.recv()
        proc.join(5)
        return result
    proc.kill()
    proc.join()
    return ("crash", f"hang or death (no answer in {timeout_s:g} s, exit {proc.exitcode})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--memory-gib", type=float, default=4.0)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args()
    import whatif.cli  # noqa: F401 - imported once in the parent, shared by every forked child

    names = [*sorted(_fuzz.MUTATIONS), "servinglog"]
    counts: Counter[tuple[str, str]] = Counter()
    by_command: Counter[tuple[str, str]] = Counter()
    crashes: list[str] = []
    deadline = time.monotonic() + args.minutes * 60
    with tempfile.TemporaryDirectory() as d:
        for i, name, command, path in _fuzz.inputs(_fuzz.seed_documents(Path(d)), args.seed, Path(d)):
            if time.monotonic() >= deadline:
                break
            result, detail = run_one(path, Path(d) / f"out{i}", command, int(args.memory_gib * 2 ** 30),
                                     args.timeout_s)
            counts[(name, result)] += 1
            by_command[(command, result)] += 1
            if result == "crash":
                crashes.append(f"{name} {command} #{i}: {detail}")
            for used in (Path(d) / f"in{i}", *Path(d).glob(f"out{i}.*")):
                shutil.rmtree(used, ignore_errors=True) if used.is_dir() else used.unlink(missing_ok=True)
    total: Counter[str] = Counter()
    for (_, result), n in counts.items():
        total[result] += n
    print(f"fuzz campaign: seed {args.seed}, {args.minutes:g} min, cap {args.memory_gib:g} GiB, "
          f"timeout {args.timeout_s:g} s per input")
    print(f"{'class':<12} {'tried':>6} {'analyzed':>9} {'refused':>8} {'crashes':>8}")
    for name in names:
        row = [counts[(name, r)] for r in ("analyzed", "refused", "crash")]
        print(f"{name:<12} {sum(row):>6} {row[0]:>9} {row[1]:>8} {row[2]:>8}")
    print(f"{'all':<12} {sum(total.values()):>6} {total['analyzed']:>9} {total['refused']:>8} {total['crash']:>8}")
    print(f"{'command':<12} {'tried':>6} {'exit 0':>9} {'refused':>8} {'crashes':>8}")
    for command in _fuzz.COMMANDS:
        row = [by_command[(command, r)] for r in ("analyzed", "refused", "crash")]
        print(f"{command:<12} {sum(row):>6} {row[0]:>9} {row[1]:>8} {row[2]:>8}")
    causes = Counter(line.split(": ", 1)[1][:100] for line in crashes)
    for cause, n in causes.most_common(20):
        first = next(line for line in crashes if line.split(": ", 1)[1][:100] == cause)
        print(f"crash x{n}: {cause} (first: {first.split(':', 1)[0]})")


if __name__ == "__main__":
    main()
