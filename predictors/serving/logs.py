"""Batch composition of every recorded serving iteration, from the example servers' JSON logs.

The CPU traces of this project carry no tensor shapes by default, so the composition of an
iteration (sequences, new tokens, context lengths) comes from the server's own log
(``--log`` of examples/llm_serve.py or examples/dit_serve.py; schemas at the top of each file).
``find_log`` finds it from a run folder's ``meta.json`` (the recorded command's ``--log``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whatif.core.errors import WhatifError

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
    """The ``--log`` file named in a run folder's ``meta.json``, if it exists: where the recording
    wrote it (relative to its ``cwd``), else a file of that name inside the run folder (so a run
    folder that was moved or cloned keeps its log).

    >>> find_log(Path("no/such/run")) is None
    True
    """
    run_dir = run if run.is_dir() else run.parent
    meta_path = run_dir / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    argv = [str(a) for a in meta.get("argv") or []]
    for i, a in enumerate(argv):
        value = (argv[i + 1] if a == "--log" and i + 1 < len(argv)
                 else a.removeprefix("--log=") if a.startswith("--log=") else None)
        if value:
            p = Path(value)
            p = p if p.is_absolute() else Path(meta.get("cwd") or ".") / p
            if p.exists():
                return p
            inside = run_dir / p.name
            return inside if inside.exists() else None
    return None


def read_log(path: Path) -> dict[str, Any]:
    """The parsed log; refuses a file that is not an llm_serve or dit_serve log."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ServingLogError(f"{path}: no such serving log") from None
    except (OSError, ValueError) as exc:
        raise ServingLogError(f"{path}: not a JSON serving log ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") not in (LLM_SCHEMA, DIT_SCHEMA):
        raise ServingLogError(f"{path}: not a serving log (expected schema {LLM_SCHEMA} or {DIT_SCHEMA})")
    return doc


def llm_compositions(doc: dict[str, Any]) -> list[tuple[str, LLMBatch]]:
    """(phase, batch) of every iteration of an llm_serve log, in order.

    A decoding sequence attends to prompt + outputs so far (the example's ``cached_tokens + 1``).
    """
    prompt = {r["id"]: int(r["prompt_tokens"]) for r in doc["requests"]}
    produced = dict.fromkeys(prompt, 0)
    out = []
    for it in doc["iterations"]:
        ids = it["request_ids"]
        if it["phase"] == "prefill":
            b = LLMBatch(prefill_tokens=tuple(prompt[i] for i in ids), prefill_cached=(0,) * len(ids))
        else:
            b = LLMBatch(decode_context=tuple(prompt[i] + produced[i] for i in ids))
        for i in ids:
            produced[i] += 1
        out.append((it["phase"], b))
    return out


def llm_durations_ms(doc: dict[str, Any]) -> list[float]:
    """Measured duration of every iteration (ms), as the server logged it."""
    return [float(it["duration_ms"]) for it in doc["iterations"]]


def dit_compositions(doc: dict[str, Any]) -> list[tuple[int, int]]:
    """(model batch, tokens) of every denoising step of a dit_serve log, in order."""
    tokens = int(doc["config"]["tokens"])
    return [(int(s["model_batch"]), tokens) for s in doc["steps"]]
