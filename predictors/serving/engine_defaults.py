"""What a serving engine does by default with one GPU: the share of its memory it takes, the KV
block (page) size, how many sequences and tokens one iteration may hold, whether prompts are
chunked and prefixes cached, and which scheduling policy runs. Each profile names the engine code
it was read from (docs/serving.md "Engine profiles"); :mod:`.capacity` turns a profile, the
memory model and the GPU into the figures one replica serves with.

>>> [e.value for e in EngineName]
['examples', 'vllm', 'vllm-v0', 'sglang']
>>> h100 = GpuMemory("H100_SXM", 80 * GIB)
>>> v1 = engine_profile("vllm")
>>> v1.memory_fraction(h100), v1.max_batched_tokens(h100, 8192), v1.max_seqs(h100, 8192, None, 8192)
(0.9, 8192, 1024)
>>> v1.max_batched_tokens(GpuMemory("A100_SXM_80GB", 80 * GIB), 8192)   # A100 excepted (vLLM PR #17885)
2048
>>> sg = engine_profile("sglang")
>>> sg.memory_fraction(h100), sg.max_batched_tokens(h100, 8192)     # (81920 - 13440) / 81920 MiB
(0.836, 8192)
>>> sg.max_seqs(h100, 8192, 1_000_000, 8192), sg.max_seqs(h100, 8192, 3000, 8192)
(4096, 1500)
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from whatif.transforms.parallel.memory import WORKSPACE_FRACTION

from .arrivals import WorkloadError
from .scheduler import PolicyName

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_MAX_MODEL_LEN = 8192   # vLLM SchedulerConfig's fallback when the model's is unknown
VLLM_GPU_MEMORY_UTILIZATION = 0.9

_VLLM_V1 = ("vLLM V1 (vllm-project/vllm 99d7eb5d, `vllm serve` = OPENAI_API_SERVER): vllm/engine/arg_utils.py "
            "EngineArgs._set_default_args; gpu_memory_utilization 0.9 and block_size 16 in vllm/config/cache.py "
            "(main moved to 0.92 later, 002f10e0)")
_VLLM_V0 = ("vLLM V0 (v0.8 line): vllm/engine/arg_utils.py EngineArgs._set_default_args_v0 (max_num_seqs 256, "
            "chunked prefill off up to 32K context, prefix caching off); vllm/config.py SchedulerConfig.__post_init__ "
            "(max_num_batched_tokens = max(max_model_len, 2048))")
_SGLANG = ("SGLang (sgl-project/sglang, v0.5 line, late 2025): python/sglang/srt/server_args.py "
           "ServerArgs._handle_gpu_memory_settings (chunked_prefill_size, cuda_graph_max_bs, mem_fraction_static); "
           "model_runner.py init_memory_pool and scheduler max_running_requests; environ.py new-token ratio")
_EXAMPLES = ("this project's examples/llm_serve.py (--max-batch 8, --max-batched-tokens 512) and the memory "
             "model's 0.9 (transforms/parallel/memory.py)")


class EngineName(str, Enum):
    """Keys of the engine profiles (the names ``--engine-profile`` takes)."""

    EXAMPLES = "examples"
    VLLM = "vllm"          # the V1 engine
    VLLM_V0 = "vllm-v0"
    SGLANG = "sglang"


@dataclass(frozen=True)
class GpuMemory:
    """The GPU an engine sizes itself for: its catalog name (``""`` unknown) and memory in bytes
    (None: unknown, as when the engine cannot query the device), and the tensor-parallel degree."""

    name: str = ""
    capacity_bytes: float | None = None
    tensor: int = 1

    @property
    def mib(self) -> float | None:
        return None if self.capacity_bytes is None else self.capacity_bytes / MIB


class EngineProfile(ABC):
    """One engine's defaults. Subclasses set the class attributes and the memory-dependent rules."""

    name: ClassVar[EngineName]
    policy: ClassVar[PolicyName]
    block_tokens: ClassVar[int]
    chunked_prefill: ClassVar[bool]
    prefix_caching: ClassVar[bool]
    source: ClassVar[str]

    @abstractmethod
    def memory_fraction(self, gpu: GpuMemory) -> float:
        """Share of the GPU's memory for weights and the KV cache (vLLM ``gpu_memory_utilization``,
        SGLang ``mem_fraction_static``); the rest is activations, CUDA graphs and workspace."""

    @abstractmethod
    def max_batched_tokens(self, gpu: GpuMemory, max_model_len: int) -> int:
        """Tokens one iteration may compute (vLLM ``max_num_batched_tokens``, SGLang ``chunked_prefill_size``)."""

    @abstractmethod
    def max_seqs(self, gpu: GpuMemory, max_batched_tokens: int, kv_tokens: int | None, max_model_len: int) -> int:
        """Sequences a replica runs at once (vLLM ``max_num_seqs``, SGLang ``max_running_requests``)."""


class Examples(EngineProfile):
    """The example servers' own flags; today's defaults of ``whatif serve``."""

    name, policy, block_tokens = EngineName.EXAMPLES, PolicyName.VLLM, 16
    chunked_prefill = prefix_caching = False
    source = _EXAMPLES

    def memory_fraction(self, gpu: GpuMemory) -> float:
        return 1 - WORKSPACE_FRACTION

    def max_batched_tokens(self, gpu: GpuMemory, max_model_len: int) -> int:
        return 512

    def max_seqs(self, gpu: GpuMemory, max_batched_tokens: int, kv_tokens: int | None, max_model_len: int) -> int:
        return 8


