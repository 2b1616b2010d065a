"""Read one Kineto / Chrome-trace JSON file (``.json`` or ``.json.gz``) into columns: the
built-in :class:`KinetoReader` of :mod:`whatif.tracer.readers`.

Handles the format drift of real traces 2021 -> 2025 (see ``docs/traces.md``): old category
names, string tids such as ``"stream 7"``, ``external id`` vs ``External id``, float ``ts``
relative to ``baseTimeNanoseconds``, missing metadata events, HIP runtime names, and the mangled kernels
and versioned call names of traces written from raw CUPTI records (``tracer/names.py``).
All times become integer nanoseconds (``ts`` and ``dur`` are always microseconds in Kineto,
whatever ``displayTimeUnit`` says).

Speed (see ``bench/parse_speed.py`` and ``docs/traces.md``): gzip is inflated with ISA-L when
``isal`` is installed; msgspec decodes each event straight into a slotted struct holding only
the keys the reader uses (``args`` stays a plain dict), in one scan of the text; one tight loop
appends each event's fields to lists, converted with numpy afterwards; the cyclic GC is paused
meanwhile (see :func:`gc_paused`).

Memory (``docs/scale.md``): each event's ``args`` dict is encoded again as one compact JSON
text once the file's loop is done (:meth:`~whatif.tracer.args.EventArgs.of_json`, about a
seventh of the dict's size), and the file's decoded events are freed before anything that
outlives the parse is made, so a job of many files never holds more than one file's dicts.
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import types
import zlib
from pathlib import Path
from sys import intern
from typing import Any

import msgspec
import numpy as np
import orjson

from whatif.core import limits
from whatif.core.errors import TraceError

from .args import EventArgs, gc_paused
from .kinds import GPU_KINDS, IGNORED_CATEGORIES, EventKind, kind_of
from .memory import MEMORY_EVENT_NAME, UNKNOWN, MemoryColumns
from .names import kineto_spelling
from .readers import FileColumns, FileTrace, Flow, TraceReader, register_reader

_inflate_lib: types.ModuleType
try:  # ISA-L inflates gzip 1.3-2.5x faster than zlib; optional
    from isal import isal_zlib as _inflate_lib
except ImportError:  # pragma: no cover - isal is a dependency, zlib is the fallback
    _inflate_lib = zlib

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


class _Event(msgspec.Struct, gc=False):
    """The keys of a Chrome-trace event that the reader uses; msgspec skips all others."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = 0
    id: Any = None
    args: Any = None


