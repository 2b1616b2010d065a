"""Multi-GPU and memory-system what-ifs (docs/multi-gpu.md): communication as graph tasks, tensor,
sequence, pipeline and data parallelism, re-sharding between phases (Seesaw), compute/communication
overlap (NanoFlow, TokenWeave), PIM offload (DCC, AttAcc). Every module of this package is
imported, so its ``@register``-ed transforms are available."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
