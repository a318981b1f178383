"""Checkpoints of a run: every module's parameters and optimizer state, with torch.distributed.checkpoint.

Layout under the workdir: checkpoints/step_{k:08d} holds the state after k completed steps;
checkpoints/latest names the newest complete one. A checkpoint is written into
step_{k:08d}.tmp by every rank (dcp.save); each rank then hashes the shards it wrote, and rank 0 writes
manifest.json (what the checkpoint belongs to and every file's size and sha256:
runtime/workdir/checkpoint_manifest.py) before it renames the folder and rewrites `latest` atomically, so a
directory ending in .tmp is never loaded and a published one always carries its manifest. Which one a run
resumes from is the newest that verifies (runtime/workdir/run_dir.py `choose_checkpoint`). Optimizer state is
keyed by module and parameter name (not the optimizer's parameter index, which differs between ranks
serving different modules), so dcp can dedup replicas and reshard DTensors by name. A full disk during a
save is one line naming the folder and the bytes a checkpoint needs (runtime/workdir/disk.py); the partial .tmp is
removed. Loading reads DCP's pickled `.metadata` through an unpickler that allows only its own names
(runtime/workdir/checkpoint_metadata.py): a checkpoint folder is data, never code.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orch.planner.io import write_text_atomic
from orch.runtime.workdir.checkpoint_manifest import MANIFEST, FileSum, Manifest, file_sum
from orch.runtime.workdir.disk import no_space_guard
from orch.runtime.workdir.run_dir import LATEST, checkpoint_root, prune_checkpoints, step_name

__all__ = ["LATEST", "checkpoint_root", "load", "save", "step_name"]


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
    belongs: dict[str, Any] | None = None,
    needs_bytes: int = 0,
    keep: int = 0,
) -> None:
    """Collective: every rank writes its share, then rank 0 publishes step_{step} as the latest, with `files`
    (name -> text: the training config) beside the tensors and the manifest (`belongs`: its fields other than
    step and files). `needs_bytes`: what a full disk's line says a checkpoint needs. `keep`: the newest
    checkpoints kept once this one is published (0: all; run_dir.prune_checkpoints)."""
    root = checkpoint_root(workdir)
    final = root / step_name(step)
    tmp = root / f"{step_name(step)}.tmp"
    rank = dist.get_rank()

    def discard() -> None:  # a .tmp is never loaded; its space is the disk's again before the line says what is free
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)

    with no_space_guard(root, needs_bytes, "a checkpoint", cleanup=discard):
        _write(tmp, rank, modules, optimizer, files or {}, {"step": step, **(belongs or {})})
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        write_text_atomic(root / LATEST, step_name(step) + "\n")
        prune_checkpoints(workdir, keep)
    dist.barrier()


def _write(
    tmp: Path,
    rank: int,
    modules: dict[str, nn.Module],
    optimizer: torch.optim.Optimizer | None,
    files: dict[str, str],
    belongs: dict[str, Any],
) -> None:
    """Every rank's shards into `tmp`, then rank 0's manifest of every file (each rank hashes its own shards)."""
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of an interrupted save
        tmp.mkdir(parents=True)
    dist.barrier()
    import torch.distributed.checkpoint as dcp  # lazy: importing it at worker start changes how a dying peer's
    # gloo errors surface on the others, and the failure report must name the rank that failed first

    dcp.save(_state(modules, optimizer), checkpoint_id=str(tmp))
    mine = {p.name: file_sum(p) for p in sorted(tmp.glob(f"__{rank}_*.distcp"))}  # FileSystemWriter's names
    everyone: list[dict[str, FileSum]] | None = [{} for _ in range(dist.get_world_size())] if rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if rank == 0:
        assert everyone is not None
        for name, text in files.items():
            write_text_atomic(tmp / name, text)  # inside .tmp: published with the tensors by the rename
        sums = {name: s for per_rank in everyone for name, s in per_rank.items()}
        for p in sorted(tmp.iterdir()):  # .metadata, the files above, and any shard a rank did not claim
            if p.is_file() and p.name not in sums and p.name != MANIFEST:
                sums[p.name] = file_sum(p)
        manifest = Manifest.model_validate({**belongs, "files": sums})
        write_text_atomic(tmp / MANIFEST, manifest.model_dump_json(indent=1) + "\n")
    dist.barrier()


def load(
    workdir: str | Path, step: int, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None
) -> None:
    """Collective: load step_{step} into the freshly built modules and optimizer, in place."""
    if optimizer is not None:
        _init_optimizer_state(optimizer)
    state = _state(modules, optimizer)
    import torch.distributed.checkpoint as dcp

    from orch.runtime.workdir.checkpoint_metadata import load_planner, reader

    folder = checkpoint_root(workdir) / step_name(step)
    dcp.load(state, storage_reader=reader(folder), planner=load_planner())  # nothing in the folder runs code
    for name, module in modules.items():
        module.load_state_dict(state[name]["model"])


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's lazily built state (a zero-lr step on zero grads) so dcp can load into it."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optimizer)
