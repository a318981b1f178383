"""FSDP2 for each module over its (dp, cp) ranks, as the plan says (ModulePlan.data_parallel, .sharding):
`fully_shard` (fsdp: parameters, gradients and optimizer state sharded) or FSDP2's `replicate` (whole state
on every rank, gradients all-reduced). One FSDP unit per transformer block, then the module (torchtitan's
order: TP, recompute, then data parallelism). docs/data_parallel.md has the whole story.

An fsdp module either keeps or reshards (`Sharding`):

* keep: one gather and one reduction per step, whatever the schedule. Post-balancing gives DP ranks different
  numbers of calls of a module in a step (micro-batches, encoder chunks, none at all when a rank holds no
  sample of a modality), while FSDP2's own hooks gather before every forward and reduce after every backward,
  collectives every DP rank must join equally. So each step is driven from outside, as
  torch.distributed.pipelining drives FSDP2 under a pipeline schedule: `begin()` gathers every unit's
  parameters (reshard after forward and after backward off, gradient sync off: the backward of each call
  only accumulates full-size gradients), and `finish()` runs every unit's post-backward in the same order on
  every rank (reduce-scatter or all-reduce, zeros for a parameter this rank never used), then FSDP2's final
  callback. Between steps only the shards exist.
* reshard (ZeRO-3): FSDP2's own hooks do everything: each block is gathered before its forward and freed
  after it, gathered again for its backward, and its gradients are reduce-scattered as its backward ends
  (once per micro-batch, accumulated into the fp32 shard); the next block's gather is prefetched in both
  directions. The collectives need every DP rank to make the same calls: the schedules pad a rank's
  micro-batches to the count agreed from the step's tables (runtime/train/inputs.py `InputRouter.calls`), an
  empty one running zero rows through every block. `begin()` and `finish()` leave these modules alone.

Gradients are summed, not averaged (divide factor 1): the loss is already divided by the global
label-token count. Mixed precision (`--dtype bfloat16`): fp32 masters, bf16 compute, fp32 reduction
(MixedPrecisionPolicy). Under EP the experts differ between DP ranks: FSDP2 ignores them and their
gradients go over the expert-data-parallel group as before (runtime/train/grad_sync.py).

FSDP2's private internals live in runtime/parallel/fsdp_private.py, checked on one torch version: the keep
mode's reduction (no public call runs a unit's post-backward outside autograd) and, for both modes, the root's
initialisation (FSDP2 runs it in a forward the schedules never call for an LLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from orch.planner.plan import DataParallel, Sharding
from orch.runtime.models.contract import CausalLM, block_units
from orch.runtime.parallel import fsdp_private
from orch.runtime.parallel.tensor import local_nbytes

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule


def master_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype parameters are kept in: fp32 masters under a 16-bit compute dtype, else the run's."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _policy(dtype: torch.dtype) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if master_dtype(dtype) == dtype:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


@dataclass
class ModuleShards:
    """One module's FSDP2 units (its blocks, then the module itself last)."""

    name: str
    mode: DataParallel
    sharding: Sharding = Sharding.KEEP
    units: list[FSDPModule] = field(default_factory=list)

    @property
    def root(self) -> FSDPModule:
        return self.units[-1]

    @property
    def reshards(self) -> bool:
        """Gathered per block call by FSDP2's own hooks (every DP rank must make the same calls)."""
        return self.mode == DataParallel.FSDP and self.sharding == Sharding.RESHARD


