"""One process's tracing: the backend session (:func:`make_session`) and the trace document it
leaves (:func:`trace_document`), shared by the main process and every traced child."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from .distributed import RankInfo
from .options import RecordOptions
from .steps import StepDetector
from .trace_file import fold_leading_steps, merge_cycles


class Session(Protocol):
    """A tracing backend (:class:`TorchSession` or :class:`CuptiSession`)."""

    name: str
    gpu: bool
    cycles: list[dict[str, Any]]
    program_profiler_used: bool

    def start(self, on_yield: Any) -> None: ...
    def step(self) -> None: ...
    def stop(self) -> None: ...
    def disown(self) -> None: ...


def make_session(options: RecordOptions, scratch_dir: Path) -> Session:
    """The backend's session; raises :class:`BackendUnavailableError` before anything runs."""
    if options.backend == "cupti":
        from .cupti_backend import CuptiSession
        return CuptiSession(options)
    from .torch_backend import TorchSession
    return TorchSession(options, scratch_dir)


def options_record(options: RecordOptions) -> dict[str, Any]:
    """The options as ``meta.jsonc`` and ``whatifRecord`` show them."""
    raw = asdict(options)
    raw["output"] = str(options.output)
    raw.pop("progress", None)
    raw.pop("summary", None)
    raw.pop("summary_steps", None)
    return raw


def record_info(argv: list[str], status: int | None, session: Session, detector: StepDetector,
                options: RecordOptions) -> dict[str, Any]:
    """The trace's ``whatifRecord``: argv, exit status, backend, steps and their source, options."""
    folded = detector.tentative_steps if options.schedule.records_from_start else 0
    return {"argv": argv, "exit_status": status, "backend": session.name,
            "steps_marked": detector.steps - folded, "step_source": detector.source.name.lower(),
            "program_profiler": session.program_profiler_used, "options": options_record(options)}


def trace_document(session: Session, detector: StepDetector, options: RecordOptions, rank: RankInfo,
                   path: Path, info: dict[str, Any]) -> dict[str, Any] | None:
    """The Kineto document of a stopped session (its cycles merged, guessed leading steps
    folded, ``distributedInfo``, ``traceName`` and ``whatifRecord`` set); None when nothing was
    recorded."""
    if not session.cycles:
        return None
    doc = merge_cycles(session.cycles)
    if options.schedule.records_from_start:
        fold_leading_steps(doc, detector.tentative_steps)
    dist_info = doc.get("distributedInfo")
    dist_info = dist_info if isinstance(dist_info, dict) else {}
    doc["distributedInfo"] = {**dist_info, **rank.as_kineto()}
    doc["traceName"] = str(path)
    doc["whatifRecord"] = info
    return doc
