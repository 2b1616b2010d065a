"""The optimizations: each a small module built on the primitives (docs/writing-a-transform.md).
Every module in this package is imported, so its ``@register``-ed transforms are available."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
