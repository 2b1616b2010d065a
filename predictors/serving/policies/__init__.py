"""The built-in scheduling policies, one module each: which sequences one replica runs in its
next iteration (docs/serving.md "Policies"; a new one is one module, docs/extending.md).

* ``vllm`` (:mod:`.vllm_v0`): vLLM V0 without chunked prefill, and this project's example servers;
* ``vllm-v1`` (:mod:`.vllm_v1`): vLLM V1, one token budget per iteration, chunked prefill;
* ``sglang`` (:mod:`.sglang`): SGLang, prefill first with chunking, admission by the new-token ratio;
* ``static`` (:mod:`.static`): a batch formed only on an empty replica;
* ``chunked`` (:mod:`.chunked`): Sarathi-Serve's stall-free batching;
* ``disagg`` (:mod:`.disagg`): prefill and decode replicas apart, the KV cache handed over.

>>> POLICIES.names()
('vllm', 'static', 'chunked', 'disagg', 'vllm-v1', 'sglang')
"""
# ruff: noqa: I001 - the policies are imported, so registered, in PolicyName's order
from __future__ import annotations

from ..scheduler import POLICIES
from .vllm_v0 import ContinuousBatching
from .static import StaticBatching
from .chunked import ChunkedPrefill
from .disagg import Disaggregated
from .vllm_v1 import VllmV1Scheduler
from .sglang import SGLangScheduler

__all__ = ["POLICIES", "ChunkedPrefill", "ContinuousBatching", "Disaggregated", "SGLangScheduler", "StaticBatching",
           "VllmV1Scheduler"]
