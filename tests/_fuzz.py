"""A structure-aware fuzzer of Kineto traces, shared by tests/test_fuzz.py (a short seeded campaign)
and bench/fuzz.py (a long one in forked, memory-capped children).

Each mutation class takes a decoded trace document and a random generator and returns the bytes
of one hostile file (or, for ``multirank``, a folder's files). An input is *analyzed* (exit 0),
*refused* (exit 2, one line) or a *crash* (any other exception, a hang, a memory blow-up).
"""
from __future__ import annotations

import contextlib
import copy
import gzip
import io
import itertools
import json
import random
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _llm_tracegen import llm_trace
from tracegen import KinetoTrace

Doc = dict[str, Any]
Files = dict[str, bytes]      # file name -> bytes (one entry, or several for a folder)

EXTREMES: tuple[Any, ...] = (2 ** 63, -(2 ** 63) - 1, 2 ** 64, 2 ** 40, 1e308, -1e308, 0, -1, 1.5, 2 ** 53 + 1,
                             "12", "x", None, True, [], {}, 1e-300)
NUMERIC_KEYS = ("ts", "dur", "pid", "tid")
ARG_KEYS = ("correlation", "External id", "device", "stream", "Input Dims", "Concrete Inputs")


def _events(doc: Doc) -> list[dict]:
    events = doc.get("traceEvents")
    return events if isinstance(events, list) else []


def _dump(doc: Doc) -> bytes:
    return json.dumps(doc).encode()


def _splice(doc: Doc, raw: bytes) -> bytes:
    """``doc`` as JSON with ``raw`` inserted inside a random event's object (or at top level)."""
    text = _dump(doc)
    at = text.rfind(b'"ph"')
    return text[:at] + raw + b", " + text[at:] if at > 0 else text[:-1] + b", " + raw + b"}"


def nesting(doc: Doc, rng: random.Random) -> Files:
    depth = rng.choice((500, 1000, 3000, 20000))
    open_, close = rng.choice(((b"[", b"]"), (b'{"a":', b"}")))
    return {"t.json": _splice(doc, b'"deep": ' + open_ * depth + b"1" + close * depth)}


def encoding(doc: Doc, rng: random.Random) -> Files:
    bad = rng.choice((b"\xff", b"\xed\xa0\x80", b"\\udcff", b"\\ud800x", b"\xc3", b"\x00", b"\\u0000"))
    return {"t.json": _splice(doc, b'"name2": "a' + bad + b'b"')}


