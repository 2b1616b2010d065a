"""Allocator records (``profile_memory``): what a memory event is, defined once.

With ``profile_memory=True`` PyTorch's profiler writes one instant event named ``[memory]`` per
allocation and free of its allocators (the CUDA/HIP caching allocator and the CPU allocator):
``Bytes`` (negative for a free), ``Addr``, ``Device Type`` and ``Device Id``, and, since 2022,
the allocator's running ``Total Allocated`` and ``Total Reserved`` after the event. The reader
keeps them as :class:`MemoryColumns`; :func:`whatif.tracer.trace.load_trace` joins the files'
columns into ``Trace.memory`` (one row per record, every rank).

``Device Type`` is c10's ``DeviceType`` code (``c10/core/DeviceType.h``): 0 CPU, 1 CUDA, 6 HIP
(ROCm builds that report HIP), others for accelerators whatif does not analyze.

>>> device_label(1, 0), device_label(6, 2), device_label(0, -1), device_label(13, 0)
('GPU 0', 'GPU 2', 'CPU', 'device type 13:0')
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np
import pandas as pd

MEMORY_EVENT_NAME = "[memory]"
"""The name of an allocator record (an instant event, ``ph: "i"``)."""

UNKNOWN = -1
"""A ``Total Allocated``/``Total Reserved``/``Addr`` the record does not carry."""


class DeviceType(IntEnum):
    """The c10 device types whatif tells apart in allocator records."""

    CPU = 0
    CUDA = 1
    HIP = 6


GPU_DEVICE_TYPES = frozenset({DeviceType.CUDA, DeviceType.HIP})
"""Device types whose allocations are GPU memory."""


def device_label(device_type: int, device_id: int) -> str:
    """How a record's device reads in tables: ``GPU <id>``, ``CPU``, or the raw code."""
    if device_type in GPU_DEVICE_TYPES:
        return f"GPU {device_id}"
    if device_type == DeviceType.CPU:
        return "CPU"
    return f"device type {device_type}:{device_id}"


@dataclass
class MemoryColumns:
    """One file's allocator records as parallel arrays, in file order (times in nanoseconds,
    ``baseTimeNanoseconds`` applied; :data:`UNKNOWN` where a record lacks a field)."""

    ts_ns: np.ndarray                  # int64
    pid: np.ndarray                    # int64
    tid: np.ndarray                    # int64
    device_type: np.ndarray            # int16, c10 DeviceType
    device_id: np.ndarray              # int32
    bytes: np.ndarray                  # int64, negative for a free
    total_allocated_bytes: np.ndarray  # int64
    total_reserved_bytes: np.ndarray   # int64
    addr: np.ndarray                   # int64

    def __len__(self) -> int:
        return len(self.ts_ns)

    @classmethod
    def empty(cls) -> MemoryColumns:
        return cls.from_rows([])

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[int, int, int, int, int, int, int, int, int]]) -> MemoryColumns:
        """Columns from ``(ts_ns, pid, tid, device_type, device_id, bytes, total_allocated_bytes,
        total_reserved_bytes, addr)`` tuples.

        >>> MemoryColumns.from_rows([(5, 1, 1, 1, 0, 512, 1024, 2048, 7)]).total_reserved_bytes.tolist()
        [2048]
        """
        cols = list(zip(*rows)) if rows else [()] * 9
        dtypes = (np.int64, np.int64, np.int64, np.int16, np.int32, np.int64, np.int64, np.int64, np.int64)
        arrays = [np.array(c, dtype=d) for c, d in zip(cols, dtypes)]
        return cls(*arrays)


MEMORY_COLUMNS = ("rank", "ts_ns", "pid", "tid", "device_type", "device_id", "bytes",
                  "total_allocated_bytes", "total_reserved_bytes", "addr")
"""The columns of ``Trace.memory``, in order."""


