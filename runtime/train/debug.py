"""Test hooks, kept out of TrainConfig: fault injection, tensor dumps and token counts.

The tests pass a DebugConfig to the launcher's task (runtime/train/trainer.py `TrainTask`); a user's run
never has one, so the product's config holds nothing that exists for the tests.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DebugConfig:
    dump_dir: str | None = None  # write rank-local grads (step 0) and final params here
    fail_at: tuple[int, int] | None = None  # (rank, step) that raises: fault injection for launcher tests
    # (rank, step, MiB): that rank allocates and touches MiB of memory at that step and holds it (`inject_oom`)
    oom_at: tuple[int, int, int] | None = None
    count_tokens: bool = False  # record tokens per sample and phase (StepMetrics.processed)
    # (rank, step, phase): that rank stops itself (SIGSTOP) as it enters that phase of that step, a hung rank
    # for the watchdog's tests (phase names: the heartbeat's, e.g. "llm backward", "grad_sync")
    stop_at: tuple[int, int, str] | None = None

    def counter(self, leader: dict[str, bool]) -> TokenCounter:
        return TokenCounter(self.count_tokens, leader)

    def inject(self, rank: int, step: int) -> None:
        """The faults asked for at (rank, step), if any."""
        if self.fail_at == (rank, step):
            raise RuntimeError(f"injected failure at step {step}")
        if self.oom_at is not None and self.oom_at[:2] == (rank, step):
            inject_oom(self.oom_at[2])

    def at_phase(self, rank: int, step: int, phase: str) -> None:
        """The stop asked for at (rank, step, phase), if any: the process stops until SIGCONT or SIGKILL."""
        if self.stop_at == (rank, step, phase):
            import signal

            os.kill(os.getpid(), signal.SIGSTOP)


def inject_oom(mib: int, chunk_mib: int = 64, pause_s: float = 0.02) -> None:
    """Fault injection: allocate `mib` MiB the way a rank that runs out of memory does; never returns normally.

    A request larger than this machine's memory is one allocation, which the allocator refuses at once (a
    RuntimeError from torch's CPU allocator, as a CUDA out-of-memory is refused by the caching allocator): the
    in-rank path. A smaller one is touched chunk by chunk, so that a memory limit enforced from outside (Slurm's
    --mem) sees the resident size grow and kills the rank. If nothing stopped it, it raises an error that is not
    an out-of-memory, so a test expecting one fails.
    """
    import torch

    total = mib << 20
    if total > os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"):
        big = torch.empty(total, dtype=torch.uint8)  # raises: more than the machine has
        del big
        raise RuntimeError(f"fault injection: allocating {mib} MiB succeeded (memory overcommit?)")
    held = []
    while total > 0:
        n = min(chunk_mib << 20, total)
        held.append(torch.ones(n, dtype=torch.uint8))  # ones: the pages are touched, so they are resident
        total -= n
        time.sleep(pause_s)
    raise RuntimeError(f"fault injection: {mib} MiB allocated and no memory limit stopped this rank")


def write_dump(dump_dir: str, what: str, rank: int, tensors: dict[str, torch.Tensor]) -> None:
    import torch

    torch.save(tensors, Path(dump_dir) / f"{what}.rank{rank}.pt")


class TokenCounter:
    """Tokens each sample brought into each module on this rank, counted on DP leaders only (tp 0, cp 0)."""

    def __init__(self, enabled: bool, leader: dict[str, bool]) -> None:
        self.enabled = enabled
        self.leader = leader  # module -> this rank is (tp 0, cp 0) of its grid
        self.processed: dict[str, dict[int, int]] = {}

    def add(self, name: str, counts: dict[int, int]) -> None:
        if not (self.enabled and self.leader.get(name, False)):
            return
        mine = self.processed.setdefault(name, {})
        for sid, n in counts.items():
            mine[sid] = mine.get(sid, 0) + n