def number(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        events = _events(doc)
        if rng.random() < 0.2 or not events:
            doc["baseTimeNanoseconds"] = rng.choice(EXTREMES)
            continue
        ev = rng.choice(events)
        if rng.random() < 0.5:
            ev[rng.choice(NUMERIC_KEYS)] = rng.choice(EXTREMES)
        else:
            ev.setdefault("args", {})
            if isinstance(ev["args"], dict):
                ev["args"][rng.choice(ARG_KEYS)] = rng.choice(EXTREMES)
    return {"t.json": _dump(doc)}


def step(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    events = _events(doc)
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    choice = rng.randrange(4)
    if choice == 0:   # no step at all
        doc["traceEvents"] = [e for e in events if e not in steps]
    elif choice == 1 and events:
        rng.choice(events)["name"] = f"ProfilerStep#{rng.choice((2 ** 63, 2 ** 31, -1, 0, 10 ** 30, 'x', ''))}"
    elif choice == 2 and steps:
        for s in steps:
            s["name"] = steps[0]["name"]          # every step the same number
    elif steps:
        s = rng.choice(steps)
        s["dur"] = rng.choice((0, -5, 1e-3, 10 ** 12))
    return {"t.json": _dump(doc)}


def metadata(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    key = rng.choice(("distributedInfo", "deviceProperties", "schemaVersion", "displayTimeUnit", "traceName"))
    if key == "distributedInfo":
        doc[key] = {"rank": rng.choice(EXTREMES), "world_size": rng.choice(EXTREMES),
                    "backend": rng.choice(EXTREMES)}
    else:
        doc[key] = rng.choice((*EXTREMES, [{"name": 5, "totalGlobalMem": "lots"}], [None]))
    return {"t.json": _dump(doc)}


def flows(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    events = _events(doc)
    x_events = [e for e in events if e.get("ph") == "X"]
    for _ in range(rng.randint(1, 6)):
        if not x_events:
            break
        e = rng.choice(x_events)
        events.append({"ph": rng.choice(("s", "f", "t", "s")), "cat": rng.choice(("ac2g", "fwdbwd", "gpu_user", 5)),
                       "id": rng.choice((1, 1, 2, "a", None, 2 ** 70)), "pid": e.get("pid"), "tid": e.get("tid"),
                       "ts": e.get("ts") if rng.random() < 0.7 else rng.choice(EXTREMES), "bp": "e"})
    return {"t.json": _dump(doc)}


def correlation(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    with_corr = [e for e in _events(doc) if isinstance(e.get("args"), dict) and "correlation" in e["args"]]
    if with_corr:
        value = rng.choice(with_corr)["args"]["correlation"]
        for e in rng.sample(with_corr, k=max(1, len(with_corr) // rng.choice((1, 2, 5)))):
            e["args"]["correlation"] = value if rng.random() < 0.7 else rng.choice(EXTREMES)
    return {"t.json": _dump(doc)}


def shuffle(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    rng.shuffle(_events(doc))
    return {"t.json": _dump(doc)}


def drop(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    events = _events(doc)
    if rng.random() < 0.5:
        keep = rng.random()
        doc["traceEvents"] = [e for e in events if rng.random() < keep]
    else:
        for e in rng.sample(events, k=min(len(events), rng.randint(1, 20))):
            e.pop(rng.choice(("ph", "ts", "dur", "name", "cat", "pid", "tid", "args")), None)
    return {"t.json": _dump(doc)}


def types(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    events = _events(doc)
    for e in rng.sample(events, k=min(len(events), rng.randint(1, 10))):
        e[rng.choice(("ph", "ts", "dur", "name", "cat", "pid", "tid", "args", "id"))] = rng.choice(
            (*EXTREMES, "X", ["X"], {"a": 1}))
    if rng.random() < 0.1:
        doc["traceEvents"] = rng.choice(({}, "events", 5, None, [[]], [1, 2]))
    return {"t.json": _dump(doc)}


def truncate(doc: Doc, rng: random.Random) -> Files:
    text = _dump(doc)
    return {"t.json": text[:rng.randrange(len(text))]}


def gzipped(doc: Doc, rng: random.Random) -> Files:
    data = gzip.compress(_dump(doc), mtime=0)
    choice = rng.randrange(4)
    if choice == 0:
        data = data[:rng.randrange(2, len(data))]
    elif choice == 1:
        at = rng.randrange(10, len(data))
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    elif choice == 2:   # a small bomb: 20 MiB of spaces after the document
        data = gzip.compress(_dump(doc)[:-1] + b', "pad": "' + b" " * (20 << 20) + b'"}', mtime=0)
    else:
        data = data + b"garbage after the member"
    return {"t.json.gz": data}


def size(doc: Doc, rng: random.Random) -> Files:
    doc = copy.deepcopy(doc)
    events = _events(doc)
    if events:
        e = rng.choice(events)
        big = rng.choice(("n" * (1 << 20), list(range(100_000)), [[1] * 50] * 2000))
        e[rng.choice(("name", "args", "cat"))] = big if rng.random() < 0.5 else {"Input Dims": big}
    return {"t.json": _dump(doc)}


def multirank(doc: Doc, rng: random.Random) -> Files:
    files = {}
    for i in range(rng.randint(2, 3)):
        d = copy.deepcopy(doc)
        d["distributedInfo"] = {"rank": rng.choice((0, 1, i, 2 ** 31, -1, "1")),
                                "world_size": rng.choice((2, 3, 1, 2 ** 31, 0))}
        files[f"rank{rng.choice((i, 0, 2 ** 40))}.json"] = _dump(d)
    return files


SERVING_RUNS = tuple(Path(__file__).resolve().parents[1] / "sample_traces" / n for n in ("dit_serve", "llm_serve"))


def _json_paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in itertools.islice(items, 6):   # a few children per level keep the walk small
        yield from _json_paths(child, (*path, key))


def _mutate_json(doc: Any, rng: random.Random) -> None:
    """Replace a random value of ``doc`` in place by an extreme, drop a key or empty a container."""
    *parent_path, key = rng.choice([p for p in _json_paths(doc) if p])
    parent = doc
    for k in parent_path:
        parent = parent[k]
    choice = rng.randrange(4)
    if choice == 0:
        parent[key] = rng.choice((*EXTREMES, float("nan"), float("inf")))
    elif choice == 1 and isinstance(parent, dict):
        del parent[key]
    elif choice == 2 and isinstance(parent[key], (list, dict)):
        parent[key] = type(parent[key])()
    else:
        parent[key] = rng.choice(("prefill", "decode", "denoise", "--log", -1, [None]))


def serving_log(rng: random.Random) -> Files:
    """A sample serving run (trace, meta.jsonc) with its serving log (or, one time in five, its
    meta.jsonc) mutated: values replaced by extremes, keys dropped, containers emptied, the bytes
    truncated or made invalid UTF-8. meta.jsonc's ``cwd`` points nowhere, so the log is the one in
    the mutated folder."""
    run = rng.choice(SERVING_RUNS)
    files = {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}
    meta = json.loads(files["meta.jsonc"])
    meta["cwd"] = "/nonexistent-whatif-fuzz"
    name = "meta.jsonc" if rng.random() < 0.2 else "serving.log"
    doc = meta if name == "meta.jsonc" else json.loads(files[name])
    for _ in range(rng.randint(1, 3)):
        _mutate_json(doc, rng)
    files["meta.jsonc"] = json.dumps(meta).encode()
    text = json.dumps(doc).encode()
    tail = rng.randrange(3)
    if tail == 1:
        text = text[:rng.randrange(len(text))]
    elif tail == 2:
        text = text[:-1] + b', "bad": "\xff\\udcff"}'
    files[name] = text
    return files


MUTATIONS: dict[str, Callable[[Doc, random.Random], Files]] = {
    f.__name__: f for f in (nesting, encoding, number, step, metadata, flows, correlation, shuffle, drop, types,
                            truncate, gzipped, size, multirank)}


def seed_documents(tmp: Path) -> list[Doc]:
    """Small traces of the shapes the reader and builder meet: an LLM decode and a training step,
    a multi-stream trace with flows and a NCCL kernel, and one without steps."""
    docs = []
    for kw in ({"layers": 1, "steps": 2}, {"layers": 1, "steps": 1, "backward": True, "batch": 2, "new_tokens": 8}):
        path = llm_trace(tmp / f"seed{len(docs)}.json.gz", **kw)
        docs.append(json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()))
    tr = KinetoTrace(rank=0, world_size=2)
    tr.step(1, 0, 200)
    tr.gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50, 30, corr=3, stream=13)
    tr.gpu("gemm", 20, 20, corr=2)
    tr.runtime("cudaLaunchKernel", 10, 3, corr=2)
    tr.runtime("cudaLaunchKernel", 15, 3, corr=3)
    tr.flow("fwdbwd", 1, "s", 10, 1)
    tr.flow("fwdbwd", 1, "f", 15, 1)
    tr.memory(12, 4096, addr=7, total_allocated=8192, total_reserved=1 << 20)
    tr.memory(60, -4096, addr=7, total_allocated=4096, total_reserved=1 << 20)
    tr.memory(70, 16, addr=None, device=-1, device_type=0)
    path = tr.write(tmp / "seed_nccl.json")
    docs.append(json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()))
    return docs


@dataclass
class Outcome:
    mutation: str
    seed: int
    result: str          # "analyzed" | "refused" | "crash"
    detail: str = ""
    command: str = "analyze"


def write_input(files: Files, where: Path) -> Path:
    """The input's path: the file itself, or the folder holding several."""
    where.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (where / name).write_bytes(data)
    return where if len(files) > 1 else where / next(iter(files))


COMMANDS: dict[str, tuple[str, ...]] = {
    "analyze": ("analyze", "{path}", "--json", "{out}.json"),
    "predict": ("predict", "{path}", "-s", "{scenarios}/fuse_and_graph.toml", "-s", "{scenarios}/bf16_on_h100.toml",
                "-q", "--json", "{out}.json"),
    "export": ("export", "{path}", "-o", "{out}.trace.json"),
    "memory": ("memory", "{path}", "-q", "--json", "{out}.json", "-o", "{out}.parquet"),
    "collectives": ("collectives", "{path}", "-q", "--json", "{out}.json", "-o", "{out}.csv"),
    "report": ("report", "{path}", "-s", "{scenarios}/bf16_on_h100.toml", "-o", "{out}.report", "-q",
               "--no-step-summary"),
    "serve": ("serve", "{path}", "--rate", "4", "--num-requests", "16", "-q", "--json", "{out}.json"),
}
TRACE_COMMANDS = ("analyze", "predict", "export", "report", "memory", "collectives")
SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def run_cli(path: Path, out: Path, command: str = "analyze") -> tuple[int, str]:
    """``whatif COMMAND PATH ...`` (:data:`COMMANDS`, writing beside ``out``) in this process:
    (exit code, stderr); other exceptions propagate (a crash)."""
    from whatif.cli import main

    argv = [a.format(path=path, out=out, scenarios=SCENARIOS) for a in COMMANDS[command]]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def classify(code: int, stderr: str) -> str:
    """``analyzed`` (exit 0), ``refused`` (exit 2 and only ``whatif:`` lines: one per problem, e.g.
    one per scenario ``predict`` refused) or ``crash`` (anything else: a traceback, another exit)."""
    if code == 0:
        return "analyzed"
    lines = [x for x in stderr.strip().splitlines() if x.strip()]
    if code == 2 and lines and all(line.startswith("whatif: ") for line in lines):
        return "refused"
    return "crash"


def inputs(docs: list[Doc], seed: int, folder: Path) -> Iterator[tuple[int, str, str, Path]]:
    """Endless (index, mutation class, command, input path) under ``folder``: the classes in turn,
    each mutating a seed document drawn by ``random.Random(seed)``; the trace commands take turns
    by round of classes (so every class meets every command), and every round ends with one
    mutated serving log run through ``serve``."""
    rng = random.Random(seed)
    names = sorted(MUTATIONS)
    for i in itertools.count():
        r, k = divmod(i, len(names) + 1)
        if k == len(names):
            yield i, "servinglog", "serve", write_input(serving_log(rng), folder / f"in{i}")
        else:
            command = TRACE_COMMANDS[r % len(TRACE_COMMANDS)]
            yield i, names[k], command, write_input(MUTATIONS[names[k]](rng.choice(docs), rng), folder / f"in{i}")


def campaign(docs: list[Doc], count: int, seed: int, tmp: Path | None = None) -> list[Outcome]:
    """``count`` mutated inputs (:func:`inputs`), each run in this process."""
    out: list[Outcome] = []
    with tempfile.TemporaryDirectory(dir=tmp) as d:
        for i, name, command, path in itertools.islice(inputs(docs, seed, Path(d)), count):
            try:
                code, err = run_cli(path, Path(d) / f"out{i}", command)
                out.append(Outcome(name, i, classify(code, err), err.strip()[:300], command))
            except Exception as exc:   # noqa: BLE001 - a crash is what the campaign counts
                out.append(Outcome(name, i, "crash", f"{type(exc).__name__}: {str(exc)[:200]}", command))
    return out