_EVENT_FIELDS = _Event.__struct_fields__
_DECODE_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_DECODE_EVENTS = msgspec.json.Decoder(list[_Event])
_DECODE_ANY = msgspec.json.Decoder()


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped when it starts with the gzip magic, or :class:`TraceError`.
    Only regular files are read (a named pipe or a device would block or never end), and a gzip
    file may inflate to at most :func:`~whatif.core.limits.inflate_cap_bytes` of its size."""
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise TraceError(path, "not a regular file (a pipe, socket or device is not read)")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a folder, expected a trace file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot be read ({exc.strerror})") from None
    if not raw:
        raise TraceError(path, "empty file")
    if raw[:2] == b"\x1f\x8b":
        raw = _inflate(path, raw)
    return raw


def _over_cap(cap: int, compressed_bytes: int) -> str:
    return (f"{limits.OVER_INFLATE_CAP} {cap:,} bytes ({cap / max(compressed_bytes, 1):.0f}x its compressed size; "
            "WHATIF_MAX_INFLATE_RATIO and WHATIF_MAX_TRACE_GB raise the caps)")


def gzip_problem(path: Path, chunk_bytes: int = 1 << 20) -> str | None:
    """What :func:`_inflate` would refuse in the gzip file at ``path`` (over the inflate cap,
    corrupt, truncated, empty), found by streaming: memory stays at a few chunks whatever the
    file inflates to, so an upload can be checked before anything holds it. None: it inflates."""
    compressed = path.stat().st_size
    cap = limits.inflate_cap_bytes(compressed)
    total = 0
    with open(path, "rb") as f:
        pending = f.read(chunk_bytes)
        while pending[:2] == b"\x1f\x8b":             # one gzip member per pass, as _inflate reads them
            inflater = _inflate_lib.decompressobj(31)
            while not inflater.eof:
                data = pending or f.read(chunk_bytes)
                pending = b""
                if not data:
                    return "truncated gzip (the file ends before the compressed data does)"
                try:
                    total += len(inflater.decompress(data, chunk_bytes))
                    while inflater.unconsumed_tail and total <= cap:
                        total += len(inflater.decompress(inflater.unconsumed_tail, chunk_bytes))
                except (OSError, zlib.error, _inflate_lib.error) as exc:
                    return f"corrupt gzip ({_first_line(exc)})"
                if total > cap:
                    return _over_cap(cap, compressed)
            pending = inflater.unused_data
            if len(pending) < 2:
                pending += f.read(chunk_bytes)
    return None if total else "empty file (gzip holds no data)"


def _inflate(path: Path, raw: bytes) -> bytes:
    """Every gzip member of ``raw`` (as gzip.decompress), refused once it passes the cap: the
    inflater never produces more than the bytes left under it."""
    compressed = len(raw)
    cap = limits.inflate_cap_bytes(compressed)
    parts, total = [], 0
    while raw[:2] == b"\x1f\x8b":
        inflater = _inflate_lib.decompressobj(31)  # 31: gzip header and trailer
        try:
            part = inflater.decompress(raw, cap - total + 1)
        except (OSError, zlib.error, _inflate_lib.error) as exc:
            raise TraceError(path, f"corrupt gzip ({_first_line(exc)})") from None
        total += len(part)
        if total > cap:
            raise TraceError(path, _over_cap(cap, compressed))
        if not inflater.eof:
            raise TraceError(path, "truncated gzip (the file ends before the compressed data does)")
        parts.append(part)
        raw = inflater.unused_data
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if not data:
        raise TraceError(path, "empty file (gzip holds no data)")
    return data


_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")


def _split_trace_object(raw: bytes) -> tuple[memoryview, dict[str, Any]] | None:
    """Fast path for ``{..., "traceEvents": [...], ...}``: the events array's bytes and the
    other top-level keys, found without a second scan of the whole text; None when unsure.

    The array starts at the ``[`` after the key; it ends at the ``]`` that follows the last
    event object (the ``{`` before the text's last ``"ph"``), whose end msgspec reports when
    asked to decode the text from that event on. Every guess is checked: the text around the
    array must decode as an object with ``traceEvents`` as a top-level key, and the caller
    falls back to the general path if the array does not decode on its own.
    """
    key = raw.find(b'"traceEvents"')
    if key < 0:
        return None
    colon = key + len(b'"traceEvents"')
    while raw[colon:colon + 1] in (b" ", b"\t", b"\r", b"\n"):
        colon += 1
    start = colon + 1
    while raw[start:start + 1] in (b" ", b"\t", b"\r", b"\n"):
        start += 1
    if raw[colon:colon + 1] != b":" or raw[start:start + 1] != b"[":
        return None
    ph = raw.rfind(b'"ph"', start)
    first = raw.rfind(b"{", start, ph) if ph > 0 else -1  # the last event's "{" (if no nesting before ph)
    if first < 0:
        return None
    try:  # decoding from the last event on stops right after it: "trailing characters (byte N)"
        _DECODE_ANY.decode(raw[first:])
        return None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        trailing = _TRAILING.search(str(exc))
    if trailing is None:
        return None
    end = first + int(trailing.group(1)) - 1  # msgspec counts bytes from 1
    if raw[end:end + 1] != b"]":
        return None
    try:
        rest = _DECODE_ANY.decode(raw[:key] + b'"traceEvents": null' + raw[end + 1:])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not isinstance(rest, dict) or "traceEvents" not in rest or rest.pop("traceEvents") is not None:
        return None
    return memoryview(raw)[start:end + 1], rest


def _decode_trace(path: Path, raw: bytes) -> tuple[list[_Event], dict[str, Any], int]:
    """JSON text -> (events, top-level metadata, number of entries that are not event objects)."""
    try:
        return _decode_json(path, raw)
    except RecursionError:
        raise TraceError(path, "not usable JSON (values nested deeper than the decoder's recursion limit)") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, f"not valid JSON (a string is not UTF-8: byte {exc.object[exc.start:exc.start + 1]!r} "
                               f"at {exc.start} of that string)") from None


def _decode_json(path: Path, raw: bytes) -> tuple[list[_Event], dict[str, Any], int]:
    head = raw[:64].lstrip()[:1]
    if head == b"{" and (split := _split_trace_object(raw)) is not None:
        try:
            return _DECODE_EVENTS.decode(split[0]), split[1], 0
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass  # the general path below decodes it again and says what is wrong
    try:
        if head == b"{":
            top = _DECODE_TOP.decode(raw)
            events_raw: bytes | None = top.pop("traceEvents", None)
            if events_raw is None:
                raise TraceError(path, "not a Chrome/Kineto trace (no 'traceEvents' list)")
            metadata = {k: _DECODE_ANY.decode(v) for k, v in top.items()}
        elif head == b"[":
            events_raw, metadata = raw, {}
        else:
            _DECODE_ANY.decode(raw)  # raises for text that is not JSON
            raise TraceError(path, "not a Chrome/Kineto trace (top level is neither an object nor a list)")
        try:
            return _DECODE_EVENTS.decode(events_raw), metadata, 0
        except msgspec.ValidationError:  # some entry is not an event object: keep the ones that are
            entries = _DECODE_ANY.decode(events_raw)
    except msgspec.DecodeError as exc:
        raise TraceError(path, f"not valid JSON ({_first_line(exc)})") from None
    except msgspec.ValidationError as exc:  # e.g. a number beyond float range
        raise TraceError(path, f"not usable JSON ({_first_line(exc)})") from None
    if not isinstance(entries, list):
        raise TraceError(path, "not a Chrome/Kineto trace ('traceEvents' is not a list)")
    events = [_Event(**{k: e[k] for k in _EVENT_FIELDS if k in e}) for e in entries if isinstance(e, dict)]
    return events, metadata, len(entries) - len(events)


class _StringIds(dict):
    """String pid/tid -> int, remembered for one file; non-numeric strings get -1000, -1001, ..."""

    next_negative = -1000


def _int_id(value: Any, interned: _StringIds) -> int:
    """Normalize a pid/tid: ints stay, ``"stream 7"`` and ``"25738"`` become ints, other
    strings get a stable negative id (-1000, -1001, ... in order of first conversion).

    ``interned`` remembers every string it converted (2021 traces give each event's tid as
    a string), so each distinct string is parsed once per file.
    """
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        known = interned.get(value)
        if known is not None:
            return known
        text = value[7:] if value.startswith("stream ") else value
        try:
            number = int(text.strip())
        except ValueError:
            number = interned.next_negative
            interned.next_negative -= 1
        interned[value] = number
        return number
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return -1


def _coerce_id(value: Any) -> int:
    """An id given as something other than an int: digit strings count, the rest is -1."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return -1


_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def _fit_int64(v: int) -> int:
    """One id as :func:`_int64` stores it.

    >>> _fit_int64(7), _fit_int64(2**64 - 1), _fit_int64(2**70)
    (7, -1, -1)
    """
    if _INT64_MIN <= v <= _INT64_MAX:
        return v
    return v - (1 << 64) if _INT64_MAX < v <= _UINT64_MAX else -1


def _int64(values: list[int]) -> np.ndarray:
    """Python ints -> int64; unsigned 64-bit values above 2**63 wrap to negative (two's
    complement, as C++ would store them), anything outside 64 bits becomes -1."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array([_fit_int64(v) for v in values], dtype=np.int64)


def _us_to_ns(values: list[int | float], path: Path, what: str, bound_ns: int) -> np.ndarray:
    """Microseconds (ints, or floats with ns decimals) -> integer nanoseconds.

    Floats are split into whole and fractional microseconds so that values around 1e12 us
    (ts relative to ``baseTimeNanoseconds``) keep their nanosecond digits exactly.
    """
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.array(values)
    except OverflowError:
        arr = np.array(values, dtype=object)
    limit = f"more than 2**{bound_ns.bit_length() - 1} ns"
    if arr.dtype.kind in "iu":
        if np.abs(arr).max() > bound_ns // 1000:
            raise TraceError(path, f"{what} out of range ({limit})")
        return arr.astype(np.int64) * 1000
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all() or np.abs(arr).max() > bound_ns / 1000:
            raise TraceError(path, f"{what} out of range (not finite or {limit})")
        whole = np.floor(arr)
        return whole.astype(np.int64) * 1000 + np.rint((arr - whole) * 1000).astype(np.int64)
    raise TraceError(path, f"{what} out of range (integers beyond 64 bits)")


def _scalar_us_to_ns(value: int | float) -> int:
    """One microsecond value -> integer nanoseconds, rounded exactly as :func:`_us_to_ns`."""
    if isinstance(value, int):
        return value * 1000
    whole = math.floor(value)
    return whole * 1000 + round((value - whole) * 1000)


_LAUNCH_FLOW_CATEGORIES = frozenset({"ac2g", "async", "async_gpu", "async_cpu_to_gpu"})


def _text(value: Any) -> str:
    """A category or name as text (None and other JSON values are printed)."""
    return value if isinstance(value, str) else str(value)


def _strict_ids(values: list[Any]) -> np.ndarray:
    """Ids that should be ints (device, stream): digit strings are accepted, the rest is -1."""
    return _int64([v if v.__class__ is int else _coerce_id(v) for v in values])


def parse_file(path: str | Path) -> FileTrace:
    """Parse one Kineto trace file. Raises :class:`TraceError` for unusable input."""
    path = Path(path)
    with gc_paused():
        raw = read_bytes(path)
        events, metadata, malformed = _decode_trace(path, raw)
        del raw
        return _parse_events(path, events, metadata, malformed)


def _base_time_ns(path: Path, base: Any) -> int:
    """``baseTimeNanoseconds`` as an int (0 when absent or not a number), within the time bound."""
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        return 0
    if not math.isfinite(base) or abs(base) > limits.MAX_TIME_NS:
        raise TraceError(path, "baseTimeNanoseconds out of range (not finite or more than 2**62 ns)")
    return int(base)


def _check_steps(path: Path, names: list[str]) -> None:
    """Refuse a ``ProfilerStep#N`` whose N does not fit the step columns."""
    for name in names:
        if name.startswith("ProfilerStep#") and (n := step_number(name)) is not None and n > limits.MAX_STEP:
            raise TraceError(path, f"'{name[:48]}': step number beyond {limits.MAX_STEP}")


def _parse_events(path: Path, events: list[_Event], metadata: dict[str, Any], malformed: int) -> FileTrace:
    """Decoded events -> :class:`FileTrace` (see :func:`parse_file`); ``events`` is emptied.

    One pass over the events with plain list appends (measured 2.5x faster than pulling each
    column out with ``map``/``attrgetter``); the conversions to numpy happen afterwards.
    """
    if not events and not malformed:
        raise TraceError(path, "trace has no events")
    if not any(e.ph.__class__ is str for e in events):
        raise TraceError(path, "not a Chrome/Kineto trace (no entry is an event with a 'ph' phase)")
    base_ns = _base_time_ns(path, metadata.get("baseTimeNanoseconds"))

    # Per-file lookup tables: a category becomes a small code once, a name an index.
    cat_code: dict[Any, int] = {}   # raw category -> code (>= 0 kept, < 0 ignored)
    cat_label: list[str] = []       # kept code -> category as text
    code_kind: list[int] = []       # kept code -> EventKind
    code_gpu: list[bool] = []       # kept code -> GPU-side kind (device/stream in args)
    ignored_label: list[str] = []   # -code - 1 -> category as text
    ignored_hits: list[int] = []
    malformed_hits: dict[int, int] = {}
    name_code: dict[Any, int] = {}  # raw name -> index into names
    names: list[str] = []
    name_index: dict[str, int] = {}  # text -> index (non-str names that print alike share one)
    interned = _StringIds()

    def register_category(cat: Any) -> int:
        label = "" if cat is None else _text(cat)
        if label.lower() in IGNORED_CATEGORIES:
            code = -1 - len(ignored_label)
            ignored_label.append(label)
            ignored_hits.append(0)
        else:
            code = len(cat_label)
            cat_label.append(label)
            kind = kind_of(label)
            code_kind.append(int(kind))
            code_gpu.append(kind in GPU_KINDS)
        with contextlib.suppress(TypeError):  # an unhashable category is classified each time
            cat_code[cat] = code
        return code

    def register_name(name: Any) -> int:
        text = _text(name)
        code = name_index.get(text)
        if code is None:
            code = name_index[text] = len(names)
            names.append(text)
        with contextlib.suppress(TypeError):
            name_code[name] = code
        return code

    ts_l: list[Any] = []
    dur_l: list[Any] = []
    cc_l: list[int] = []
    nc_l: list[int] = []
    pid_l: list[int] = []
    tid_l: list[int] = []
    corr_l: list[int] = []
    ext_l: list[int] = []
    args_l: list[dict[str, Any] | None] = []
    gpu_rows: list[int] = []
    dev_raw: list[Any] = []
    stream_raw: list[Any] = []
    rest: list[_Event] = []
    n = 0
    int_, float_, dict_, str_ = int, float, dict, str
    int_id, coerce_id = _int_id, _coerce_id

    for ev in events:  # the hot loop: attribute reads, type checks, appends
        if ev.ph != "X":
            rest.append(ev)
            continue
        cat = ev.cat
        try:
            code = cat_code[cat]
        except (KeyError, TypeError):
            code = register_category(cat)
        if code < 0:
            ignored_hits[-code - 1] += 1
            continue
        ts = ev.ts
        dur = ev.dur
        tcls = ts.__class__
        dcls = dur.__class__
        if (tcls is not int_ and tcls is not float_) or (dcls is not int_ and dcls is not float_):
            malformed += 1
            malformed_hits[code] = malformed_hits.get(code, 0) + 1  # counted, not kept
            continue
        name = ev.name
        try:
            nc = name_code[name]
        except (KeyError, TypeError):
            nc = register_name(name)
        pid = ev.pid
        if pid.__class__ is not int_:
            pid = interned[pid] if pid.__class__ is str_ and pid in interned else int_id(pid, interned)
        tid = ev.tid
        if tid.__class__ is not int_:
            tid = interned[tid] if tid.__class__ is str_ and tid in interned else int_id(tid, interned)
        args = ev.args
        if args.__class__ is dict_:
            corr = args.get("correlation", -1)
            if corr.__class__ is not int_:
                corr = coerce_id(corr)
            ext = args.get("External id")
            if ext is None:  # 2021 runtime/GPU events spell it "external id"
                ext = args.get("external id", -1)
            if ext.__class__ is not int_:
                ext = coerce_id(ext)
            if code_gpu[code]:
                gpu_rows.append(n)
                dev_raw.append(args.get("device"))
                stream_raw.append(args.get("stream"))
        else:
            args = None
            corr = ext = -1
            if code_gpu[code]:
                gpu_rows.append(n)
                dev_raw.append(None)
                stream_raw.append(None)
        ts_l.append(ts)
        dur_l.append(dur)
        cc_l.append(code)
        nc_l.append(nc)
        pid_l.append(pid)
        tid_l.append(tid)
        corr_l.append(corr)
        ext_l.append(ext)
        args_l.append(args)
        n += 1

    # Category counts: every complete event, ignored and malformed ones included.
    cc = np.fromiter(cc_l, dtype=np.int32, count=n)
    counts = np.bincount(cc, minlength=len(cat_label)).tolist()
    for code, count in malformed_hits.items():
        counts[code] += count
    category_counts: dict[str, int] = {}
    for label, count in [*zip(cat_label, counts), *zip(ignored_label, ignored_hits)]:
        if count:
            category_counts[label] = category_counts.get(label, 0) + count

    name_codes = np.fromiter(nc_l, dtype=np.int32, count=n)
    respelled = kineto_spelling(names)
    if respelled is not None:  # written from raw CUPTI records: Kineto's names
        names, remap = respelled
        name_codes = remap[name_codes]
    kind = np.array(code_kind or [0], dtype=np.int8)[cc]
    step_codes = [i for i, text in enumerate(names) if text.startswith("ProfilerStep#")]
    if step_codes:  # 2021 traces file ProfilerStep#N under "Operator"
        kind[(kind == EventKind.CPU_OP) & np.isin(name_codes, step_codes)] = EventKind.ANNOTATION

    pid = _int64(pid_l)
    tid = _int64(tid_l)
    device = np.full(n, -1, dtype=np.int32)
    stream = np.full(n, -1, dtype=np.int64)
    if gpu_rows:  # GPU events: device/stream from args, else pid (= device) / tid (= stream)
        rows = np.array(gpu_rows, dtype=np.int64)
        dev = _strict_ids(dev_raw)
        strm = _strict_ids(stream_raw)
        device[rows] = np.where(dev >= 0, dev, pid[rows])
        stream[rows] = np.where(strm >= 0, strm, tid[rows])

    _check_steps(path, names)
    ts_ns = _us_to_ns(ts_l, path, "timestamp", limits.MAX_TIME_NS)
    if len(ts_ns) and max(abs(int(ts_ns.max()) + base_ns), abs(int(ts_ns.min()) + base_ns)) > limits.MAX_TIME_NS:
        raise TraceError(path, "timestamp + baseTimeNanoseconds out of range (more than 2**62 ns)")
    ts_ns += base_ns
    dur_ns = _us_to_ns(dur_l, path, "duration", limits.MAX_DURATION_NS)
    negative = int((dur_ns < 0).sum())   # read as 0
    columns = FileColumns(
        ts_ns=ts_ns, dur_ns=np.maximum(dur_ns, 0),
        kind=kind, name_code=name_codes, names=names, pid=pid, tid=tid, device=device, stream=stream,
        correlation=_int64(corr_l), external_id=_int64(ext_l), args=EventArgs.of_json(args_l).pack())
    del args_l
    events.clear()  # the decoded events and their args dicts go before anything that outlives the parse is made
    flows, thread_names, process_names, memory, skipped = _other_events(rest, base_ns, interned)
    skipped["malformed"] += malformed
    skipped["negative_dur"] = negative
    return FileTrace(path=path, columns=columns, flows=flows, metadata=metadata,
                     thread_names=thread_names, process_names=process_names,
                     category_counts=category_counts, skipped=skipped, memory=memory)


_MemoryRow = tuple[int, int, int, int, int, int, int, int, int]


def _memory_row(ev: _Event, base_ns: int, interned: _StringIds) -> _MemoryRow | None:
    """An allocator record as a :class:`~whatif.tracer.memory.MemoryColumns` row, or None when it
    is malformed (no time, or no integer ``Bytes``/``Device Type``)."""
    args, ts = ev.args, ev.ts
    if args.__class__ is not dict or ts.__class__ not in (int, float) or not abs(ts) <= limits.MAX_TIME_NS / 1000:
        return None
    size, dtype = args.get("Bytes"), args.get("Device Type")
    if size.__class__ is not int or dtype.__class__ is not int or not abs(size) <= limits.MAX_MEMORY_BYTES:
        return None

    def known(key: str) -> int:
        value = args.get(key)
        return value if value.__class__ is int and 0 <= value <= limits.MAX_MEMORY_BYTES else UNKNOWN

    dev = args.get("Device Id")
    addr = args.get("Addr")
    return (base_ns + _scalar_us_to_ns(ts), _fit_int64(_int_id(ev.pid, interned)),
            _fit_int64(_int_id(ev.tid, interned)),
            dtype if abs(dtype) < 1 << 15 else UNKNOWN, dev if dev.__class__ is int and abs(dev) < 1 << 31 else UNKNOWN,
            size, known("Total Allocated"), known("Total Reserved"),
            addr if addr.__class__ is int and 0 <= addr < 1 << 63 else UNKNOWN)


def _other_events(events: list[_Event], base_ns: int, interned: _StringIds
                  ) -> tuple[list[Flow], dict[tuple[int, int], str], dict[int, str], MemoryColumns, dict[str, int]]:
    """Flows, thread/process names, allocator records and skip counts from the events that are
    not ``ph: "X"``."""
    flows: list[Flow] = []
    memory: list[_MemoryRow] = []
    thread_names: dict[tuple[int, int], str] = {}
    process_names: dict[int, str] = {}
    skipped = {"instant": 0, "malformed": 0, "launch_flow": 0, "other_phase": 0}
    launch_raw = _LAUNCH_FLOW_CATEGORIES
    for ev in events:
        ph = ev.ph
        if ph == "f" or ph == "s" or ph == "t":
            cat = ev.cat
            if cat.__class__ is str and cat in launch_raw:  # exact spelling: most flows launch
                skipped["launch_flow"] += 1
                continue
            cat = "" if cat is None else _text(cat)
            if cat.lower() in _LAUNCH_FLOW_CATEGORIES:
                skipped["launch_flow"] += 1  # the launch link is the correlation id itself
                continue
            ts = ev.ts
            if ts.__class__ not in (int, float) or ev.id is None or not abs(ts) <= limits.MAX_TIME_NS / 1000:
                skipped["malformed"] += 1   # no time, no id, or a time beyond the bound (or NaN)
                continue
            flows.append(Flow(category=intern(cat), flow_id=_int_id(ev.id, interned), phase=ph,
                              pid=_int_id(ev.pid, interned), tid=_int_id(ev.tid, interned),
                              ts_ns=base_ns + _scalar_us_to_ns(ts)))
        elif ph == "M":
            label = ev.args.get("name") if ev.args.__class__ is dict else None
            if label.__class__ is str:
                if ev.name == "thread_name":
                    thread_names[(_int_id(ev.pid, interned), _int_id(ev.tid, interned))] = label.strip()
                elif ev.name == "process_name":
                    process_names[_int_id(ev.pid, interned)] = label.strip()
        elif ph == "i" or ph == "I":
            if ev.name != MEMORY_EVENT_NAME:
                skipped["instant"] += 1
            elif (row := _memory_row(ev, base_ns, interned)) is not None:
                memory.append(row)
            else:
                skipped["malformed"] += 1
        elif ph.__class__ is str:
            skipped["other_phase"] += 1
        else:
            skipped["malformed"] += 1
    return flows, thread_names, process_names, MemoryColumns.from_rows(memory), skipped


def kineto_json(doc: dict[str, Any]) -> bytes:
    """``doc`` as compact JSON, with ``distributedInfo`` first and spelled as Kineto writes it
    (a space after each colon). HolisticTraceAnalysis finds a file's rank with the pattern
    ``"rank":\\s+(\\d+)`` (its first match in the file): a compact ``"rank":1`` makes it take every
    file of a folder for rank 0.

    >>> kineto_json({"traceEvents": [{"args": {"rank": 5}}], "distributedInfo": {"rank": 1, "world_size": 2}})
    b'{"distributedInfo": {"rank": 1, "world_size": 2},"traceEvents":[{"args":{"rank":5}}]}'
    >>> kineto_json({"traceEvents": []})
    b'{"traceEvents":[]}'
    """
    info = doc.get("distributedInfo")
    if not isinstance(info, dict):
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    rest = orjson.dumps({k: v for k, v in doc.items() if k != "distributedInfo"}, option=orjson.OPT_SERIALIZE_NUMPY)
    head = b'{"distributedInfo": ' + json.dumps(info).encode()
    return head + (b"}" if rest == b"{}" else b"," + rest[1:])


def step_number(name: str) -> int | None:
    """The N of a ``ProfilerStep#N`` annotation.

    >>> step_number("ProfilerStep#12"), step_number("aten::mm")
    (12, None)
    """
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


class KinetoReader(TraceReader):
    """Kineto / Chrome-trace JSON, plain or gzipped (what ``torch.profiler`` and ``whatif record`` write)."""

    name = "kineto"
    suffixes = (".json", ".json.gz")

    def read(self, path: Path) -> FileTrace:
        return parse_file(path)

    def check_bytes(self, filename: str, data: bytes) -> str | None:
        if filename.lower().endswith(".gz"):
            return None if data[:2] == b"\x1f\x8b" else "not gzip data"
        return None if data.lstrip()[:1] in (b"{", b"[") else "not JSON"

    def check_file(self, filename: str, path: Path) -> str | None:
        return gzip_problem(path) if filename.lower().endswith(".gz") else None


register_reader(KinetoReader())
