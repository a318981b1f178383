"""How `orch profile` times a call on one rank: windows of many calls, agreed call counts, activation bytes.

One call of a tiny block is well under a scheduler time slice: where ranks share cores, a lone call
either runs undisturbed or waits a whole slice, and its median is neither. A window of many calls
sees the share of the core a rank really gets, as a training step does. Every rank of a case calls
equally often (the largest count over the group), since the calls may be collectives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orch.runtime.profile.fit import median

MIN_WINDOW_S = 0.02  # a timed window spans several scheduler slices
MAX_CALLS = 64


@dataclass(frozen=True)
class Timer:
    """Times calls on this rank's `device` over `reps` windows (torch is imported by the methods)."""

    reps: int
    device: Any  # torch.device

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA runs asynchronously; the CPU has nothing to wait for)."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize()

    def time(self, fn: Callable[[], object], group: Any = None) -> float:
        """Median seconds of one call of `fn` over `reps` windows of at least MIN_WINDOW_S each; every rank
        of `group` (default: the world) calls it equally often."""
        fn()  # warm-up: allocator, autograd graph, DTensor dispatch caches
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        one = time.perf_counter() - t
        calls = int(self.agree_max(max(1, min(MAX_CALLS, math.ceil(MIN_WINDOW_S / max(one, 1e-9)))), group))
        times = []
        for _ in range(self.reps):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            self.sync()
            times.append((time.perf_counter() - t) / calls)
        return median(times)

    def agree_max(self, value: float, group: Any = None) -> float:
        """The largest `value` over the group (default: every rank), on every rank of it."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return float(t.item())

    def peak_bytes(self, fn: Callable[[], object]) -> int:
        """Activation bytes of one forward: the allocator's peak on CUDA, the saved tensors' sizes on CPU."""
        import torch

        if self.device.type != "cuda":
            return _saved_bytes(fn)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del out
        return int(peak)


def _saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes autograd keeps for backward during one forward (the CPU stand-in for the allocator's peak)."""
    import torch

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        local = getattr(t, "_local_tensor", t)  # a DTensor's shard is what this rank holds
        try:
            st = local.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        except RuntimeError:  # no real storage (views of wrapper subclasses): count the tensor itself
            seen[id(t)] = local.numel() * local.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


__all__ = ["Timer"]
