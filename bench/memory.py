"""`whatif memory` on every shared trace recorded with profile_memory: how long the timeline takes
(read, graph, memory document), the peak per device against an independent computation on the raw
JSON (gzip + json: the largest ``Total Allocated``, or the largest running sum of ``Bytes`` where
the trace has sizes only), and how many records found the operator that made them.

Run: .venv/bin/python bench/memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np

from whatif.depgraph.build import build_graph
from whatif.memory import NO_OP, memory, memory_table
from whatif.tracer.trace import load_trace

try:
    from common.docs import replace_section
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
BEGIN, END = "<!-- bench/memory.py begin -->", "<!-- bench/memory.py end -->"


def raw_peaks(path: Path) -> dict[str, int]:
    """Device -> peak allocated bytes, from the raw JSON in file order."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    by_device: dict[str, list[dict]] = {}
    for e in events:
        if e.get("ph") == "i" and e.get("name") == "[memory]":
            a = e["args"]
            label = f"GPU {a['Device Id']}" if a["Device Type"] in (1, 6) else "CPU"
            by_device.setdefault(label, []).append(a)
    return {d: (max(a["Total Allocated"] for a in recs) if all("Total Allocated" in a for a in recs)
                else int(max(np.cumsum([a["Bytes"] for a in recs]))))
            for d, recs in by_device.items()}


def traces_with_memory() -> list[Path]:
    out = []
    for path in sorted(SHARED.rglob("*.json.gz")):
        with gzip.open(path) as f:
            if b'"[memory]"' in f.read():
                out.append(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    rows = ["| trace | records | device | peak MiB (whatif) | raw JSON | equal | baseline | records with an op | "
            "read s | graph s | memory s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in traces_with_memory():
        t0 = time.perf_counter()
        trace = load_trace(path)
        t1 = time.perf_counter()
        graph = build_graph(trace)
        t2 = time.perf_counter()
        doc = memory(trace, graph)
        t3 = time.perf_counter()
        table = memory_table(trace)
        raw = raw_peaks(path)
        name = str(path.relative_to(SHARED))
        for d in doc.devices:
            mine = table[(table["rank"] == d.rank) & (table["device"] == d.device)]
            with_op = float((mine["op"] != NO_OP).mean())
            equal = "yes" if raw[d.device] == d.peak_allocated_bytes else "NO"
            rows.append(f"| `{name}` | {d.records:,} | {d.device} | {d.peak_allocated_bytes / 2**20:,.1f} | "
                        f"{raw[d.device] / 2**20:,.1f} | {equal} | "
                        f"{d.baseline} | {100 * with_op:.1f} % | {t1 - t0:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} |")
    text = "\n".join(rows) + "\n"
    print(text)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, text)
        print("wrote docs/memory.md")


if __name__ == "__main__":
    main()
