"""whatif: a profiler and what-if analyzer for GPU programs that serve and train LLMs and DiTs.

The public API lives in :mod:`whatif.api`; the most used names are re-exported here.
"""
from whatif.tracer.markers import phase, step

__version__ = "0.1.0"
__all__ = ["__version__", "phase", "step"]