def allocated_bytes(records: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """Allocated bytes after each of one device's records (time order), and whether they are the
    allocator's own ``Total Allocated``; without it (2021 traces), the running sum of the records'
    sizes, relative to what was allocated before the recording.

    >>> frame = pd.DataFrame({"bytes": [512, 256, -512], "total_allocated_bytes": [UNKNOWN] * 3})
    >>> allocated_bytes(frame)[0].tolist()
    [512, 768, 256]
    """
    totals = records["total_allocated_bytes"].to_numpy()
    recorded = bool((totals != UNKNOWN).all())
    return (totals if recorded else np.cumsum(records["bytes"].to_numpy())), recorded


@dataclass(frozen=True)
class DevicePeak:
    """The most GPU memory one device of one rank held allocated during the recording."""

    rank: int
    device_type: int
    device_id: int
    allocated_bytes: int
    ts_ns: int
    recorded: bool  # the allocator's Total Allocated (else relative to the recording's start)


def held_before_bytes(records: pd.DataFrame) -> int:
    """What one device held before its first record in ``records`` (its records in time order):
    the allocator's first ``Total Allocated`` less that record's bytes; 0 when the totals are not
    recorded (2021 traces count from the recording's start)."""
    if not len(records):
        return 0
    allocated, recorded = allocated_bytes(records)
    return int(allocated[0]) - int(records["bytes"].to_numpy()[0]) if recorded else 0


def on_gpu(memory: pd.DataFrame) -> np.ndarray:
    """Per record of ``memory`` (``Trace.memory``): whether it is a GPU's (:data:`GPU_DEVICE_TYPES`)."""
    return np.isin(memory["device_type"].to_numpy(), [int(t) for t in GPU_DEVICE_TYPES])


def gpu_peaks(memory: pd.DataFrame) -> list[DevicePeak]:
    """Per GPU device of each rank in ``memory`` (``Trace.memory``), its allocated peak; empty
    when the trace has no allocator records (``record --memory``)."""
    gpu = memory[on_gpu(memory)]
    peaks = []
    for (rank, dtype, dev), rows in sorted(gpu.groupby(["rank", "device_type", "device_id"]).indices.items()):
        frame = gpu.iloc[rows]
        allocated, recorded = allocated_bytes(frame)
        top = int(np.argmax(allocated))
        peaks.append(DevicePeak(int(rank), int(dtype), int(dev), int(allocated[top]),
                                int(frame["ts_ns"].to_numpy()[top]), recorded))
    return peaks


def memory_frame(columns: Sequence[MemoryColumns], ranks: Sequence[int]) -> pd.DataFrame:
    """Every file's records in one table, sorted by (rank, ts_ns) and, at equal times, in file
    order (the allocator's own order), with the frees the profiler did not record inferred
    (:func:`with_unseen_frees`)."""
    data = {"rank": np.concatenate([np.full(len(c), r, dtype=np.int32) for c, r in zip(columns, ranks)]
                                   or [np.zeros(0, dtype=np.int32)])}
    for key in MEMORY_COLUMNS[1:]:
        data[key] = np.concatenate([getattr(c, key) for c in columns] or [getattr(MemoryColumns.empty(), key)])
    order = np.lexsort((data["ts_ns"], data["rank"]))
    return with_unseen_frees(pd.DataFrame({k: data[k][order] for k in MEMORY_COLUMNS}, copy=False))


def with_unseen_frees(memory: pd.DataFrame) -> pd.DataFrame:
    """``memory`` (records sorted by rank and time) with a free inferred wherever a block is
    allocated at an address that, by the records, still holds one.

    The profiler records an allocator event only on a thread it profiles, so a tensor whose last
    reference dies on another thread (a gloo or NCCL work object releasing its tensors on the
    communication library's thread, a data-loader thread) is freed with no record; the address
    allocated again proves it was freed by then. The inferred free is placed right before that
    allocation (the latest it can have happened), with the block's negative size, its device and
    address, and ``tid`` :data:`UNKNOWN` (the thread is not known; it is in no operator). Its
    ``Total Allocated``: the CPU allocator's counter (``ProfiledCPUMemoryReporter`` in
    ``c10/core/CPUAllocator.cpp``) updates only when the freeing thread is profiled, so it missed
    the free too and every later total of the device is lowered by the block; the CUDA/HIP caching
    allocators count every free in their statistics, so their later totals already have it (the
    inferred record repeats the total before it).

    >>> mem = pd.DataFrame({"rank": [0] * 3, "ts_ns": [1, 2, 3], "pid": [1] * 3, "tid": [1] * 3,
    ...                     "device_type": [0] * 3, "device_id": [-1] * 3, "bytes": [64, 64, -64],
    ...                     "total_allocated_bytes": [64, 128, 64], "total_reserved_bytes": [0] * 3,
    ...                     "addr": [7, 7, 7]})
    >>> out = with_unseen_frees(mem)
    >>> out["bytes"].tolist(), out["total_allocated_bytes"].tolist(), out["tid"].tolist()
    ([64, -64, 64, -64], [64, 0, 64, 0], [1, -1, 1, 1])
    """
    n = len(memory)
    addrs, sizes = memory["addr"].to_numpy(), memory["bytes"].to_numpy()
    device = memory.groupby(["rank", "device_type", "device_id"], sort=False).ngroup().to_numpy()
    order = np.lexsort((np.arange(n), addrs, device))
    same = np.zeros(n, dtype=bool)
    same[1:] = (device[order][1:] == device[order][:-1]) & (addrs[order][1:] == addrs[order][:-1])
    again = np.zeros(n, dtype=bool)
    again[1:] = same[1:] & (sizes[order][1:] > 0) & (sizes[order][:-1] > 0) & (addrs[order][1:] != UNKNOWN)
    reused = order[again]                       # allocations at an address still held
    if not len(reused):
        return memory
    held = order[np.flatnonzero(again) - 1]     # the blocks there, freed unseen
    rank = np.argsort(reused, kind="stable")
    reused, held = reused[rank], held[rank]
    lost = np.zeros(n, dtype=np.int64)
    cpu = memory["device_type"].to_numpy()[reused] == DeviceType.CPU
    lost[reused[cpu]] = sizes[held[cpu]]
    totals = memory["total_allocated_bytes"].to_numpy()
    lowered = np.where(totals != UNKNOWN,
                       totals - pd.Series(lost).groupby(device).cumsum().to_numpy(), totals)
    frees = memory.iloc[reused].copy()
    frees["tid"] = UNKNOWN
    frees["bytes"] = -sizes[held]
    frees["addr"] = addrs[held]
    frees["total_allocated_bytes"] = np.where(totals[reused] != UNKNOWN, lowered[reused] - sizes[reused], UNKNOWN)
    out = memory.assign(total_allocated_bytes=lowered)
    place = np.concatenate([np.arange(n), reused])
    side = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(len(reused), dtype=np.int64)])
    return pd.concat([out, frees], ignore_index=True).iloc[np.lexsort((side, place))].reset_index(drop=True)


