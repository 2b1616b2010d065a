"""Run inside a venv that has HolisticTraceAnalysis 0.5.0 (not whatif's), for bench/interop.py:
print as JSON on stdout what HTA makes of one trace folder.

Run: HTA_PYTHON bench/hta/hta_interop.py ranks FOLDER
     HTA_PYTHON bench/hta/hta_interop.py critical-path FOLDER ANNOTATION INSTANCE
"""
from __future__ import annotations

import contextlib
import io
import json
import sys

from hta.trace_analysis import TraceAnalysis


def ranks(folder: str) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):
        analyzer = TraceAnalysis(trace_dir=folder)
    return {"ranks": sorted(int(r) for r in analyzer.t.get_ranks())}


def critical_path(folder: str, annotation: str, instance: str) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):
        analyzer = TraceAnalysis(trace_dir=folder)
        graph, ok = analyzer.critical_path_analysis(rank=0, annotation=annotation, instance_id=int(instance))
        summary = graph.summary()
    return {"ok": bool(ok), "nodes": graph.number_of_nodes(), "edges": graph.number_of_edges(),
            "critical_path_edges": len(graph.critical_path_edges_set),
            "summary_pct": {str(k): round(float(v), 6) for k, v in summary.items() if str(k)}}


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    print(json.dumps(ranks(*rest) if what == "ranks" else critical_path(*rest)))
