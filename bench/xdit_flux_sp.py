"""whatif's ``sequence_parallel`` against xDiT's published FLUX.1-dev latencies on 4x H100.

The measurements: xdit-project/xDiT @ 0124baf, ``docs/performance/flux.md``, "Scalability of Flux.1
Dev": FLUX.1 [dev], 28 diffusion steps, a 1024px image, on 4 H100s (NVLink), end-to-end seconds per
image with ``torch.compile`` (the GPU-bound column; the eager column is 1.6-2.9x slower and does not
scale like the GPU work) for one GPU, Ulysses-2, Ring-2, Ulysses-2 x Ring-2 (USP), Ulysses-4 and
Ring-4. Typed in below.

whatif's side: one denoising step of a FLUX.1-like DiT on one H100 (tests/_llm_tracegen.py, kernels
at the H100's achievable roofline): 57 blocks (FLUX.1's 19 double-stream + 38 single-stream blocks,
black-forest-labs/flux ``src/flux/util.py``: hidden 3072, 24 heads, MLP ratio 4), each block 12 h^2
weights per token (QKV 3h^2, output h^2, and FLUX's 4h GELU MLP, 8h^2, as a gated MLP of width 8192,
the same FLOPs), full (non-causal) attention over 4,608 tokens (a 1024px image is 64 x 64 latent
patches, 4,096 image tokens, plus FLUX.1-dev's 512 T5 text tokens). ``sequence_parallel`` in each of
xDiT's modes on the DGX H100 preset (4 GPUs of one machine). The trace models the denoising steps
only; the measured seconds also hold the text encoders and the VAE decode, which xDiT runs unsplit.
Two ways to put the prediction on the measured end-to-end scale, each calibrated on the one-GPU
measurement only (the "before", as a user's own trace would be):

* **scaled**: every step scaled so that one GPU matches, ``T_n = T_1,measured x X_n / X_1``
  (all of the one-GPU difference is in the denoising steps);
* **serial**: the one-GPU difference is work that does not split, ``T_n = s + 28 X_n``,
  ``s = T_1,measured - 28 X_1``.

The parallel rows are then predictions, scored against the measurement and against predicting no
change (the one-GPU time).

  .venv/bin/python bench/xdit_flux_sp.py      (~5 s)
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from _llm_tracegen import llm_trace  # noqa: E402
from papers import _ms  # noqa: E402

from whatif.api import analyze, make_context  # noqa: E402
from whatif.transforms.parallel.sequence import SequenceParallel  # noqa: E402

STEPS = 28
BLOCKS, HIDDEN, HEADS, MLP_GATED_WIDTH = 57, 3072, 24, 8192
TOKENS = 64 * 64 + 512


@dataclass(frozen=True)
class Config:
    """One of xDiT's sequence-parallel configurations and its measured seconds per image."""

    label: str
    measured_s: float
    transform: SequenceParallel | None


CONFIGS = (
    Config("1 GPU", 4.30, None),
    Config("Ulysses-2", 2.68, SequenceParallel(mode="ulysses", degree=2, topology="dgx_h100")),
    Config("Ring-2", 2.60, SequenceParallel(mode="ring", degree=2, topology="dgx_h100")),
    Config("Ulysses-2 x Ring-2", 1.80, SequenceParallel(mode="usp", degree=4, ulysses_degree=2, topology="dgx_h100")),
    Config("Ulysses-4", 1.63, SequenceParallel(mode="ulysses", degree=4, topology="dgx_h100")),
    Config("Ring-4", 1.98, SequenceParallel(mode="ring", degree=4, topology="dgx_h100")),
)


def _best(rows: list[tuple[str, float]]) -> str:
    return min(rows, key=lambda r: r[1])[0]


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="whatif-xdit-"))
    a = analyze(llm_trace(tmp / "flux_dev_1024px.json.gz", new_tokens=TOKENS, kv_tokens=TOKENS, layers=BLOCKS,
                          hidden=HIDDEN, heads=HEADS, ffn=MLP_GATED_WIDTH, steps=1, device="H100_SXM"))
    ctx = make_context(a.trace)
    step = {c.label: _ms(c.transform.apply(a.graph, ctx) if c.transform else a.graph) for c in CONFIGS}
    one = CONFIGS[0]
    x1 = step[one.label]
    serial_s = one.measured_s - STEPS * x1 / 1e3
    print("## FLUX.1-dev, 1024px, 28 steps, 4x H100 (DGX H100 preset): whatif's sequence_parallel vs xDiT measured "
          "(torch.compile)")
    print(f"one GPU: whatif {x1:.1f} ms per denoising step, x 28 = {STEPS * x1 / 1e3:.2f} s; measured "
          f"{one.measured_s:.2f} s per image (the rest, {serial_s:.2f} s, is the 'serial' calibration's unsplit work)")
    print("| configuration | whatif ms per step | speedup over 1 GPU, whatif | measured | scaled, s | error | "
          "serial, s | error | no change, error |")
    print("|---|---|---|---|---|---|---|---|---|")
    scaled_err, serial_err, none_err = [], [], []
    for c in CONFIGS[1:]:
        x = step[c.label]
        scaled = one.measured_s * x / x1
        serial = serial_s + STEPS * x / 1e3
        errs = [(p / c.measured_s - 1) * 100 for p in (scaled, serial, one.measured_s)]
        scaled_err.append(abs(errs[0]))
        serial_err.append(abs(errs[1]))
        none_err.append(abs(errs[2]))
        print(f"| {c.label} | {x:.2f} | {x1 / x:.2f}x | {one.measured_s / c.measured_s:.2f}x | {scaled:.2f} | "
              f"{errs[0]:+.1f} % | {serial:.2f} | {errs[1]:+.1f} % | {errs[2]:+.1f} % |")
    n = len(CONFIGS) - 1
    print(f"mean |error|: scaled {sum(scaled_err) / n:.1f} %, serial {sum(serial_err) / n:.1f} %, "
          f"no change {sum(none_err) / n:.1f} %")
    for gpus in (2, 4):
        group = [c for c in CONFIGS[1:] if c.transform is not None and c.transform.degree == gpus]
        meas = _best([(c.label, c.measured_s) for c in group])
        pred = _best([(c.label, step[c.label]) for c in group])
        order_m = " < ".join(c.label for c in sorted(group, key=lambda c: c.measured_s))
        order_p = " < ".join(c.label for c in sorted(group, key=lambda c: step[c.label]))
        print(f"{gpus} GPUs: fastest measured {meas}, whatif {pred} ({'same' if meas == pred else 'differs'}); "
              f"measured order {order_m}; whatif {order_p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
