"""CPU time the hypervisor gave to other guests ("steal", /proc/stat): the one sign, inside a virtual
machine, that the host was busier while a figure was timed than it will be when the run is.

A profile pass timed under steal measures a slower machine than the one the plan then runs on; the
profile repeats such a pass (runtime/profile/bench.py) and records the share it kept. On bare metal and
on GPUs the share stays 0; where /proc/stat is missing (not Linux) it is unknown (None).
"""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")


def cpu_jiffies(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """(steal, total) CPU jiffies of all CPUs since boot, or None where the kernel does not say."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 9:
        return None
    fields = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
    return fields[7], sum(fields)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Share of the CPU time between two `cpu_jiffies` readings that was stolen (0..1); None if unknown."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return max(0, after[0] - before[0]) / (after[1] - before[1])