UNSEEN_FREE_OP = "(freed on a thread the profiler did not record)"
"""The operator of a free :func:`with_unseen_frees` inferred."""

FIRST_ADDED_ADDR = -2
"""The address of a what-if's first added block; later ones count down (recorded addresses are
non-negative and :data:`UNKNOWN` is -1, so the two never meet)."""

_ADDED_COLUMNS = ("anchor", "after", "bytes", "addr", "op")


GPU_BLOCK_BYTES = 512
"""The CUDA caching allocator rounds every block up to a multiple of this."""


def gpu_block_bytes(nbytes: float) -> int:
    """The bytes the caching allocator gives a request of ``nbytes`` (:data:`GPU_BLOCK_BYTES` multiples).

    >>> gpu_block_bytes(1), gpu_block_bytes(512), gpu_block_bytes(1024.5)
    (512, 512, 1536)
    """
    return int(np.ceil(nbytes / GPU_BLOCK_BYTES)) * GPU_BLOCK_BYTES
BEFORE_THE_RECORDING = "(allocated before the recording)"
"""The operator of a what-if's record that changes what a device held before its first record."""
HELD_EARLIER = "(allocated earlier: held from a first micro-batch)"
"""The operator of a block a what-if allocates earlier than recorded (:class:`BlockScaling` ``moved``)."""


