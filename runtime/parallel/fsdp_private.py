"""The FSDP2 internals orch still needs, in one place, checked on torch 2.13 (`CHECKED_ON`).

The keep mode (runtime/parallel/fsdp.py) gathers every unit once and accumulates full-size gradients with
gradient sync off, so that DP ranks may make different numbers of calls; at the step's end it must run each
unit's post-backward (the reduction) outside autograd, which no public call does (`reduce_gathered`,
`gathered_bytes`). Both modes need the root's initialisation up front (`lazy_init`): FSDP2 runs it in the
root's pre-forward, and the schedules call an LLM through its methods, never its forward (a keep rank may
also run no call at all); the reshard mode needs nothing else private. tests/unit/test_fsdp_private.py
fails when the torch version or these attributes change: check this file against the new FSDP2 before
updating it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orch.runtime.parallel.tensor import local_nbytes

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

CHECKED_ON = "2.13"  # the torch minor version these internals were read on
# What is read of FSDP2's private state: FSDPState and its FSDPParamGroups / FSDPParams.
STATE_ATTRS = ("_lazy_init", "_fsdp_param_groups", "_root_post_backward_final_callback")
GROUP_ATTRS = ("post_backward", "is_unsharded", "fsdp_params")
PARAM_ATTRS = ("unsharded_param", "unsharded_accumulated_grad")


def _state(unit: FSDPModule) -> Any:
    return unit._get_fsdp_state()  # type: ignore[attr-defined]


def lazy_init(root: FSDPModule) -> None:
    """FSDP2's root initialisation now (it otherwise runs in the root's forward, which the schedules never call
    for an LLM and a keep rank may not call at all)."""
    _state(root)._lazy_init()


def reduce_gathered(units: list[FSDPModule]) -> None:
    """Every unit's post-backward (reduce-scatter or all-reduce of its accumulated full-size gradients, zeros for
    a parameter never used), blocks last-first and the root's own last, then the root's final callback."""
    for unit in reversed(units):
        for group in _state(unit)._fsdp_param_groups:
            group.post_backward()
    _state(units[-1])._root_post_backward_final_callback()


def gathered_bytes(unit: FSDPModule) -> int:
    """Bytes of the full-size parameters and gradients `unit` holds now (0 when resharded)."""
    total = 0
    for group in _state(unit)._fsdp_param_groups:
        for fp in group.fsdp_params:
            if group.is_unsharded and hasattr(fp, "_unsharded_param"):
                p = fp.unsharded_param
                grad = fp.unsharded_accumulated_grad if fp.unsharded_accumulated_grad is not None else p.grad
                total += sum(local_nbytes(t) for t in ((p, grad) if grad is not None else (p,)))
    return total
