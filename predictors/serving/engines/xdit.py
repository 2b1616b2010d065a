"""xDiT and diffusers: each denoising step is one call of the DiT's ``forward``, found by its
``python_function`` (``with_stack``), its composition read from the shapes the step recorded.

* **The step.** The outermost ``forward`` of a file in a ``transformers/`` folder of ``diffusers``
  (``diffusers/models/transformers/transformer_flux.py(…): forward``) or of xDiT
  (``xfuser/model_executor/models/transformers/transformer_flux.py(…): forward``) on its thread.
  A forward inside a UNet's (``diffusers/models/unets/``) is a block of that UNet, not a step.
* **A capture pass.** A step that records a CUDA/HIP graph (``*StreamBeginCapture`` in its window,
  torch.compile's cudagraph trees) launches its kernels into the graph, where they do not run,
  then replays the graph once. Later steps repeat only the replay, so the step's window is the
  replay: from the graph-launch call to the end of the last GPU work it launched.
* **The composition** (:class:`~.base.DitBatch`), from the ``cpu_op`` shapes in the step:
  the model batch is the leading dimension of the attention operands (CFG doubles it); the latent
  tokens are the rows of the patch embedding, the GEMM that widens ``c`` latent channels into the
  model width and whose ``c`` the final projection writes back (FLUX: ``[256, 64] x [64, 3072]``
  and ``[256, 3072] x [3072, 64]``), divided by the batch; the text tokens are the rest of the
  joint attention's sequence (FLUX, SD3: text and image tokens attend together), or the keys of
  a cross-attention whose length differs from the queries'.
* A step without shapes (a graph replay records no ``cpu_op``) takes the composition of the
  nearest earlier step that had them, and the notes say so.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from whatif.core.kernels import is_attention
from whatif.depgraph.graph import TaskGraph
from whatif.tracer.args import Arg
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, EventKind, codes
from whatif.tracer.trace import Trace, per_name

from ..logs import ServingLogError
from . import register
from .base import CompositionSource, DitBatch, EngineAdapter, FoundIteration, FoundIterations, IterationPhase

_DENOISER = re.compile(r"(?:^|/)(?:diffusers|xfuser)/(?:[^/]+/)*(transformers|unets)/[^/]+\.py\(\d+\): forward$")
_GEMM_OPS = {"aten::mm": 0, "aten::addmm": 1, "aten::linear": 0}   # op -> position of its [M, K] input
_CAPTURE = "StreamBeginCapture"
_GRAPH_LAUNCH = "GraphLaunch"


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a step: ``m`` rows, ``k`` input width, ``n`` output width."""

    m: int
    k: int
    n: int


@dataclass(frozen=True)
class Attention:
    """The leading dims of an attention call's query and key, whatever the layout: ``(batch, a, b)``
    with (a, b) = (sequence, heads) or (heads, sequence)."""

    q: tuple[int, int, int]
    k: tuple[int, int, int]


def gemm_of(op: str, dims: Sequence) -> Gemm | None:
    """The (M, K, N) of a GEMM op from its ``Input Dims``; None for another op or unusable dims.

    >>> gemm_of("aten::addmm", [[3072], [256, 3072], [3072, 64], [], []])
    Gemm(m=256, k=3072, n=64)
    >>> gemm_of("aten::linear", [[2, 256, 64], [3072, 64], [3072]])
    Gemm(m=512, k=64, n=3072)
    >>> gemm_of("aten::mm", [[4]]) is None
    True
    """
    pos = _GEMM_OPS.get(op)
    if pos is None or len(dims) < pos + 2:
        return None
    a, w = dims[pos], dims[pos + 1]
    if not (isinstance(a, list) and isinstance(w, list) and len(a) >= 2 and len(w) == 2):
        return None
    m = int(np.prod(a[:-1]))
    k = int(a[-1])
    n = int(w[0]) if op == "aten::linear" else int(w[1])
    return Gemm(m, k, n) if m > 0 and k > 0 and n > 0 else None


def latent_rows(gemms: Sequence[Gemm]) -> tuple[int, Gemm] | None:
    """Rows (batch x latent tokens) of the patch embedding and that GEMM: a GEMM widening ``c``
    channels (``k = c < n``) whose rows a projection back to ``c`` channels also has, smallest
    ``c`` first (a feed-forward's up and down projections pair too, at the model width).

    >>> latent_rows([Gemm(512, 4096, 3072), Gemm(256, 64, 3072), Gemm(256, 3072, 12288),
    ...              Gemm(256, 12288, 3072), Gemm(256, 3072, 64)])
    (256, Gemm(m=256, k=64, n=3072))
    >>> latent_rows([Gemm(8, 16, 16)]) is None
    True
    """
    back = {(g.m, g.n) for g in gemms}
    pairs = [g for g in gemms if g.k < g.n and (g.m, g.k) in back]
    if not pairs:
        return None
    best = min(pairs, key=lambda g: (g.k, g.m))
    return best.m, best