@dataclass(frozen=True)
class BlockScaling:
    """A what-if that keeps each block of some allocations at a multiple of its bytes (``rows``
    of ``Trace.memory``, allocations only; ``factors`` aligned), what each device held before
    its first record at ``before`` × it, and some blocks allocated earlier (``moved`` rows,
    each right before its ``to`` row; made in :data:`HELD_EARLIER`). Two compose by multiplying
    (:meth:`then`), so a larger batch on one tensor-parallel rank is both at once.

    >>> a = BlockScaling(np.array([3, 5]), np.array([2.0, 2.0]))
    >>> b = BlockScaling(np.array([5, 7]), np.array([0.5, 0.5]), before=0.5, moved=np.array([7]), to=np.array([1]))
    >>> c = a.then(b)
    >>> c.rows.tolist(), c.factors.tolist(), c.before, c.moved.tolist(), c.to.tolist()
    ([3, 5, 7], [2.0, 1.0, 0.5], 0.5, [7], [1])
    """

    rows: np.ndarray
    factors: np.ndarray
    before: float = 1.0
    moved: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    to: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def factor_at(self, row: int) -> float:
        """The factor of the block allocated at ``row`` (1 when this scaling leaves it as recorded).

        >>> s = BlockScaling(np.array([3, 5]), np.array([0.5, 0.0]))
        >>> s.factor_at(5), s.factor_at(4)
        (0.0, 1.0)
        """
        at = int(np.searchsorted(self.rows, row))
        return float(self.factors[at]) if at < len(self.rows) and self.rows[at] == row else 1.0

    def then(self, other: BlockScaling) -> BlockScaling:
        rows = np.union1d(self.rows, other.rows)
        factors = np.ones(len(rows))
        for part in (self, other):
            factors[np.searchsorted(rows, part.rows)] *= part.factors
        moves = dict(zip(self.moved.tolist(), self.to.tolist()))
        for row, to in zip(other.moved.tolist(), other.to.tolist()):
            moves[row] = min(to, moves.get(row, to))
        moved = np.asarray(sorted(moves), dtype=np.int64)
        return BlockScaling(rows, factors, self.before * other.before, moved,
                            np.asarray([moves[r] for r in moved.tolist()], dtype=np.int64))


Record = tuple[object, int]
"""One record of a :class:`Burst`: ``(block, bytes)`` allocates ``block`` (any key), ``(block, 0)`` frees it."""


@dataclass(frozen=True)
class Burst:
    """Blocks a what-if allocates and frees at one place (``at``: a row of ``Trace.memory`` and
    whether right after it), in the order of ``records`` (exact bytes; a GPU's rounded up to
    :data:`GPU_BLOCK_BYTES` when placed, :meth:`placed`), made in ``op``. Its bytes follow the block
    allocated at ``follows``: when another what-if scales that block (a larger batch, a pipeline
    stage without its layer), the burst scales with it (:meth:`times`; :func:`scaled_edit`).

    >>> b = Burst((4, False), (("send", 700), ("got", 700), ("send", 0), ("got", 0)), "all_to_all", 2)
    >>> b.placed(gpu=True), b.times(2).placed(gpu=False)
    ([('send', 1024), ('got', 1024), ('send', 0), ('got', 0)], [('send', 1400), ('got', 1400), ('send', 0), ('got', 0)])
    >>> b.most_held_bytes(gpu=True), b.times(0).records
    (2048, ())
    """

    at: tuple[int, bool]
    records: tuple[Record, ...]
    op: str
    follows: int

    def times(self, factor: float) -> Burst:
        """The burst at ``factor`` × its bytes (none at all at 0)."""
        if factor == 1:
            return self
        if factor <= 0:
            return replace(self, records=())
        return replace(self, records=tuple((b, max(1, int(round(n * factor))) if n else 0) for b, n in self.records))

    def placed(self, gpu: bool) -> list[Record]:
        """The records as the allocator gives them (a GPU's in whole blocks)."""
        return [(b, gpu_block_bytes(n) if gpu and n else n) for b, n in self.records]

    def most_held_bytes(self, gpu: bool) -> int:
        """The most bytes the burst holds at once, as placed."""
        held: dict[object, int] = {}
        most = 0
        for block, nbytes in self.placed(gpu):
            if nbytes:
                held[block] = nbytes
            else:
                held.pop(block, None)
            most = max(most, sum(held.values()))
        return most


