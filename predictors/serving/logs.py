"""Batch composition of every recorded serving iteration, from the example servers' JSON logs.

The CPU traces of this project carry no tensor shapes by default, so the composition of an
iteration (sequences, new tokens, context lengths) comes from the server's own log
(``--log`` of examples/llm_serve.py or examples/dit_serve.py; schemas at the top of each file).
``find_log`` finds it from a run folder's metadata (the recorded command's ``--log``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from whatif.core.errors import WhatifError
from whatif.core.limits import MAX_DURATION_NS, MAX_STEP
from whatif.tracer.readers import run_meta_path

LLM_SCHEMA = "whatif.examples.llm_serve/1"
DIT_SCHEMA = "whatif.examples.dit_serve/1"


class ServingLogError(WhatifError):
    """A serving log that cannot be used (one line naming the file)."""


@dataclass(frozen=True)
class LLMBatch:
    """What one LLM iteration computes.

    ``prefill_tokens[i]``: new prompt tokens of prefilling sequence i; ``prefill_cached[i]``: its tokens
    already in the KV cache (0 unless chunked or recomputed); ``decode_context[j]``: tokens decoding
    sequence j attends to (its cached tokens + the new one).
    """

    prefill_tokens: tuple[int, ...] = ()
    prefill_cached: tuple[int, ...] = ()
    decode_context: tuple[int, ...] = ()

    @property
    def phase(self) -> str:
        if self.prefill_tokens and self.decode_context:
            return "mixed"
        return "prefill" if self.prefill_tokens else "decode"


def find_log(run: Path) -> Path | None:
    """The ``--log`` file named in a run folder's metadata (``meta.jsonc``, or an older folder's
    ``meta.json``), if it exists: where the recording
    wrote it (relative to its ``cwd``), else a file of that name inside the run folder (so a run
    folder that was moved or cloned keeps its log).

    >>> find_log(Path("no/such/run")) is None
    True
    """
    run_dir = run if run.is_dir() else run.parent
    meta_path = run_meta_path(run_dir)
    if meta_path is None:
        return None
    try:
        meta = msgspec.json.decode(meta_path.read_bytes(), type=_RunCommand)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    argv = meta.argv
    for i, a in enumerate(argv):
        value = (argv[i + 1] if a == "--log" and i + 1 < len(argv)
                 else a.removeprefix("--log=") if a.startswith("--log=") else None)
        if value:
            p = Path(value)
            p = p if p.is_absolute() else Path(meta.cwd or ".") / p
            if p.exists():
                return p
            inside = run_dir / p.name
            return inside if inside.exists() else None
    return None


class _RunCommand(msgspec.Struct, frozen=True):
    """The part of a run folder's metadata that names the serving log."""

    argv: list[str] = []
    cwd: str | None = None


Id = Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=MAX_STEP)]
Ms = Annotated[float, msgspec.Meta(ge=0, le=MAX_DURATION_NS / 1e6)]


class LlmConfig(msgspec.Struct, frozen=True):
    """The llm_serve run's settings that whatif reads (all optional: logs of other servers lack them)."""

    rate: float | str | None = None
    num_requests: Positive | None = None
    prompt_min: Tokens | None = None
    prompt_max: Tokens | None = None
    output_min: Tokens | None = None
    output_max: Tokens | None = None

    def token_ranges(self) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """(prompt, output) token ranges of the recorded workload, where the log has both."""
        if self.prompt_min is None or self.prompt_max is None or self.output_min is None or self.output_max is None:
            return None
        return (self.prompt_min, self.prompt_max), (self.output_min, self.output_max)


class LlmRequest(msgspec.Struct, frozen=True):
    id: Id
    prompt_tokens: Tokens


class LlmIteration(msgspec.Struct, frozen=True):
    phase: Literal["prefill", "decode"]
    request_ids: list[Id]
    duration_ms: Ms


