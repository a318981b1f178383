"""Checkpoints of a run: every module's parameters and optimizer state, with torch.distributed.checkpoint.

Layout under the workdir: checkpoints/step_{k:08d} holds the state after k completed steps;
checkpoints/latest names the newest complete one. A checkpoint is written into
step_{k:08d}.tmp by every rank (dcp.save), and only after a barrier does rank 0 rename it and
rewrite `latest` atomically, so a directory ending in .tmp, or one `latest` does not name, is
never loaded. Optimizer state is keyed by module and parameter name (not the optimizer's
parameter index, which differs between ranks serving different modules), so dcp can dedup
replicas and reshard DTensors by name.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orch.planner.io import write_text_atomic

LATEST = "latest"


def checkpoint_root(workdir: str | Path) -> Path:
    return Path(workdir) / "checkpoints"


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def latest_step(workdir: str | Path) -> int | None:
    """Completed steps of the newest complete checkpoint, or None (no `latest`, or it names nothing valid)."""
    root = checkpoint_root(workdir)
    try:
        name = (root / LATEST).read_text().strip()
    except FileNotFoundError:
        return None
    if not name.startswith("step_") or name.endswith(".tmp") or not name[5:].isdigit():
        return None
    if not (root / name).is_dir():
        return None
    return int(name[5:])


def _state(modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """{module: {"model": state_dict, "optim": {param name: {state key: tensor}}}} of this rank's modules."""
    out: dict[str, Any] = {}
    for name, module in modules.items():
        optim: dict[str, dict[str, Any]] = {}
        if optimizer is not None:
            for pname, p in module.named_parameters():
                st = optimizer.state.get(p, {})
                kept = {k: v for k, v in st.items() if v is not None}
                if kept:
                    optim[pname] = kept
        out[name] = {"model": module.state_dict(), "optim": optim}
    return out


def save(
    workdir: str | Path,
    step: int,
    modules: dict[str, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    files: dict[str, str] | None = None,
) -> None:
    """Collective: every rank writes its share, then rank 0 publishes step_{step} as the latest, with `files`
    (name -> text: the training config) beside the tensors."""
    root = checkpoint_root(workdir)
    final = root / step_name(step)
    tmp = root / f"{step_name(step)}.tmp"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of an interrupted save
        tmp.mkdir(parents=True)
    dist.barrier()
    import torch.distributed.checkpoint as dcp  # lazy: importing it at worker start changes how a dying peer's
    # gloo errors surface on the others, and the failure report must name the rank that failed first

    dcp.save(_state(modules, optimizer), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)  # inside .tmp: published with the tensors by the rename
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        write_text_atomic(root / LATEST, step_name(step) + "\n")
    dist.barrier()


def load(
    workdir: str | Path, step: int, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None
) -> None:
    """Collective: load step_{step} into the freshly built modules and optimizer, in place."""
    if optimizer is not None:
        _init_optimizer_state(optimizer)
    state = _state(modules, optimizer)
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=str(checkpoint_root(workdir) / step_name(step)))
    for name, module in modules.items():
        module.load_state_dict(state[name]["model"])


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's lazily built state (a zero-lr step on zero grads) so dcp can load into it."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optimizer)