def apply_fsdp(
    module: nn.Module,
    *,
    name: str,
    mesh: DeviceMesh,
    mode: DataParallel,
    dtype: torch.dtype,
    ignored: set[nn.Parameter] | None = None,
    sharding: Sharding = Sharding.KEEP,
) -> ModuleShards:
    """Apply fully_shard (fsdp) or replicate to `module`'s blocks and then to it, over `mesh` (its (dp, cp) ranks);
    `dtype` is the compute dtype (mixed precision when it is narrower than the masters); `sharding`: an fsdp
    module's keep or reshard (ignored under replicate)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard

    policy = _policy(dtype)
    out = ModuleShards(name, mode, sharding)
    blocks = block_units(module)
    parts = llm_parts(module, blocks) if out.reshards else []
    for unit in [*blocks, *parts, module]:
        mine = {p for p in unit.parameters() if ignored and p in ignored} or None
        if mode == DataParallel.FSDP:
            again = out.reshards and unit is not module  # under reshard the blocks; the module's own unit stays
            fully_shard(unit, mesh=mesh, reshard_after_forward=again, mp_policy=policy, ignored_params=mine)
        else:
            replicate(unit, mesh=mesh, mp_policy=policy, ignored_params=mine)
        out.units.append(unit)  # type: ignore[arg-type]
    for unit in out.units:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no PREMUL_SUM); no division by 1
        unit.set_reduce_scatter_unused_params(True)  # zeros for a parameter an (empty) call did not use
    if out.reshards:
        # The module's own unit (an encoder's stem, norm and projector; what an LLM keeps outside its parts) is
        # gathered for the whole step: the schedules call an LLM through its methods, not its forward, so
        # FSDP2's hooks would never gather it. Its gradients are reduce-scattered after each backward by FSDP2's
        # final callback. An LLM's embedding, norm and head are units of their own, gathered per call.
        out.root.set_reshard_after_backward(False, recurse=False)
        units = out.units[: len(blocks)]  # the blocks: each one's gather is issued while its neighbour computes
        for unit in units:
            if any(p.requires_grad for p in unit.parameters()):  # type: ignore[attr-defined]
                unit.register_forward_pre_hook(_inputs_take_gradients, prepend=True)  # type: ignore[attr-defined]
        for prev, nxt in pairwise(units):
            prev.set_modules_to_forward_prefetch([nxt])
            nxt.set_modules_to_backward_prefetch([prev])
    fsdp_private.lazy_init(out.root)  # the root's state now, not at a first forward some rank may not run
    return out


def llm_parts(module: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """An LLM's children outside its blocks that hold parameters (embedding, final norm, head), each its own FSDP2
    unit under reshard so that one is gathered at a time, as torchtitan wraps the embedding and the output. Each
    is called once per micro-batch on every rank, empty micro-batches included (`embed_inputs` embeds the
    micro-batch's ids in one call, none or not; `text_logits` projects its rows, zero or not). None for an
    encoder (its stem may be skipped on an empty call: an audio conv on zero frames) or where two parts share
    a parameter (tied embeddings: one unit must hold it)."""
    if not isinstance(module, CausalLM):
        return []
    inside = {id(sub) for b in blocks for sub in b.modules()}
    parts = [
        c
        for c in module.children()
        if next(c.parameters(), None) is not None and not any(id(sub) in inside for sub in c.modules())
    ]
    owners: dict[int, int] = {}
    for i, c in enumerate(parts):
        for p in c.parameters():
            if owners.setdefault(id(p), i) != i:
                return []
    return parts


def _inputs_take_gradients(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A resharding block's floating-point inputs made to require gradients (a fresh leaf where they did not).

    FSDP2 reduce-scatters a block's gradients when the gradient reaches its inputs, or, where no input requires
    one, in the final callback after the whole backward: a different position in the sequence of collectives.
    A rank whose call had no trainable path into the block (an empty call the stem skips: an audio tower's conv
    on zero frames) would then reduce out of order with the others. The leaf's gradient is dropped."""
    if not torch.is_grad_enabled() or not any(_needs_leaf(a) for a in args):
        return None
    return tuple(a.detach().requires_grad_() if _needs_leaf(a) else a for a in args)


def _needs_leaf(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and not x.requires_grad


class DataParallelSteps:
    """Every served module's units. The keep modules are driven once per step: `begin()` before the first
    forward, `finish()` after the last backward, modules in name order, units in a fixed order (the same
    collectives on every rank). The reshard modules run on FSDP2's own hooks, call by call."""

    def __init__(self, shards: dict[str, ModuleShards], watch: bool = False) -> None:
        """`watch`: sample the reshard modules' gathered bytes at every block call (the CPU's peak measure)."""
        self.shards = dict(sorted(shards.items()))
        self.kept = {n: s for n, s in self.shards.items() if not s.reshards}
        self.resharded = {n: s for n, s in self.shards.items() if s.reshards}
        self.in_flight = InFlight([s.root for s in self.resharded.values()]) if watch and self.resharded else None

    def _units(self) -> list[FSDPModule]:
        return [u for s in self.kept.values() for u in s.units]

    def begin(self) -> None:
        for unit in self._units():
            unit.set_requires_gradient_sync(False, recurse=False)
            unit.set_reshard_after_backward(False, recurse=False)
            unit.set_is_last_backward(False)
        for unit in [*self._units(), *(s.root for s in self.resharded.values())]:
            unit.unshard()
        if self.in_flight is not None:
            self.in_flight.start()

    def finish(self) -> None:
        for unit in self._units():
            unit.set_requires_gradient_sync(True, recurse=False)
            unit.set_reshard_after_backward(True, recurse=False)
            unit.set_is_last_backward(True)
        for shards in self.kept.values():
            fsdp_private.reduce_gathered(shards.units)
        for shards in self.resharded.values():  # its gradients are reduced already; only the shards remain
            shards.root.reshard()

    def gathered_bytes(self) -> int:
        """Bytes of the full-size parameters and gradients the keep units hold now (between begin and finish), plus
        the most the reshard modules held gathered at once this step (when watched) and their gradient shards."""
        kept = sum(fsdp_private.gathered_bytes(unit) for unit in self._units())
        if self.in_flight is None:
            return kept
        params = (p for s in self.resharded.values() for p in s.root.parameters())  # type: ignore[attr-defined]
        grads = sum(local_nbytes(p.grad) for p in params if p.grad is not None)
        return kept + self.in_flight.peak + grads


class InFlight:
    """The most bytes resharding modules hold gathered at once in a step (parameters and their gradients), sampled
    when each block's (and an LLM part's) forward starts and when its backward starts (after FSDP2 gathered it
    and prefetched its neighbour). A gathered parameter is one the module holds in place of its shard (FSDP2
    swaps them). A unit's own gradient buffers during its backward fall between samples: on a GPU CUDA's peak
    counts them."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules
        self.shards = {id(p) for m in modules for p in m.parameters()}  # the parameters at rest: shards
        self.peak = 0
        for m in modules:
            blocks = block_units(m)
            for unit in [*blocks, *llm_parts(m, blocks)]:
                unit.register_forward_pre_hook(lambda *_: self.sample())
                unit.register_forward_hook(self._on_output)

    def start(self) -> None:
        self.peak = 0

    def sample(self) -> None:
        now = 0
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in self.shards:
                    now += local_nbytes(p) + (local_nbytes(p.grad) if p.grad is not None else 0)
        self.peak = max(self.peak, now)

    def _on_output(self, _module: nn.Module, _args: Any, out: Any) -> None:
        # a tensor hook runs after FSDP2's own on the same output (its pre-backward: gather, prefetch)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: self.sample())