def composition(gemms: Sequence[Gemm], attention: Sequence[Attention]) -> tuple[DitBatch, str] | None:
    """The step's :class:`DitBatch` and how it was read, from its GEMMs and attention calls;
    None when they cannot say (no patch embedding, no attention, or the batch does not divide it).

    >>> g = [Gemm(256, 64, 3072), Gemm(256, 3072, 64), Gemm(768, 3072, 3072)]
    >>> composition(g, [Attention((1, 768, 24), (1, 768, 24))])[0]
    DitBatch(model_batch=1, tokens=256, text_tokens=512)
    >>> composition(g, [Attention((2, 128, 16), (2, 77, 16))])[0]   # cross-attention to 77 text keys
    DitBatch(model_batch=2, tokens=128, text_tokens=77)
    """
    rows = latent_rows(gemms)
    if rows is None or not attention:
        return None
    (batch, a, b), (_, ka, kb) = Counter((x.q, x.k) for x in attention).most_common(1)[0][0]
    if batch <= 0 or rows[0] % batch:
        return None
    tokens = rows[0] // batch
    longer = [(d, kd) for d, kd in ((a, ka), (b, kb)) if d >= tokens]
    if len(longer) != 1:
        return None
    seq, keys = longer[0]
    text = seq - tokens if seq > tokens else (keys if keys != seq else 0)
    g = rows[1]
    how = (f"batch {batch} from the attention operands [{batch}, {a}, {b}, …]; {tokens} latent tokens from the "
           f"patch embedding [{g.m}, {g.k}] x [{g.k}, {g.n}]; "
           + (f"{text} text tokens = joint sequence {seq} - {tokens}" if seq > tokens else
              f"{text} text tokens from the cross-attention keys" if text else "no text tokens in attention"))
    return DitBatch(model_batch=batch, tokens=tokens, text_tokens=text), how


@dataclass(frozen=True)
class DenoiserCall:
    """One outermost DiT ``forward`` call: its rank, thread, CPU window (trace clock) and name."""

    rank: int
    tid: int
    start_ns: int
    end_ns: int
    name: str


def denoiser_calls(trace: Trace) -> list[DenoiserCall]:
    """The outermost DiT ``forward`` calls of ``trace`` in time order (per rank and thread);
    empty when the outermost denoiser is a UNet's or there is none."""
    ev = trace.events
    py = (ev["kind"].to_numpy() == int(EventKind.PYTHON)) & per_name(ev["name"], lambda n: bool(_DENOISER.search(n)))
    rows = ev[py].sort_values(["rank", "tid", "ts_ns", "dur_ns"], ascending=[True, True, True, False])
    out: list[DenoiserCall] = []
    ends: dict[tuple[int, int], int] = {}
    for rank, tid, ts, dur, name in zip(rows["rank"], rows["tid"], rows["ts_ns"], rows["dur_ns"], rows["name"]):
        key = (int(rank), int(tid))
        if ts < ends.get(key, -1):
            continue
        ends[key] = int(ts + dur)
        if _DENOISER.search(str(name)).group(1) == "transformers":   # type: ignore[union-attr]
            out.append(DenoiserCall(key[0], key[1], int(ts), int(ts + dur), str(name)))
    return sorted(out, key=lambda w: (w.start_ns, w.rank))


def replay_window(trace: Trace, w: DenoiserCall) -> tuple[int, int] | None:
    """For a step that captured a CUDA/HIP graph: the window of the graph's replay (the launch
    call to the end of its last GPU work); None when the step captured nothing."""
    ev = trace.events
    inside = ((ev["rank"].to_numpy() == w.rank) & (ev["ts_ns"].to_numpy() >= w.start_ns)
              & (ev["ts_ns"].to_numpy() < w.end_ns) & (ev["kind"].to_numpy() == int(EventKind.RUNTIME)))
    calls = ev[inside]
    names = calls["name"].astype(str)
    if not names.str.contains(_CAPTURE).any():
        return None
    launches = calls[names.str.contains(_GRAPH_LAUNCH).to_numpy()]
    if not len(launches):
        return None
    last = launches.iloc[-1]
    gpu = ev[(ev["rank"].to_numpy() == w.rank) & (ev["correlation"].to_numpy() == int(last["correlation"]))
             & np.isin(ev["kind"].to_numpy(), codes(GPU_ACTIVITY_KINDS))]
    end = int((gpu["ts_ns"] + gpu["dur_ns"]).max()) if len(gpu) else int(last["ts_ns"] + last["dur_ns"])
    return int(last["ts_ns"]), max(end, int(last["ts_ns"] + last["dur_ns"]))


