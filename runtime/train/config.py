"""What a training run is asked to do (TrainConfig), apart from what the tests inject (train/debug.py).

A frozen value, pickled to every rank by the launchers; torch is imported only by `torch_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    # a fixed dataset of this many global batches, seen again and again (0: every step's batch is new)
    repeat_every: int = 0
    trace: str | None = None  # write a Chrome trace of the measured phases here (runtime/train/trace.py)
    checkpoint_every: int = 0  # save a checkpoint every this many steps (0: never; runtime/checkpoint.py)
    resume: bool = True  # continue from the newest complete checkpoint of the workdir, if any
    balance: Mode = DEFAULT_BALANCE  # post-balancing (runtime/train/orchestrator.py)
    # time the modules at startup for the dispatcher's cost model (orchestrator.calibrate_module), those
    # whose plan carries no profiled cost (ModulePlan.sample_cost); None: when balancing (a `none` run's
    # cost statistics then use the plan's costs or the FLOP model)
    calibrate: bool | None = None
    # "three_phase" runs a disaggregated plan's islands one after the other instead of its graph-aware
    # 1F1B (benchmarks compare the two); None: the plan's schedule
    schedule: str | None = None
    model_factory: str | None = None  # "package.module:function" building the modules (runtime/models/factory.py)
    # "auto" | "cpu" | "cuda": where the ranks compute (runtime/device.py; launchers resolve "auto" before starting)
    device: str = "auto"
    # where a balanced step's inputs are built: "destination" (each rank loads the samples the dispatcher gave
    # it: nothing moves), "origin" (at their initial DP index, then moved); "auto": destination with a data file
    load: str = "auto"
    loader_workers: int = 0  # with a data file: processes decoding the next step's media (0: one thread)

    def __post_init__(self) -> None:
        object.__setattr__(self, "balance", Mode(self.balance))

    def data_step(self, step: int) -> int:
        """Which global batch step `step` trains on."""
        return step % self.repeat_every if self.repeat_every > 0 else step

    def loads_at_destination(self, has_source: bool) -> bool:
        return self.load == "destination" or (self.load == "auto" and has_source)

    @property
    def calibrates(self) -> bool:
        return self.calibrate if self.calibrate is not None else self.balance != Mode.NONE

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)


class TrainSpec(BaseModel):
    """A training config file (`orch launch PLAN --config train.yaml`; `orch schema train`): what TrainConfig
    holds of the optimisation, versioned like the other specs. Flags given on the command line win."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    steps: int = Field(default=3, gt=0, description="optimizer steps")
    seed: int = Field(default=0, description="seed of the initialisation and of the data")
    dtype: Literal["float32", "bfloat16", "float64"] = "float32"
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(default=0.1, ge=0, description="peak learning rate")
    weight_decay: float = Field(default=0.1, ge=0, description="AdamW's, on matrices and embeddings only")
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(default="constant", description="after warmup")
    warmup_steps: int = Field(default=0, ge=0, description="steps of linear warmup")
    min_lr: float = Field(default=0.0, ge=0, description="where linear and cosine decay end, at the last step")
    clip_norm: float = Field(default=0.0, ge=0, description="clip the global gradient norm to this (0: off)")
    module_lr: dict[str, float] = Field(default_factory=dict, description="module -> factor on lr")
    checkpoint_every: int = Field(default=0, ge=0, description="save a checkpoint every K steps (0: never)")
    repeat_every: int = Field(
        default=0, ge=0, description="a fixed dataset of this many global batches, repeated (0: new batches)"
    )
    balance: Mode = Field(default=DEFAULT_BALANCE, description="post-balancing mode")

    @field_validator("module_lr")
    @classmethod
    def _positive_factors(cls, value: dict[str, float]) -> dict[str, float]:
        for module, factor in value.items():
            if factor <= 0:
                raise ValueError(f"{module}: expected a factor > 0, got {factor}")
        return value

    def config(self, **run: Any) -> TrainConfig:
        """The TrainConfig of this spec, with the run's other settings (trace, device, resume, ...)."""
        fields = self.model_dump(exclude={"version", "module_lr"})
        return TrainConfig(**fields, module_lr=tuple(sorted(self.module_lr.items())), **run)

    @classmethod
    def of(cls, cfg: TrainConfig) -> TrainSpec:
        """What a run was asked to do, as the file it could have been given (saved in the run directory)."""
        names = set(cls.model_fields) - {"version"}
        values = {n: getattr(cfg, n) for n in names if n != "module_lr"}
        return cls(**values, module_lr=dict(cfg.module_lr))
