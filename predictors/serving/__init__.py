"""Serving predictions from a trace: an iteration-time model fitted on the replayed serving
iterations, and a request-level discrete-event simulator (arrivals, schedulers, KV cache,
replicas) that turns it into TTFT / TPOT / end-to-end latency and throughput. See docs/serving.md.
"""
from .arrivals import (
           RequestSpec,
           WorkloadError,
           gamma_arrivals,
           poisson_arrivals,
           read_workload,
           synthetic_workload,
)
from .iteration_model import DitStepModel, IterationModel, fit_dit_model, fit_llm_model
from .logs import LLMBatch
from .metrics import summarize
from .simulator import SchedulerConfig, simulate_dit, simulate_llm

__all__ = ["DitStepModel", "IterationModel", "LLMBatch", "RequestSpec", "SchedulerConfig", "WorkloadError",
           "fit_dit_model", "fit_llm_model", "gamma_arrivals", "poisson_arrivals", "read_workload", "simulate_dit",
           "simulate_llm", "summarize", "synthetic_workload"]