def capture_note(step: int, capture_ns: int, replay_ns: int) -> str:
    """The one line saying that denoising step ``step`` is a CUDA/HIP graph capture pass (its
    forward took ``capture_ns``) whose replay (``replay_ns``) is the steady-state step; printed by
    ``whatif serve``, ``analyze``, ``predict`` and ``diff`` alike.

    >>> capture_note(0, 323_910_000, 35_601_000)[:72]
    'denoising step 0 recorded a CUDA/HIP graph: its 323.910 ms forward is a '
    """
    return (f"denoising step {step} recorded a CUDA/HIP graph: its {capture_ns / 1e6:.3f} ms forward is a one-off "
            f"capture pass; the graph's replay ({replay_ns / 1e6:.3f} ms) is what later steps repeat and what "
            "`whatif serve` times")


def capture_notes(trace: Trace) -> list[str]:
    """:func:`capture_note` of each DiT denoising step (xDiT, diffusers) of ``trace`` that recorded
    a CUDA/HIP graph; empty when there is none (most traces)."""
    notes = []
    for i, w in enumerate(denoiser_calls(trace)):
        replayed = replay_window(trace, w)
        if replayed is not None:
            notes.append(capture_note(i, w.end_ns - w.start_ns, replayed[1] - replayed[0]))
    return notes


def step_shapes(trace: Trace, w: DenoiserCall) -> tuple[list[Gemm], list[Attention]]:
    """The GEMMs and attention calls the step's thread recorded (``cpu_op`` with ``Input Dims``)."""
    ev = trace.events
    sel = np.flatnonzero((ev["rank"].to_numpy() == w.rank) & (ev["tid"].to_numpy() == w.tid)
                         & (ev["kind"].to_numpy() == int(EventKind.CPU_OP))
                         & (ev["ts_ns"].to_numpy() >= w.start_ns) & (ev["ts_ns"].to_numpy() < w.end_ns))
    dims = trace.arg(Arg.INPUT_DIMS)
    names = ev["name"].astype(str).to_numpy()
    gemms: list[Gemm] = []
    attention: list[Attention] = []
    for i in sel:
        d = dims[i]
        if not isinstance(d, list):
            continue
        g = gemm_of(names[i], d)
        if g is not None:
            gemms.append(g)
        elif is_attention(names[i], names[i]) and len(d) >= 2 and all(isinstance(x, list) and len(x) == 4
                                                                       for x in d[:2]):
            attention.append(Attention(tuple(int(x) for x in d[0][:3]), tuple(int(x) for x in d[1][:3])))  # type: ignore[arg-type]
    return gemms, attention


def steps_per_request(trace: Trace, steps: Sequence[DenoiserCall] | None = None) -> list[int]:
    """Denoising steps per pipeline call (``diffusers/pipelines/…: __call__``, one request), in
    time order, for the calls holding a step; ``steps`` default :func:`denoiser_calls`."""
    steps = denoiser_calls(trace) if steps is None else steps
    ev = trace.events
    calls = ev[(ev["kind"].to_numpy() == int(EventKind.PYTHON))
               & per_name(ev["name"], lambda n: "diffusers/pipelines/" in n and n.endswith(": __call__"))]
    counts = [sum(1 for s in steps if s.rank == r and ts <= s.start_ns < ts + d)
              for r, ts, d in zip(calls["rank"], calls["ts_ns"], calls["dur_ns"])]
    return [c for c in counts if c]


@register
class XditAdapter(EngineAdapter):
    """xDiT (``xfuser``) and diffusers DiT pipelines (module docstring)."""

    name = "xdit"
    order = 30

    def find(self, graph: TaskGraph) -> FoundIterations | None:
        trace = graph.trace
        if trace is None:
            return None
        calls = denoiser_calls(trace)
        if not calls:
            return None
        found: list[FoundIteration] = []
        notes: list[str] = []
        last: tuple[DitBatch, str] | None = None
        for i, w in enumerate(calls):
            read = composition(*step_shapes(trace, w))
            if read is None and last is not None:
                read = (last[0], f"composition of the previous step ({last[1]})")
                notes.append(f"step {i}: no shapes recorded; composition copied from an earlier step")
            if read is None:
                raise ServingLogError(f"xdit: {trace.source}: denoising step {i} ({w.name}) records no shapes "
                                      "that give its batch and tokens (record with record_shapes=True)")
            last = read
            evidence = f"python_function {w.name}; {read[1]}"
            start, end = w.start_ns, w.end_ns
            replayed = replay_window(trace, w)
            if replayed is not None:
                start, end = replayed
                evidence += (f"; capture pass: window is the CUDA/HIP graph replay after its recording "
                             f"(recording [{w.start_ns}, {start}) left out)")
                notes.append(capture_note(i, w.end_ns - w.start_ns, end - start))
            found.append(FoundIteration(rank=w.rank, start_ns=start, end_ns=end, phase=IterationPhase.DENOISE,
                                        evidence=evidence, dit=read[0]))
        per_request = steps_per_request(trace, calls)
        if per_request:
            notes.append(f"{len(per_request)} pipeline call(s), steps per call: {', '.join(map(str, per_request))}")
        return FoundIterations(adapter=self.name, iterations=tuple(found), source=CompositionSource.SHAPES,
                               notes=tuple(notes))

