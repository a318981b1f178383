"""The `orch` command line as the closed-loop benchmarks call it (bench_validate, bench_sweep)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ORCH = str(Path(sys.executable).with_name("orch"))


class OrchFailed(RuntimeError):
    """An `orch` command exited non-zero; the message holds the command and the end of its stderr."""


def run_orch(*args: str) -> str:
    """Run `orch ARGS` from this venv; its stdout, or OrchFailed."""
    res = subprocess.run([ORCH, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise OrchFailed(f"orch {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    return res.stdout
