"""Run with TraceLens (AMD-AGI/TraceLens source on PYTHONPATH, its own venv), for bench/interop.py:
TraceLens's perf report of one PyTorch trace (``generate_perf_report_pytorch``), its GEMM and SDPA
tables as JSON on stdout: each op row's identity (name, the parameters TraceLens derived from the
shapes, the shapes and types, the count) and the summed kernel time.

Run: PYTHONPATH=TRACELENS_SRC TRACELENS_PYTHON bench/tracelens/tracelens_tables.py TRACE
"""
from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings

from TraceLens.Reporting.generate_perf_report_pytorch import generate_perf_report_pytorch

SHEETS = ("GEMM", "SDPA_fwd")
IDENTITY = ("Input Dims_first", "Input type_first", "Concrete Inputs_first", "name_count", "GFLOPS_first")
KERNEL_SUM = "Kernel Time (µs)_sum"


def tables(trace: str) -> dict:
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        sheets = generate_perf_report_pytorch(trace)
    out: dict = {"sheets": sorted(sheets)}
    for name in SHEETS:
        df = sheets.get(name)
        if df is None:
            continue
        keys = [c for c in df.columns if c == "name" or c.startswith("param:") or c in IDENTITY]
        out[name] = {"rows": sorted(json.dumps([str(r[c]) for c in keys]) for _, r in df.iterrows()),
                     "kernel_us": round(float(df[KERNEL_SUM].sum()), 3)}
    return out


if __name__ == "__main__":
    print(json.dumps(tables(sys.argv[1])))
