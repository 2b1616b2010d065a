"""Hostile load on whatif processes, shared by tests/test_hostile_server.py and
bench/hostile_memory.py: a 6 GiB gzip bomb through ``whatif analyze``, and a dashboard hit by 200
concurrent requests (uploads, pages, callbacks that analyze) with the bomb among them. Each
whatif process is a child that writes its own peak resident memory (``VmHWM`` of
``/proc/self/status``, Linux) when it exits. (The kernel's ``wait4`` rusage is no measure here:
a child's ``ru_maxrss`` keeps the resident size of the process it was forked from, so after a
long test session it reports pytest's own size.)"""
from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"
UPLOAD_ROUTE = "/_whatif/upload"


def bomb(inflated_gib: float = 6.0, member_mib: int = 64) -> bytes:
    """A gzip trace that inflates to ``inflated_gib`` GiB (a JSON object with one long string),
    as gzip members of ``member_mib`` MiB of spaces: ~6 MB for 6 GiB."""
    member = gzip.compress(b" " * (member_mib << 20), compresslevel=9, mtime=0)
    return (gzip.compress(b'{"traceEvents": [], "pad": "', mtime=0) + member * int(inflated_gib * 1024 / member_mib)
            + gzip.compress(b'"}', mtime=0))


# ``whatif`` as a child that writes its peak resident KiB to $WHATIF_PEAK_FILE when it exits.
WHATIF_REPORTING_PEAK = (
    "import atexit, os, sys\n"
    "def _peak():\n"
    "    with open('/proc/self/status') as f:\n"
    "        kib = next(line.split()[1] for line in f if line.startswith('VmHWM:'))\n"
    "    with open(os.environ['WHATIF_PEAK_FILE'], 'w') as out:\n"
    "        out.write(kib)\n"
    "atexit.register(_peak)\n"
    "from whatif.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")


def has_peak() -> bool:
    """Whether this system reports a process's peak resident memory (``VmHWM``)."""
    try:
        return "VmHWM:" in Path("/proc/self/status").read_text()
    except OSError:
        return False


def start(argv: list[str], peak_file: Path) -> subprocess.Popen:
    """``whatif ARGV`` as a child reporting its peak to ``peak_file``."""
    peak_file.unlink(missing_ok=True)
    return subprocess.Popen([sys.executable, "-c", WHATIF_REPORTING_PEAK, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "WHATIF_PEAK_FILE": str(peak_file)})


def finish(proc: subprocess.Popen, peak_file: Path, timeout_s: float = 120) -> tuple[int, int]:
    """Wait for ``proc``: (exit status, peak resident bytes it reported; 0 if it reported none)."""
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{proc.args[3:]} did not end in {timeout_s} s") from None
    peak = int(peak_file.read_text()) * 1024 if peak_file.is_file() else 0
    return proc.returncode, peak


@dataclass
class CliBomb:
    path: Path
    compressed_bytes: int
    status: int
    stderr: str
    peak_bytes: int
    seconds: float


