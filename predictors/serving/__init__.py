"""Serving predictions from a trace: an iteration-time model fitted on the replayed serving
iterations, and a request-level discrete-event simulator (arrivals, schedulers, KV cache,
replicas) that turns it into TTFT / TPOT / end-to-end latency and throughput. See docs/serving.md;
scheduling policies and routers are registered classes (docs/extending.md).
"""
from .arrivals import (
           RequestSpec,
           WorkloadError,
           gamma_arrivals,
           poisson_arrivals,
           read_workload,
           synthetic_workload,
)
from .iteration_costs import CostIterationModel, fit_cost_model
from .iteration_model import DitStepModel, IterationModel, fit_dit_model, fit_llm_model
from .logs import LLMBatch, ServingLogError
from .metrics import summarize
from .routers import ROUTERS, Router, RouterName, register_router
from .scheduler import (
           POLICIES,
           PolicyName,
           ReplicaState,
           SchedulingPolicy,
           Work,
           register_policy,
)
from .simulator import SchedulerConfig, simulate_dit, simulate_llm

__all__ = ["POLICIES", "ROUTERS", "CostIterationModel", "DitStepModel", "IterationModel", "LLMBatch", "PolicyName",
           "ReplicaState", "RequestSpec", "Router", "RouterName", "SchedulerConfig", "SchedulingPolicy",
           "ServingLogError", "Work", "WorkloadError", "fit_cost_model", "fit_dit_model", "fit_llm_model",
           "gamma_arrivals", "poisson_arrivals", "read_workload", "register_policy", "register_router", "simulate_dit",
           "simulate_llm", "summarize", "synthetic_workload"]
