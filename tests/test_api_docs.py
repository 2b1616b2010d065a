"""Every ```python block of docs/api.md, run in order in one namespace (as a notebook would), in a
temporary folder that holds a link to sample_traces/."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_api_doc_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 8
    (tmp_path / "sample_traces").symlink_to(ROOT / "sample_traces")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{DOC}:block{i + 1}", "exec"), namespace)  # noqa: S102 - our own documentation
        except Exception as exc:  # pragma: no cover - the message names the block
            raise AssertionError(f"docs/api.md python block {i + 1} failed: {exc!r}\n{code}") from exc
    out = capsys.readouterr().out
    assert "linear 2x:" in out and "measured speedup" in out
    assert (tmp_path / "whatif-report" / "report.html").is_file()