def cli_bomb(tmp: Path, inflated_gib: float = 6.0) -> CliBomb:
    """``whatif analyze`` on a bomb that inflates to ``inflated_gib`` GiB."""
    path = tmp / "bomb.json.gz"
    path.write_bytes(bomb(inflated_gib))
    t0 = time.perf_counter()
    proc = start(["analyze", str(path)], tmp / "peak.txt")
    status, peak = finish(proc, tmp / "peak.txt")
    return CliBomb(path, path.stat().st_size, status, proc.stderr.read() if proc.stderr else "", peak,
                   time.perf_counter() - t0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(port: int, method: str, url: str, body: bytes | None = None,
            content_type: str = "application/octet-stream") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request(method, url, body=body, headers={"Content-Type": content_type} if body is not None else {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def overview(port: int, run_id: str, deadline_s: float = 240) -> tuple[int, bytes]:
    """The Overview page's callback for ``run_id``: the first call starts the run's analysis on the
    dashboard's job threads and answers "working"; it is called again, as the page's poller would,
    until the page itself comes back (or an error, or the deadline)."""
    body = {"output": "..ov-body.children...ov-poll.disabled...ov-waiting.data...ov-error.children..",
            "outputs": [{"id": "ov-body", "property": "children"}, {"id": "ov-poll", "property": "disabled"},
                        {"id": "ov-waiting", "property": "data"}, {"id": "ov-error", "property": "children"}],
            "inputs": [{"id": "run", "property": "value", "value": run_id},
                       {"id": "count-all", "property": "value", "value": []},
                       {"id": "ov-ready", "property": "data", "value": None}],
            "changedPropIds": ["run.value"]}
    end = time.monotonic() + deadline_s
    while True:
        status, answer = request(port, "POST", "/_dash-update-component", json.dumps(body).encode(), "application/json")
        if status != 200 or b"working:" not in answer or time.monotonic() > end:
            return status, answer
        time.sleep(0.2)


def tiny_trace(i: int) -> bytes:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100 + i,
               "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "ts": 10, "dur": 50, "pid": 1, "tid": 1}]
    return gzip.compress(json.dumps({"traceEvents": events}).encode(), mtime=0)


@dataclass
class Burst:
    """What :func:`dashboard_burst` saw."""

    answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)   # request name -> (status, body)
    views: list[tuple[int, bytes]] = field(default_factory=list)          # the uploaded runs' Overview
    uploads_stored: int = 0
    upload_dir: Path | None = None
    status: int = -1
    peak_bytes: int = 0
    stderr: str = ""
    seconds: float = 0.0


def dashboard_burst(tmp: Path, uploads: int = 50) -> Burst:
    """Start ``whatif dashboard`` on the sample run; send 200 requests at once (the bomb, ``uploads``
    small traces, pages, layouts, Overview callbacks of the sample run), then the Overview of every
    uploaded run at once; stop it with SIGTERM."""
    port = _free_port()
    proc = start(["dashboard", "--no-browser", "--port", str(port), str(SAMPLE)], tmp / "peak.txt")
    out = Burst()
    t0 = time.perf_counter()
    logged: list[str] = []
    drains = [threading.Thread(target=lambda s=s: logged.extend(iter(s.readline, "")), daemon=True)
              for s in (proc.stderr,) if s is not None]
    for d in drains:   # a server whose log pipe nobody reads blocks on its next write
        d.start()
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"uploads go to (\S+), removed on exit", first)
        out.upload_dir = Path(found.group(1)) if found else None
        if proc.stdout is not None:
            drains.append(threading.Thread(target=lambda: logged.extend(iter(proc.stdout.readline, "")), daemon=True))
            drains[-1].start()
        deadline = time.monotonic() + 60
        while True:
            try:
                if request(port, "GET", "/")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError("the dashboard did not start")
            time.sleep(0.2)
        layout = request(port, "GET", "/_dash-layout")[1].decode()
        sample_id = re.findall(r'"value":\s*"([0-9a-f]{8})"', layout)[0]
        the_bomb = bomb()
        rest = 200 - 1 - uploads
        jobs: list[tuple[str, Callable[[], tuple[int, bytes]]]] = [
            ("bomb", lambda: request(port, "POST", f"{UPLOAD_ROUTE}?name=bomb.json.gz", the_bomb)),
            *[(f"upload{i}", lambda i=i: request(port, "POST", f"{UPLOAD_ROUTE}?name=t{i}.json.gz", tiny_trace(i)))
              for i in range(uploads)],
            *[(f"page{i}", lambda: request(port, "GET", "/")) for i in range(rest // 3)],
            *[(f"layout{i}", lambda: request(port, "GET", "/_dash-layout")) for i in range(rest // 3)],
            *[(f"overview{i}", lambda: overview(port, sample_id)) for i in range(rest - 2 * (rest // 3))]]
        gate = threading.Barrier(len(jobs))

        def go(job: tuple[str, Callable[[], tuple[int, bytes]]]) -> tuple[str, tuple[int, bytes]]:
            gate.wait()
            return job[0], job[1]()
        with ThreadPoolExecutor(len(jobs)) as pool:
            out.answers = dict(pool.map(go, jobs))
        ids = [json.loads(out.answers[f"upload{i}"][1]).get("run") for i in range(uploads)]
        with ThreadPoolExecutor(max(1, uploads)) as pool:
            out.views = list(pool.map(lambda rid: overview(port, rid), ids))
        out.uploads_stored = len(list(out.upload_dir.iterdir())) if out.upload_dir else 0
    finally:
        proc.send_signal(signal.SIGTERM)
        out.status, out.peak_bytes = finish(proc, tmp / "peak.txt")
        for d in drains:
            d.join(10)
        out.stderr = "".join(logged)
        out.seconds = time.perf_counter() - t0
    return out
