"""whatif's per-op FLOPs and bytes (``whatif.core.kernels.op_flops_bytes``, what ``whatif ops``
and the cost models use) against TraceLens's perf models, on the shared HF traces.

TraceLens (AMD-AGI/TraceLens) is not installable here (its requirements pin xprof and friends),
but its repository holds the perf reports TraceLens itself wrote for the very trace files in
``../shared/traces/tracelens/hf_{h100,mi300}`` (``tests/traces/{h100,mi300}/<trace>_perf_report_csvs``,
commit 171dd74, the commit the traces were taken from): one row per op and argument set with
``GFLOPS_first`` and ``Data Moved (MB)_first``. For each row, whatif prices the same op with the
same ``Input Dims``/``Input type``/``Concrete Inputs`` (checked to occur in the trace: the same
op), and the bench prints per perf-model family: ops compared, the share within 1 % on FLOPs and
on bytes, and the worst miss with its op and arguments.

Get the CSVs (the snapshot's largest files are absent, so archive only the reports):
    git --git-dir=DIR archive HEAD -- $(git --git-dir=DIR ls-tree -r --name-only HEAD \\
        | grep 'tests/traces/\\(h100\\|mi300\\)/.*_perf_report_csvs/') | tar -x -C /tmp/tl-ref
Run: .venv/bin/python bench/ops_flops.py [--tracelens /tmp/tl-ref]   (default: $TRACELENS_DIR, else /tmp/tl-ref)
"""
from __future__ import annotations

import argparse
import ast
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from whatif.core.kernels import op_flops_bytes
from whatif.tracer.args import Arg
from whatif.tracer.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "tracelens"
FAMILIES = ("GEMM", "SDPA_fwd", "CONV_fwd", "Normalization", "BinaryElementwise", "UnaryElementwise", "Reduce_fwd")
GPUS = {"h100": "hf_h100", "mi300": "hf_mi300"}
TOLERANCE = 0.01


@dataclass(frozen=True)
class Compared:
    family: str
    trace: str
    op: str
    args: str
    tl_flops: float
    tl_bytes: float
    flops: float | None
    nbytes: float | None

    def miss(self, ours: float | None, theirs: float) -> float:
        """Relative miss (inf when whatif has no figure; 0 when both are 0)."""
        if ours is None:
            return float("inf")
        if theirs == 0:
            return 0.0 if ours == 0 else float("inf")
        return abs(ours - theirs) / theirs


def _literal(text: object) -> object:
    return ast.literal_eval(text) if isinstance(text, str) and text else None


def compare(report: Path, trace_path: Path) -> list[Compared]:
    """Every row of the perf-model CSVs in ``report`` priced by whatif, checked to be an op of the trace."""
    trace = load_trace(trace_path)
    ev = trace.events
    seen = {(n, repr(d)) for n, d in zip(ev["name"].astype(str), trace.arg(Arg.INPUT_DIMS)) if d is not None}
    out = []
    for family in FAMILIES:
        csv = report / f"{family}.csv"
        if not csv.is_file():
            continue
        for r in pd.read_csv(csv, keep_default_na=False).to_dict("records"):
            op = str(r["name"])
            dims, types = _literal(r["Input Dims_first"]), _literal(r["Input type_first"])
            concrete = _literal(r.get("Concrete Inputs_first"))
            if (op, repr(dims)) not in seen:
                raise SystemExit(f"{csv}: {op} {dims} is not an op of {trace_path}")
            got = op_flops_bytes(op, dims, types, concrete)
            out.append(Compared(family, trace_path.name, op, f"{dims} {concrete or ''}", float(r["GFLOPS_first"]) * 1e9,
                                float(r["Data Moved (MB)_first"]) * 2 ** 20,
                                None if got is None else float(got[0]), None if got is None else float(got[1])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracelens", type=Path, default=Path(os.environ.get("TRACELENS_DIR", "/tmp/tl-ref")),
                        help="a TraceLens checkout (or its perf-report CSVs extracted as in the docstring)")
    args = parser.parse_args()
    rows: list[Compared] = []
    for gpu, folder in GPUS.items():
        for trace_path in sorted((SHARED / folder).glob("*.json.gz")):
            stem = trace_path.name[: -len(".json.gz")]
            report = args.tracelens / "tests" / "traces" / gpu / f"{stem}_perf_report_csvs"
            if not report.is_dir():
                print(f"skip {trace_path.name} ({gpu}): no TraceLens report at {report}")
                continue
            rows.extend(compare(report, trace_path))
    if not rows:
        raise SystemExit(f"no TraceLens perf reports under {args.tracelens} (see the docstring)")
    by_family: dict[str, list[Compared]] = defaultdict(list)
    for c in rows:
        by_family[c.family].append(c)
    print(f"whatif op_flops_bytes vs TraceLens perf models, {len(rows)} (op, arguments) rows of "
          f"{len({c.trace for c in rows})} trace names on {len(GPUS)} GPUs; within {100 * TOLERANCE:g} %:")
    print(f"{'family':<18} {'ops':>4} {'FLOPs ok':>9} {'bytes ok':>9}  worst FLOPs miss (whatif vs TraceLens)")
    for family in FAMILIES:
        group = by_family.get(family, [])
        if not group:
            continue
        f_ok = sum(c.miss(c.flops, c.tl_flops) <= TOLERANCE for c in group)
        b_ok = sum(c.miss(c.nbytes, c.tl_bytes) <= TOLERANCE for c in group)
        worst = max(group, key=lambda c: c.miss(c.flops, c.tl_flops))
        miss = worst.miss(worst.flops, worst.tl_flops)
        text = "none" if miss <= TOLERANCE else (
            f"{100 * miss:.1f} %: {worst.op} {worst.args[:90]} ({worst.flops} vs {worst.tl_flops:.0f})")
        print(f"{family:<18} {len(group):>4} {100 * f_ok / len(group):>8.1f}% {100 * b_ok / len(group):>8.1f}%  "
              f"{text if miss > TOLERANCE else 'none over 1 %, worst ' + f'{100 * miss:.2f} %'}")
    bytes_worst = max(rows, key=lambda c: c.miss(c.nbytes, c.tl_bytes))
    print(f"worst bytes miss: {100 * bytes_worst.miss(bytes_worst.nbytes, bytes_worst.tl_bytes):.2f} %: "
          f"{bytes_worst.op} {bytes_worst.args[:90]} ({bytes_worst.nbytes} vs {bytes_worst.tl_bytes:.0f})")


if __name__ == "__main__":
    main()
