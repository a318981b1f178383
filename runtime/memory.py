"""A rank's memory in a step: its training state (parameters, gradients, optimizer state) and its peak.

State bytes are counted exactly, from the local parts of every tensor the rank holds (a TP shard's own
rows, not the full tensor). The peak: on a GPU `torch.cuda.max_memory_allocated` over the step; on the
CPU the state plus the largest amount of activation memory autograd held for backward at any moment,
tracked with saved-tensor hooks over the step's forwards and backwards (each storage counted once,
released when backward takes it). The CPU figure leaves out transient buffers freed inside one op, which
a caching allocator's peak includes: it is a lower bound of the process's own peak.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from orch.runtime.parallel.tensor import local_part


def _nbytes(t: torch.Tensor) -> int:
    local = local_part(t)
    return local.numel() * local.element_size()


def state_bytes(modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None) -> int:
    """Parameters, gradients and optimizer state this rank holds, in bytes."""
    seen: set[int] = set()
    total = 0
    for module in modules.values():
        for p in module.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += _nbytes(p)
            if p.grad is not None:
                total += _nbytes(p.grad)
            if optimizer is not None:
                total += sum(_nbytes(v) for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor))
    return total


class ActivationMeter:
    """The most bytes of saved activations alive at once while `tracking()` is entered."""

    def __init__(self) -> None:
        self.live: dict[Any, int] = {}  # storage -> bytes, while some saved tensor of it waits for backward
        self.uses: dict[Any, int] = {}
        self.current = 0
        self.peak = 0

    def _pack(self, t: torch.Tensor) -> tuple[Any, torch.Tensor]:
        local = local_part(t)
        key = (local.device, local.untyped_storage().data_ptr())
        if key not in self.live:
            self.live[key] = local.untyped_storage().nbytes()
            self.current += self.live[key]
            self.peak = max(self.peak, self.current)
        self.uses[key] = self.uses.get(key, 0) + 1
        return key, t

    def _unpack(self, packed: tuple[Any, torch.Tensor]) -> torch.Tensor:
        key, t = packed
        self.uses[key] -= 1
        if self.uses[key] == 0:
            self.current -= self.live.pop(key)
            del self.uses[key]
        return t

    @contextmanager
    def tracking(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield


@contextmanager
def measured_step(device: torch.device) -> Iterator[ActivationMeter]:
    """Around one step: resets the CUDA peak, tracks saved activations on the CPU."""
    meter = ActivationMeter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield meter
        return
    with meter.tracking():
        yield meter


def peak_bytes(device: torch.device, meter: ActivationMeter, state: int) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return state + meter.peak
