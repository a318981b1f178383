"""Start-up time of orch's light commands, interleaved so the machine's load hits each alike.

    python bench/bench_startup.py [--reps 15] [--orch PATH ...]

Each `--orch` is an `orch` executable (default: the one beside this Python), e.g. another checkout's
venv, to compare two versions in one run. Prints the median seconds of `orch --help`, `orch status`,
`orch logs` and `orch cancel` (of a job with no record: the command's whole start-up and its one-line
error) and the ratio to `orch --help` of the same executable, and writes bench/out/startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "--help": ["--help"],
    "status": ["status", "999999"],
    "logs": ["logs", "999999"],
    "cancel": ["cancel", "999999"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--orch", action="append", default=None)
    args = parser.parse_args()
    exes = args.orch or [str(Path(sys.executable).with_name("orch"))]
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "ORCH_STATE_DIR": state}
        for _ in range(args.reps):
            for exe in exes:
                for name, argv in COMMANDS.items():
                    t = time.perf_counter()
                    subprocess.run([exe, *argv], capture_output=True, env=env, check=False)
                    times.setdefault((exe, name), []).append(time.perf_counter() - t)
    rows = []
    print(f"{'orch':<40} {'command':<8} {'median s':>9} {'x --help':>9}")
    for exe in exes:
        help_s = statistics.median(times[(exe, "--help")])
        for name in COMMANDS:
            med = statistics.median(times[(exe, name)])
            rows.append({"orch": exe, "command": name, "median_s": med, "ratio_to_help": med / help_s})
            print(f"{exe[-40:]:<40} {name:<8} {med:>9.3f} {med / help_s:>9.2f}")
    out = Path(__file__).parent / "out" / "startup.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"reps": args.reps, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