@dataclass(frozen=True)
class RecordEdit:
    """What a what-if changes in a trace's allocator records (``Trace.memory``): the rows that no
    longer happen (``dropped``) and the records that happen instead (``added``: one row each;
    ``anchor`` a row of ``Trace.memory`` whose rank, device, thread and time the new record takes,
    ``after`` whether it comes right after the anchor or right before it, several at one place in
    the order they are listed; ``bytes`` negative for a free; ``addr`` pairing an allocation with
    its free, from :data:`FIRST_ADDED_ADDR` down; ``op`` the operator it is made in, None: its
    anchor's). ``what``:
    one line for the reader; ``scaling`` and ``bursts``: the :class:`BlockScaling` and the
    :class:`Burst` s it was made from, if it was (:func:`scaled_edit`; such edits compose,
    :func:`composed_edit`). Built with :class:`RecordEditor`."""

    what: str
    dropped: np.ndarray
    added: pd.DataFrame
    scaling: BlockScaling | None = None
    bursts: tuple[Burst, ...] = ()

    @property
    def added_bytes(self) -> int:
        """Bytes the added records allocate."""
        sizes = self.added["bytes"].to_numpy()
        return int(sizes[sizes > 0].sum())


class RecordEditor:
    """Builds a :class:`RecordEdit` on a trace's allocator records: drop a block (its allocation
    and the free that returns it), add a block (an allocation and its free, each at a place).

    >>> mem = pd.DataFrame({"rank": [0] * 4, "ts_ns": [1, 2, 3, 4], "pid": [1] * 4, "tid": [1] * 4,
    ...                     "device_type": [1] * 4, "device_id": [0] * 4, "bytes": [512, 64, -512, -64],
    ...                     "total_allocated_bytes": [512, 576, 64, 0], "total_reserved_bytes": [0] * 4,
    ...                     "addr": [7, 9, 7, 9]})
    >>> ed = RecordEditor(mem)
    >>> ed.free_of(0), ed.free_of(1)
    (2, 3)
    >>> ed.drop_block(0)
    >>> ed.add_block(16, (1, False), (3, True), "aten::flash")
    >>> e = ed.edit("one block for another")
    >>> e.dropped.tolist(), e.added["bytes"].tolist(), e.added["addr"].tolist()
    ([0, 2], [16, -16], [-2, -2])
    """

    def __init__(self, memory: pd.DataFrame) -> None:
        self.memory = memory
        self._dropped: list[int] = []
        self._added: list[tuple[int, bool, int, int, str | None]] = []
        self._next_addr = FIRST_ADDED_ADDR
        n = len(memory)
        sizes = memory["bytes"].to_numpy()
        block = memory.groupby(["rank", "device_type", "device_id", "addr"], sort=False).ngroup().to_numpy()
        order = np.lexsort((np.arange(n), block))
        frees = pd.Series(np.where(sizes[order] < 0, order, np.nan))
        later = frees.groupby(block[order]).bfill().to_numpy()
        self._next_free = np.full(n, -1, dtype=np.int64)
        known = ~np.isnan(later)
        self._next_free[order[known]] = later[known].astype(np.int64)
        self._next_free[memory["addr"].to_numpy() == UNKNOWN] = -1

    def free_of(self, row: int) -> int | None:
        """The row that frees the block allocated at ``row`` (the next free of its address on its
        device), None when the recording ends first or the record has no address."""
        if self.memory["bytes"].to_numpy()[row] <= 0:
            raise ValueError(f"allocator record {row} is not an allocation")
        free = int(self._next_free[row])
        return free if free >= 0 else None

    def drop_block(self, row: int) -> None:
        """The allocation at ``row`` and its free no longer happen."""
        self._dropped.append(row)
        free = self.free_of(row)
        if free is not None:
            self._dropped.append(free)

    def add_block(self, nbytes: int, alloc_at: tuple[int, bool], free_at: tuple[int, bool] | None,
                  op: str | None) -> None:
        """A block of ``nbytes`` allocated at ``alloc_at`` and freed at ``free_at`` (None: held to
        the end), each ``(anchor row, after)``, made in ``op`` (None: the anchor's operator)."""
        addr = self._next_addr
        self._next_addr -= 1
        self._added.append((alloc_at[0], alloc_at[1], int(nbytes), addr, op))
        if free_at is not None:
            self._added.append((free_at[0], free_at[1], -int(nbytes), addr, op))

    def add_burst(self, at: tuple[int, bool], records: Sequence[Record], op: str | None) -> None:
        """Blocks allocated and freed at one place (``(anchor row, after)``), in the order of
        ``records``: ``(block, n)`` allocates block ``block`` (any key) of ``n`` bytes, ``(block,
        0)`` frees it; every block must be freed in the burst.

        >>> mem = pd.DataFrame({"rank": [0], "ts_ns": [1], "pid": [1], "tid": [1], "device_type": [0],
        ...                     "device_id": [-1], "bytes": [64], "total_allocated_bytes": [64],
        ...                     "total_reserved_bytes": [0], "addr": [7]})
        >>> ed = RecordEditor(mem)
        >>> ed.add_burst((0, True), [("send", 8), ("got", 8), ("send", 0), ("got", 0)], "all_to_all")
        >>> e = ed.edit("a send and a receive buffer")
        >>> e.added["bytes"].tolist(), e.added["addr"].tolist()
        ([8, 8, -8, -8], [-2, -3, -2, -3])
        """
        held: dict[object, tuple[int, int]] = {}
        for block, nbytes in records:
            if nbytes < 0:
                raise ValueError(f"a burst's block {block!r} has {nbytes} bytes: give a size, or 0 to free it")
            if nbytes > 0 and block not in held:
                held[block] = (self._next_addr, int(nbytes))
                self._added.append((at[0], at[1], int(nbytes), self._next_addr, op))
                self._next_addr -= 1
            elif nbytes == 0 and block in held:
                addr, size = held.pop(block)
                self._added.append((at[0], at[1], -size, addr, op))
            else:
                raise ValueError(f"a burst {'allocates' if nbytes else 'frees'} block {block!r} "
                                 f"{'twice' if nbytes else 'it does not hold'}")
        if held:
            raise ValueError(f"a burst must free every block it allocates ({', '.join(map(repr, held))} held)")

    def edit(self, what: str) -> RecordEdit:
        added = pd.DataFrame(self._added, columns=list(_ADDED_COLUMNS)).astype(
            {"anchor": np.int64, "after": bool, "bytes": np.int64, "addr": np.int64, "op": object})
        return RecordEdit(what, np.unique(np.asarray(self._dropped, dtype=np.int64)), added)


