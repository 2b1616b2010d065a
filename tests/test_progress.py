"""The live status line of long commands (issue 16): shown on a terminal, absent in pipes and CI
logs and with -q, so machine output stays clean."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from whatif.commands._progress import working

PROGRAM = ("import time; from whatif.commands._progress import working\n"
           "with working('whatif analyze: reading t.json') as status:\n"
           "    time.sleep(0.4); status('whatif predict: fuse'); time.sleep(0.4)\n"
           "print('done')\n")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal (POSIX)")
def test_a_terminal_sees_the_status_and_its_updates() -> None:
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "100"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(30)
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "whatif analyze: reading t.json" in text and "whatif predict: fuse" in text and "done" in text


def test_nothing_is_written_off_a_terminal_or_when_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    for quiet in (False, True):
        with working("whatif analyze: reading", quiet=quiet) as status:
            status("whatif predict: x")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
