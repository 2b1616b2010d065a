"""``whatif record``: run a PyTorch program under tracing and write a run folder.

>>> from whatif.tracer.record import RecordOptions, record, resolve_target  # doctest: +SKIP
>>> result = record(resolve_target("train.py", None, []), RecordOptions(output=Path("run")), ["whatif"])
"""
from .errors import (
    BackendUnavailableError,
    OptionError,
    OutputExistsError,
    RecordError,
    ScriptNotFoundError,
)
from .options import RecordOptions, Schedule, default_output
from .target import Target, resolve_target

__all__ = ["BackendUnavailableError", "OptionError", "OutputExistsError", "RecordError", "RecordOptions",
           "Schedule", "ScriptNotFoundError", "Target", "default_output", "record", "resolve_target"]


def record(target: Target, options: RecordOptions, command: list[str]):  # type: ignore[no-untyped-def]
    """Run ``target`` under tracing (see :func:`whatif.tracer.record.recorder.record`); torch is
    imported only here, so that option and script errors are reported without loading it."""
    from .recorder import record as run_recording
    return run_recording(target, options, command)