def scaled_edit(memory: pd.DataFrame, scaling: BlockScaling, what: str, bursts: Sequence[Burst] = ()) -> RecordEdit:
    """The records of ``scaling`` on ``memory`` (``Trace.memory``): each block of its rows whose
    factor is not 1 allocated at the factor × its bytes (rounded up to :data:`GPU_BLOCK_BYTES` on a
    GPU) at its place (a moved one's right before its ``to`` row) and freed at its free; what each
    device held before its first record (its
    first ``Total Allocated`` less the record, when recorded) moved by ``before``, one record
    before the first: every GPU's on a trace with GPU records (the host's is not the model's),
    else every device's; then each of ``bursts`` at its place."""
    editor = RecordEditor(memory)
    scale_blocks(editor, scaling)
    gpu = on_gpu(memory)
    for burst in bursts:
        if burst.records:
            editor.add_burst(burst.at, burst.placed(bool(gpu[burst.at[0]])), burst.op)
    edit = editor.edit(what)
    return RecordEdit(what, edit.dropped, edit.added, scaling, tuple(bursts))


def composed_edit(memory: pd.DataFrame, first: RecordEdit, second: RecordEdit) -> RecordEdit:
    """Two what-ifs made of scaled blocks and bursts (:func:`scaled_edit`) at once: each block at
    the product of their factors (:meth:`BlockScaling.then`), each burst of one at the other's
    factor of the block it follows (a larger batch's all-to-all buffers grow with its attention);
    ``first``'s line.

    >>> mem = pd.DataFrame({"rank": [0] * 2, "ts_ns": [1, 2], "pid": [1] * 2, "tid": [1] * 2, "device_type": [0] * 2,
    ...                     "device_id": [-1] * 2, "bytes": [512, -512], "total_allocated_bytes": [512, 0],
    ...                     "total_reserved_bytes": [0] * 2, "addr": [7, 7]})
    >>> half = scaled_edit(mem, BlockScaling(np.array([0]), np.array([0.5])), "half the tokens",
    ...                    [Burst((0, True), (("buffer", 100), ("buffer", 0)), "all_to_all", 0)])
    >>> c = composed_edit(mem, half, scaled_edit(mem, BlockScaling(np.array([0]), np.array([2.0])), "twice the batch"))
    >>> c.dropped.tolist(), c.added["bytes"].tolist()   # the block as recorded, the buffer twice its bytes
    ([], [200, -200])

    Raises
    ------
    ValueError : an edit not made by :func:`scaled_edit`.
    """
    if first.scaling is None or second.scaling is None:
        raise ValueError("only edits made of scaled blocks and bursts compose")
    bursts = (*(b.times(second.scaling.factor_at(b.follows)) for b in first.bursts),
              *(b.times(first.scaling.factor_at(b.follows)) for b in second.bursts))
    return scaled_edit(memory, first.scaling.then(second.scaling), first.what, bursts)


