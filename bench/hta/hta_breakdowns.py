"""Run inside a venv that has HolisticTraceAnalysis (not whatif's): print HTA's temporal, idle
and overlap breakdowns of one trace folder as JSON on stdout, and the window HTA kept (its
GPU activities, by category), for bench/breakdown_hta.py.

Run: HTA_PYTHON bench/hta/hta_breakdowns.py FOLDER
"""
from __future__ import annotations

import contextlib
import io
import json
import sys

from hta.trace_analysis import TraceAnalysis


def main(folder: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        analyzer = TraceAnalysis(trace_dir=folder)
        temporal = analyzer.get_temporal_breakdown(visualize=False)
        ranks = analyzer.t.get_ranks()
        idle, _ = analyzer.get_idle_time_breakdown(ranks=ranks, visualize=False)
        overlap = analyzer.get_comm_comp_overlap(visualize=False)
    sym = analyzer.t.symbol_table.get_sym_table()
    kept = {}
    for rank in ranks:
        df = analyzer.t.get_trace(rank)
        gpu = df[df["stream"].ne(-1)]
        kept[str(rank)] = {str(sym[c]): int(n) for c, n in gpu["cat"].value_counts().items()}
    out = {"temporal": temporal.to_dict(orient="records"), "idle": idle.to_dict(orient="records"),
           "overlap": overlap.to_dict(orient="records"), "kept": kept,
           "iterations": {str(r): [int(i) for i in analyzer.t.get_iterations(r)] for r in ranks}}
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main(sys.argv[1])