class VllmV1(EngineProfile):
    """vLLM's V1 engine under ``vllm serve``: 8,192 batched tokens and 1,024 sequences on a GPU of
    70 GiB or more that is not an A100, else 2,048 and 256 (also when the GPU is unknown, as vLLM
    does when it cannot query it); sequences never above the token budget."""

    name, policy, block_tokens = EngineName.VLLM, PolicyName.VLLM_V1, 16
    chunked_prefill = prefix_caching = True
    source = _VLLM_V1

    @staticmethod
    def _large(gpu: GpuMemory) -> bool:
        return gpu.capacity_bytes is not None and gpu.capacity_bytes >= 70 * GIB and "a100" not in gpu.name.lower()

    def memory_fraction(self, gpu: GpuMemory) -> float:
        return VLLM_GPU_MEMORY_UTILIZATION

    def max_batched_tokens(self, gpu: GpuMemory, max_model_len: int) -> int:
        return 8192 if self._large(gpu) else 2048

    def max_seqs(self, gpu: GpuMemory, max_batched_tokens: int, kv_tokens: int | None, max_model_len: int) -> int:
        return min(1024 if self._large(gpu) else 256, max_batched_tokens)


class VllmV0(EngineProfile):
    """vLLM's V0 engine: no chunked prefill (contexts up to 32K), whole prompts of up to
    ``max(max_model_len, 2048)`` tokens per prefill, 256 sequences."""

    name, policy, block_tokens = EngineName.VLLM_V0, PolicyName.VLLM, 16
    chunked_prefill = prefix_caching = False
    source = _VLLM_V0

    def memory_fraction(self, gpu: GpuMemory) -> float:
        return VLLM_GPU_MEMORY_UTILIZATION

    def max_batched_tokens(self, gpu: GpuMemory, max_model_len: int) -> int:
        return max(max_model_len, 2048)

    def max_seqs(self, gpu: GpuMemory, max_batched_tokens: int, kv_tokens: int | None, max_model_len: int) -> int:
        return 256


# SGLang's tiers by GPU memory (MiB): (below, chunked_prefill_size, cuda_graph_max_bs at TP < 4, at TP >= 4)
_SGLANG_TIERS = ((20 * 1024, 2048, 8, 8), (35 * 1024, 2048, 24, 80), (60 * 1024, 4096, 32, 160),
                 (90 * 1024, 8192, 256, 512), (160 * 1024, 8192, 256, 512), (math.inf, 16384, 512, 512))


class SGLang(EngineProfile):
    """SGLang's server: ``chunked_prefill_size`` and ``cuda_graph_max_bs`` by GPU memory, then
    ``mem_fraction_static = (mem − reserved) / mem`` with reserved = 512 MiB + 1.5 MiB per chunk
    token (at least 2,048) + 2 MiB per CUDA-graph batch + TP/8 GiB, at least 10 GiB above 60 GiB;
    ``max_running_requests`` = min(pool tokens // 2, request pool ``clamp(tokens/context·512, 2048,
    4096)``); page size 1; radix (prefix) cache on; prefill first, FCFS."""

    name, policy, block_tokens = EngineName.SGLANG, PolicyName.SGLANG, 1
    chunked_prefill = prefix_caching = True
    source = _SGLANG

    @staticmethod
    def _tier(gpu: GpuMemory) -> tuple[int, int]:
        mib = gpu.mib
        if mib is None:
            return 4096, 160
        for below, chunk, small_tp, large_tp in _SGLANG_TIERS:
            if mib < below:
                return chunk, (small_tp if gpu.tensor < 4 else large_tp)
        raise AssertionError("the last tier has no upper bound")

    def memory_fraction(self, gpu: GpuMemory) -> float:
        mib = gpu.mib
        if mib is None:
            return 0.88
        chunk, graph_bs = self._tier(gpu)
        reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + gpu.tensor / 8 * 1024
        if mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        return round((mib - reserved) / mib, 3)

    def max_batched_tokens(self, gpu: GpuMemory, max_model_len: int) -> int:
        return self._tier(gpu)[0]

    def max_seqs(self, gpu: GpuMemory, max_batched_tokens: int, kv_tokens: int | None, max_model_len: int) -> int:
        if kv_tokens is None:
            return 4096
        pool = min(max(int(kv_tokens / max_model_len * 512), 2048), 4096)
        return max(1, min(kv_tokens // 2, pool))


ENGINES: dict[EngineName, EngineProfile] = {p.name: p for p in (Examples(), VllmV1(), VllmV0(), SGLang())}


def engine_key(name: str | Enum) -> EngineName:
    """The :class:`EngineName` of ``name`` (a key or its value); :class:`WorkloadError` listing them otherwise."""
    try:
        return EngineName(name.value if isinstance(name, Enum) else name)
    except ValueError:
        shown = name.value if isinstance(name, Enum) else name
        raise WorkloadError(f"unknown engine {shown!r} (engines: {', '.join(e.value for e in EngineName)})") from None


def engine_profile(name: str | Enum) -> EngineProfile:
    """The profile of engine ``name`` (``"vllm"``, ``EngineName.SGLANG``...)."""
    return ENGINES[engine_key(name)]
