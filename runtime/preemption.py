"""Stop requests: a checkpoint at Slurm's warning signal or at a signal to the local launcher, as an object each
rank holds (no module state).

The signal handler only calls `request` (sets an Event: no collectives, no I/O); at each step boundary the
ranks agree on it with one all_reduce(MAX) of one integer, so a signal delivered to any subset of the ranks
stops all of them at the same step, where they save collectively. Slurm's tasks and the local launcher's ranks
arm it; an unarmed Preemption (torchrun's ranks, the tests' direct calls) answers False without a collective.
Every rank of a job must arm it, or none.
"""

from __future__ import annotations

import threading


class Preemption:
    def __init__(self, *, armed: bool = False) -> None:
        self.armed = armed
        self._requested = threading.Event()
        self.stopped_at: int | None = None  # the step whose checkpoint the ranks saved before stopping

    def request(self, *_: object) -> None:
        """A signal handler: ask the ranks to checkpoint and stop at the next step boundary."""
        self._requested.set()

    def agreed(self) -> bool:
        """Collective when armed: True on every rank iff some rank's stop was requested."""
        if not self.armed:
            return False
        import torch
        import torch.distributed as dist

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if self._requested.is_set() else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def mark_stopped(self, step: int) -> None:
        self.stopped_at = step