def scale_blocks(editor: RecordEditor, scaling: BlockScaling) -> None:
    """Put ``scaling``'s records into ``editor`` (what :func:`scaled_edit` does), so that an edit
    can scale some blocks and add others."""
    memory = editor.memory
    sizes = memory["bytes"].to_numpy()
    gpu = on_gpu(memory)
    moves = dict(zip(scaling.moved.tolist(), scaling.to.tolist()))
    factors = dict(zip(scaling.rows.tolist(), scaling.factors.tolist()))
    for row in sorted(set(factors) | set(moves)):
        factor = factors.get(row, 1.0)
        to = moves.get(row)
        if factor == 1 and to is None:
            continue
        exact_bytes = float(sizes[row]) * factor
        nbytes = gpu_block_bytes(exact_bytes) if gpu[row] else int(round(exact_bytes))
        free = editor.free_of(row)
        editor.drop_block(row)
        if nbytes > 0:
            editor.add_block(nbytes, (row, True) if to is None else (to, False),
                             (free, True) if free is not None else None, None if to is None else HELD_EARLIER)
    if scaling.before != 1:
        scope = np.flatnonzero(gpu) if gpu.any() else np.arange(len(memory))
        for rows in memory.iloc[scope].groupby(["rank", "device_type", "device_id"], sort=False).indices.values():
            first = int(scope[rows[0]])
            change_bytes = int(round(held_before_bytes(memory.iloc[scope[rows]]) * (scaling.before - 1)))
            if change_bytes:
                editor.add_block(change_bytes, (first, False), None, BEFORE_THE_RECORDING)
