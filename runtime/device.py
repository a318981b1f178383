"""Where a rank computes: CUDA with NCCL (one GPU per local rank) or the CPU with gloo.

`TrainConfig.device` is "auto", "cpu" or "cuda". "auto" picks CUDA when torch sees enough GPUs for
every local rank of the machine (`cuda:{local_rank}`), else the CPU, so the same plan runs on a
laptop and on a GPU node. Two steps:

* `device_kind` (pure, no CUDA initialisation): "auto" | "cpu" | "cuda" -> "cpu" | "cuda" for a
  machine with `local_ranks` ranks. The local launcher calls it before starting processes, so
  every rank agrees and `--device cuda` without CUDA is one clear error, not N failing ranks.
* `rank_device`: in the rank, the same decision for its local rank, and `torch.cuda.set_device`
  for CUDA (NCCL, `all_gather_object` and DeviceMesh use the current device).

The device is passed explicitly from there (TrainStep.device, PipelineStage, CPGroup,
PostBalancer); nothing reads a global.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orch.planner.errors import OrchError

DEVICES = ("auto", "cpu", "cuda")


class DeviceError(OrchError):
    """A device that cannot be had here (unknown name, no CUDA, too few GPUs): one line."""


@dataclass(frozen=True)
class DeviceConfig:
    """One rank's device and the process-group backend that goes with it."""

    device: torch.device
    backend: str  # "nccl" with CUDA, "gloo" on the CPU

    @property
    def type(self) -> str:
        return self.device.type


def _cuda_count() -> int:
    """GPUs torch can use here (0 without CUDA); does not initialise a CUDA context."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_kind(requested: str, local_ranks: int) -> str:
    """ "cpu" or "cuda" for a machine running `local_ranks` ranks; DeviceError if `requested` cannot be had."""
    if requested not in DEVICES:
        raise DeviceError(f"expected one of {', '.join(DEVICES)}, got '{requested}'")
    if requested == "cpu":
        return "cpu"
    count = _cuda_count()
    if requested == "auto":
        return "cuda" if count >= max(1, local_ranks) else "cpu"
    if count == 0:
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise DeviceError(f"cuda: CUDA is not available here (torch {torch.__version__}, {build}); use cpu or auto")
    if count < local_ranks:
        raise DeviceError(f"cuda: {local_ranks} local ranks need one GPU each, this machine has {count}")
    return "cuda"


def rank_device(requested: str, local_rank: int, local_ranks: int) -> DeviceConfig:
    """This rank's device and backend; sets the current CUDA device to `cuda:{local_rank}`."""
    if not 0 <= local_rank < max(1, local_ranks):
        raise DeviceError(f"local rank {local_rank} of {local_ranks}")
    if device_kind(requested, local_ranks) == "cpu":
        return DeviceConfig(torch.device("cpu"), "gloo")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return DeviceConfig(device, "nccl")


__all__ = ["DEVICES", "DeviceConfig", "DeviceError", "device_kind", "rank_device"]