class LlmLog(msgspec.Struct, frozen=True, tag=LLM_SCHEMA, tag_field="schema"):
    """An examples/llm_serve.py log, as far as whatif reads it."""

    requests: list[LlmRequest]
    iterations: list[LlmIteration]
    config: LlmConfig = LlmConfig()


class DitConfig(msgspec.Struct, frozen=True):
    tokens: Positive
    resolution: Positive
    frames: Positive
    patch: Positive
    steps: Positive
    batch: Positive
    cfg_scale: Annotated[float, msgspec.Meta(ge=0, le=1e6)]
    rate: float | str | None = None
    num_requests: Positive | None = None


class DitBatch(msgspec.Struct, frozen=True):
    duration_ms: Ms
    step_ms: list[Ms]


class DitStep(msgspec.Struct, frozen=True):
    model_batch: Positive
    duration_ms: Ms


class DitLog(msgspec.Struct, frozen=True, tag=DIT_SCHEMA, tag_field="schema"):
    """An examples/dit_serve.py log, as far as whatif reads it."""

    config: DitConfig
    batches: list[DitBatch]
    steps: list[DitStep]


ServingLog = LlmLog | DitLog


def read_log(path: Path) -> ServingLog:
    """The serving log at ``path``, typed and checked once: every field whatif reads has its type
    and bounds (token counts and ids within int32, durations finite and non-negative), every
    iteration names a logged request, and the log has iterations (LLM) or steps (DiT).

    Raises
    ------
    ServingLogError
        One line naming the file and the first problem found.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ServingLogError(f"{path}: no such serving log") from None
    except OSError as exc:
        raise ServingLogError(f"{path}: cannot read the serving log ({exc.strerror or exc})") from None
    try:
        log: ServingLog = msgspec.json.decode(data, type=ServingLog)
    except msgspec.ValidationError as exc:
        if "schema" in str(exc):
            raise ServingLogError(f"{path}: not a serving log (expected schema {LLM_SCHEMA} or {DIT_SCHEMA})") \
                from None
        raise ServingLogError(f"{path}: not a usable serving log ({exc})") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ServingLogError(f"{path}: not a JSON serving log ({reason})") from None
    _check(path, log)
    return log


def _check(path: Path, log: ServingLog) -> None:
    if isinstance(log, DitLog):
        if not log.steps:
            raise ServingLogError(f"{path}: the serving log has no denoising steps")
        return
    if not log.iterations:
        raise ServingLogError(f"{path}: the serving log has no iterations")
    known = {r.id for r in log.requests}
    for i, it in enumerate(log.iterations):
        missing = next((r for r in it.request_ids if r not in known), None)
        if missing is not None:
            raise ServingLogError(f"{path}: iteration {i} names request {missing}, which the log does not list")


def llm_compositions(log: LlmLog) -> list[tuple[str, LLMBatch]]:
    """(phase, batch) of every iteration of an llm_serve log, in order.

    A decoding sequence attends to prompt + outputs so far (the example's ``cached_tokens + 1``).
    """
    prompt = {r.id: r.prompt_tokens for r in log.requests}
    produced = dict.fromkeys(prompt, 0)
    out: list[tuple[str, LLMBatch]] = []
    for it in log.iterations:
        ids = it.request_ids
        if it.phase == "prefill":
            b = LLMBatch(prefill_tokens=tuple(prompt[i] for i in ids), prefill_cached=(0,) * len(ids))
        else:
            b = LLMBatch(decode_context=tuple(prompt[i] + produced[i] for i in ids))
        for i in ids:
            produced[i] += 1
        out.append((it.phase, b))
    return out


def llm_durations_ms(log: LlmLog) -> list[float]:
    """Measured duration of every iteration (ms), as the server logged it."""
    return [it.duration_ms for it in log.iterations]


def dit_compositions(log: DitLog) -> list[tuple[int, int]]:
    """(model batch, tokens) of every denoising step of a dit_serve log, in order."""
    return [(s.model_batch, log.config.tokens) for s in log.steps]
