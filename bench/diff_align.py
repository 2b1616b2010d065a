"""`whatif diff`'s op-tree alignment on the shared before/after pairs.

Per pair: the share of each side's GPU time per counted step that lands on a matched op, how many
aten ops (holding GPU work, whole trace) each side has and how many were matched, the largest
one-sided work (what is left unmatched), and the alignment's run time (op trees plus matching,
after both traces are analyzed) next to the time to analyze them.

The three HF pairs change the GPU vendor (H100 -> MI300X, kernel names differ); the ResNet50 pair
changes the DataLoader only (same V100); xDiT FLUX swaps attention kernels on one MI300X; HTA's
trace_diff pair changes GPU, world size and eager vs compiled at once (a loose pair).

Run: .venv/bin/python bench/diff_align.py [PAIR ...]   (pair names as printed; default: all)
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from whatif.api import analyze
from whatif.optree import align_ops

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
HF = "tracelens/hf_{}/{}.json.gz"
PAIRS = {
    "hf-qwen": (HF.format("h100", "Qwen_Qwen1.5-0.5B-Chat__1016005"),
                HF.format("mi300", "Qwen_Qwen1.5-0.5B-Chat__1016005")),
    "hf-bert-small": (HF.format("h100", "gaunernst_bert-small-uncased__1016001"),
                      HF.format("mi300", "gaunernst_bert-small-uncased__1016001")),
    "hf-falconsai": (HF.format("h100", "Falconsai_nsfw_image_detection__1016002"),
                     HF.format("mi300", "Falconsai_nsfw_image_detection__1016002")),
    "resnet50-nw0-nw4": ("kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
                         "kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz"),
    "xdit-flux": ("tracelens/xdit_flux1_baseline_mi300x.json.gz", "tracelens/xdit_flux1_aiter_sage_mi300x.json.gz"),
    "hta-trace-diff": ("hta/trace_diff_control_rank3.json.gz", "hta/trace_diff_test_rank1.json.gz"),
}


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="*", help="pairs to run (default: all)")
    names = parser.parse_args().pairs or list(PAIRS)
    if not SHARED.is_dir():
        raise SystemExit(f"shared traces not found at {SHARED}")
    print("matched: GPU ms per step matched / total, share matched, share matched under an aten op")
    print(f"{'pair':<18} {'matched before':>29} {'matched after':>29} {'aten ops matched':>22} "
          f"{'align s':>8} {'analyze s':>9}")
    details = []
    for name in names:
        b_path, a_path = (SHARED / p for p in PAIRS[name])
        t0 = time.perf_counter()
        before, after = analyze(b_path), analyze(a_path)
        t1 = time.perf_counter()
        al = align_ops(before, after)
        t2 = time.perf_counter()
        sides = [f"{m / 1e6:7.2f}/{t / 1e6:7.2f} ms {m / t:6.1%} {o / t:6.1%}" if t else "-"
                 for m, o, t in zip(al.matched_ns, al.matched_op_ns, al.total_ns)]
        ops = f"{al.ops_matched} of {al.ops[0]} / {al.ops[1]}"
        print(f"{name:<18} {sides[0]:>29} {sides[1]:>29} {ops:>22} {t2 - t1:8.2f} {t1 - t0:9.2f}")
        details.append((name, al))
    for name, al in details:
        for label, groups, total in (("before", al.only_before, al.total_ns[0]),
                                     ("after", al.only_after, al.total_ns[1])):
            if not groups:
                continue
            top = ", ".join(f"{g.name}{' ' + _short(g.shapes) if g.shapes else ''}"
                            f"{' under ' + g.under if g.under else ''}: {g.side.ns / 1e6:.3f} ms "
                            f"({g.side.ns / total:.1%}, {g.side.count:g} per step)" for g in groups[:4])
            more = f" (+{len(groups) - 4} more)" if len(groups) > 4 else ""
            print(f"{name} unmatched {label}: {top}{more}")


if __name__ == "__main__":
    main()
