"""Stop requests: a checkpoint at Slurm's warning signal or at a signal to the local launcher, as an object each
rank holds (no module state).

The signal handler only calls `request`, which sets one attribute: no lock, no collective, no I/O. A lock would
deadlock: Python runs a handler between two bytecodes of the main thread, a second signal's handler inside the
first one's too, and a Ctrl-C reaches a rank together with the launcher's forwarded SIGUSR1 (a threading.Event
took its lock in `set`, and the nested `set` waited on it forever, the rank hung in the middle of its step or
save while its peers waited for it). At each step boundary the ranks agree on it with one all_reduce(MAX) of
one integer, so a signal delivered to any subset of the ranks stops all of them at the same step, where they
save collectively. Slurm's tasks and the local launcher's and torchrun's ranks arm it; an unarmed Preemption
(the tests' direct calls) answers False without a collective. Every rank of a job must arm it, or none.
"""

from __future__ import annotations

import signal

# What a rank (and the local launcher) takes as a stop request: a scheduler's or container's stop (SIGTERM, to the
# whole process group under systemd or `kill -TERM -PGID`), a terminal's Ctrl-C (SIGINT, to the foreground group),
# the local launcher's forwarded request (SIGUSR1).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Preemption:
    def __init__(self, *, armed: bool = False) -> None:
        self.armed = armed
        self._requested = False  # set by a signal handler: a plain attribute (see the module docstring)
        self.stopped_at: int | None = None  # the step whose checkpoint the ranks saved before stopping

    @property
    def requested(self) -> bool:
        """Whether this rank was asked to stop (not yet agreed with the others)."""
        return self._requested

    def request(self, *_: object) -> None:
        """A signal handler: ask the ranks to checkpoint and stop at the next step boundary."""
        self._requested = True

    def agreed(self) -> bool:
        """Collective when armed: True on every rank iff some rank's stop was requested."""
        if not self.armed:
            return False
        import torch
        import torch.distributed as dist

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if self._requested else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def mark_stopped(self, step: int) -> None:
        self.stopped_at = step


def take_stop_signals(stop: Preemption) -> None:
    """Make each of STOP_SIGNALS a stop request of `stop` in this process (a rank), instead of its death or a
    KeyboardInterrupt raised wherever the rank is (inside a collective of a save, its peers left waiting)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop.request)
        signal.siginterrupt(signum, False)  # a system call the signal lands in is restarted, not failed
