"""Build a model with parameters on the meta device and buffers real, then give it storage on a device.

Parameters on meta cost nothing, so every rank can build a whole Hugging Face model from its config,
keep its pipeline stage and shard it (TP on meta, as torchtitan does), and only then allocate its own
share. Buffers (rotary frequencies, position ids) are computed in `__init__` and are not saved in
checkpoints, so they are built for real and carried over.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def meta_parameters() -> Iterator[None]:
    """Inside: every parameter a module registers is moved to the meta device (buffers stay real)."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        p = module._parameters.get(name)
        if p is not None and p.device.type != "meta":
            module._parameters[name] = nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def materialize(module: nn.Module, device: torch.device) -> None:
    """Give every meta parameter (DTensors included) uninitialised storage on `device`, tied ones still
    tied; buffers move there."""
    buffers = {
        (id(owner), bname): buf
        for owner in module.modules()
        for bname, buf in owner._buffers.items()
        if buf is not None
    }
    # to_empty gives every module its own new tensor, which would untie a weight shared by two modules
    # (tie_word_embeddings): the sharing is recorded before and restored after.
    shared: dict[int, list[tuple[nn.Module, str]]] = {}
    for owner in module.modules():
        for pname, p in owner._parameters.items():
            if p is not None:
                shared.setdefault(id(p), []).append((owner, pname))
    module.to_empty(device=device)
    for places in shared.values():
        first_owner, first_name = places[0]
        for owner, pname in places[1:]:
            owner._parameters[pname] = first_owner._parameters[first_name]
    for owner in module.modules():
        for bname in list(owner._buffers):
            kept = buffers.get((id(owner), bname))
            if kept is not None:
                owner._buffers[bname] = kept.to(device)
