"""What a training run is asked to do (TrainConfig), apart from what the tests inject (train/debug.py).

A frozen value, pickled to every rank by the launchers; torch is imported only by `torch_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orch.planner.balance.mode import Mode

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float64")
ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}  # bytes per element of each of DTYPES


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of one of DTYPES (torch imported here, not at import)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


DEFAULT_BALANCE = Mode.ORCH  # the one default of post-balancing, for the CLI and the API alike


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1
    seed: int = 0
    dtype: str = "float32"  # one of DTYPES
    optimizer: str = "sgd"
    lr: float = 0.1
    # runtime/train/optim.py: AdamW's settings, the learning-rate schedule, the global-norm clip
    weight_decay: float = 0.1  # AdamW, on matrices and embeddings only
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    lr_schedule: str = "constant"  # one of optim.SCHEDULES, after `warmup_steps` of linear warmup
    warmup_steps: int = 0
    min_lr: float = 0.0  # where linear and cosine decay end, at the last step
    clip_norm: float = 0.0  # clip the global gradient norm to this (0: no clipping)
    module_lr: tuple[tuple[str, float], ...] = ()  # (module, factor on lr)
    trace: str | None = None  # write a Chrome trace of the measured phases here (runtime/train/trace.py)
    checkpoint_every: int = 0  # save a checkpoint every this many steps (0: never; runtime/checkpoint.py)
    resume: bool = True  # continue from the newest complete checkpoint of the workdir, if any
    balance: Mode = DEFAULT_BALANCE  # post-balancing (runtime/train/orchestrator.py)
    # time the modules at startup for the dispatcher's cost model (orchestrator.calibrate_module);
    # None: when balancing (a `none` run's cost statistics then use the FLOP model alone)
    calibrate: bool | None = None
    # "three_phase" runs a disaggregated plan's islands one after the other instead of its graph-aware
    # 1F1B (benchmarks compare the two); None: the plan's schedule
    schedule: str | None = None
    model_factory: str | None = None  # "package.module:function" building the modules (runtime/models/factory.py)
    # "auto" | "cpu" | "cuda": where the ranks compute (runtime/device.py; launchers resolve "auto" before starting)
    device: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "balance", Mode(self.balance))

    @property
    def calibrates(self) -> bool:
        return self.calibrate if self.calibrate is not None else self.balance != Mode.NONE

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)
