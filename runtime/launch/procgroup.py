"""Starting a rank's process group: one place for the port, the backend and the timeout."""

from __future__ import annotations

import signal
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def free_port() -> int:
    """A TCP port free on this machine now, for a rendezvous on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_rank(
    rank: int,
    world: int,
    *,
    master: str,
    port: int,
    timeout_s: float,
    init_method: str | None = None,
    backend: str = "gloo",
    device: torch.device | None = None,
) -> None:
    """Join the world group with a timeout, so a rank blocked on a dead peer cannot hang forever.

    `backend`: "gloo" (CPU tensors) or "nccl" (CUDA tensors; `device` is then this rank's GPU,
    already the current device: runtime/device.py `rank_device` gives both). `init_method`: None is
    tcp://master:port with rank 0 hosting the store; "env://" reads MASTER_ADDR/PORT and joins torchrun's
    agent store when it offers one (runtime/launch/rank.py `RankEnv.from_torch_env`). One thread per
    rank: ranks share this machine's cores, as they do in `orch launch`.
    """
    import torch
    import torch.distributed as dist

    from orch.runtime.host_memory import keep_freed_memory

    torch.set_num_threads(1)
    if backend == "gloo":  # the rank computes on the CPU: reuse freed activations' pages (host_memory.py)
        keep_freed_memory()
    # A stop request (runtime/preemption.py) arriving while the rendezvous connects would interrupt its connect and
    # make torch print a C++ stack before it retries: held until the group is up, then handled as usual. Threads
    # started meanwhile (the backend's) keep them blocked, so they reach the main thread, where Python runs handlers.
    held = {signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2}
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN):
        held.add(signal.SIGTERM)  # a stop request too (torchrun's ranks); untouched where it still ends a rank
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        dist.init_process_group(
            backend,
            init_method=init_method or f"tcp://{master}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
            # NCCL: bound to this rank's GPU now (barriers and new_group then need no guess of the device).
            device_id=device if backend == "nccl" else None,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
