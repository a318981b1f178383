"""A rank's memory in a step: its training state (parameters, gradients, optimizer state) and its peak.

State bytes are counted exactly, from the local parts of every tensor the rank holds (a TP or FSDP
shard's own rows, not the full tensor), after the step: what a rank holds between steps. The peak: on a
GPU `torch.cuda.max_memory_allocated` over the step; on the CPU the sum of what is alive at the end of
the last backward: the parameter shards and the optimizer state, the full-size parameters and gradients
FSDP2 gathered for the step (runtime/parallel/fsdp.py; under reshard the gradient shards and the most
bytes gathered at once, sampled at each block call: `fsdp.InFlight`), and the largest amount of activation memory
autograd held for backward at any moment, tracked with saved-tensor hooks over the step's forwards and
backwards (each storage counted once, released when backward takes it; parameters, already counted,
left out). The CPU figure leaves out transient buffers freed inside one op, which a caching
allocator's peak includes: it is a lower bound of the process's own peak.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from orch.runtime.parallel.tensor import local_nbytes, local_part


def state_parts(modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes of the parameters, gradients and optimizer state this rank holds."""
    seen: set[int] = set()
    parts = {"params": 0, "grads": 0, "optimizer": 0}
    for module in modules.values():
        for p in module.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            parts["params"] += local_nbytes(p)
            if p.grad is not None:
                parts["grads"] += local_nbytes(p.grad)
            if optimizer is not None:
                state = optimizer.state.get(p, {}).values()
                parts["optimizer"] += sum(local_nbytes(v) for v in state if isinstance(v, torch.Tensor))
    return parts


def state_bytes(modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None) -> int:
    """Parameters, gradients and optimizer state this rank holds, in bytes."""
    return sum(state_parts(modules, optimizer).values())


def parameter_storages(modules: dict[str, nn.Module]) -> set[tuple[Any, int]]:
    """The storages of the parameters the modules hold now (the gathered ones during a step)."""
    out = set()
    for module in modules.values():
        for p in module.parameters():
            local = local_part(p)
            out.add((local.device, local.untyped_storage().data_ptr()))
    return out


class ActivationMeter:
    """The most bytes of saved activations alive at once while `tracking()` is entered."""

    def __init__(self, exclude: set[tuple[Any, int]] | None = None) -> None:
        self.exclude = exclude or set()  # parameters' storages: counted as state, not as activations
        self.live: dict[Any, int] = {}  # storage -> bytes, while some saved tensor of it waits for backward
        self.uses: dict[Any, int] = {}
        self.current = 0
        self.peak = 0

    def _pack(self, t: torch.Tensor) -> tuple[Any, torch.Tensor]:
        local = local_part(t)
        key = (local.device, local.untyped_storage().data_ptr())
        if key in self.exclude:
            return None, t
        if key not in self.live:
            self.live[key] = local.untyped_storage().nbytes()
            self.current += self.live[key]
            self.peak = max(self.peak, self.current)
        self.uses[key] = self.uses.get(key, 0) + 1
        return key, t

    def _unpack(self, packed: tuple[Any, torch.Tensor]) -> torch.Tensor:
        key, t = packed
        if key is None:
            return t
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
def measured_step(device: torch.device, parameters: set[tuple[Any, int]] | None = None) -> Iterator[ActivationMeter]:
    """Around one step: resets the CUDA peak, tracks saved activations on the CPU (not `parameters`' storages)."""
    meter = ActivationMeter(parameters)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield meter
        return
    with meter.tracking():
        yield meter


def peak_bytes(device: torch.device, meter: ActivationMeter, state: dict[str, int], gathered: int) -> int:
    """The step's peak: CUDA's own, or on the CPU what is alive at the end of the last backward (the shards of
    the parameters and the optimizer state from the last step, the gathered parameters and full-size
    gradients) plus the activations' peak (`state`: state_parts after the step)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return state["params"] + state["optimizer"] + gathered + meter.peak
