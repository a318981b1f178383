"""What a training run is asked to do: one versioned pydantic model, `TrainSpec`, and every default once.

It is the `--config` file of `orch launch` (`orch schema train`), the value the launchers pickle to every
rank, and the `train.json` a run directory and each of its checkpoints keep. Two groups of fields:

* the optimisation (steps, seed, dtype, optimizer, learning rate and schedule, clipping, ...);
* the run options (trace, checkpoints, resume, post-balancing, device, where a data file is decoded, a
  user's model factory, ...): settings of this run that change how, not what, it trains.

`orch launch` keeps a few flags (`--steps --lr --dtype --seed --device --resume`) that override the file;
everything else is set in the file. What the tests inject (fault injection, dumps) is not here:
runtime/train/debug.py.

Defaults are what a user expects of an LLM training run: AdamW (torchtitan's and VeOmni's default) with
betas (0.9, 0.95), weight decay 0.1 on matrices and embeddings, and a peak rate of 1e-4, the order of
magnitude of fine-tuning a pretrained backbone and its encoders together (LLaVA-style runs use 2e-5..2e-4;
torchtitan's from-scratch Llama runs 8e-4). Tests that check gradients exactly ask for SGD explicitly.

Importing this module builds the pydantic model (tens of milliseconds): the CLI imports it inside the
command, never at start-up (tests/unit/test_packaging.py). torch is imported only by `torch_dtype`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orch.planner.balance.mode import Mode
from orch.planner.plan import Schedule

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float64")
ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}  # bytes per element of each of DTYPES
# The largest finite value of each of DTYPES (torch.finfo(...).max): a rate above it overflows the optimizer's step.
DTYPE_MAX = {"float32": 3.4028234663852886e38, "bfloat16": 3.3895313892515355e38, "float64": 1.7976931348623157e308}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of one of DTYPES (torch imported here, not at import)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


DEFAULT_BALANCE = Mode.ORCH  # the one default of post-balancing, for the CLI and the API alike


class TrainSpec(BaseModel):
    """A training run's config: the `--config` file of `orch launch` and what every rank runs with."""

    # protected_namespaces: `model_factory` is a field, not pydantic's `model_*` API. allow_inf_nan: every float
    # setting, nested ones too (betas, module_lr's factors), is finite: `lr: .inf` or a NaN factor is refused
    # here, in one line naming the field, not found by the ranks as a diverging run.
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False)

    version: Literal[1] = 1
    # -- the optimisation ------------------------------------------------------------------------------------
    steps: int = Field(default=3, gt=0, description="optimizer steps")
    seed: int = Field(default=0, description="seed of the initialisation and of the data")
    dtype: Literal["float32", "bfloat16", "float64"] = Field(default="float32", description="parameters' dtype")
    optimizer: Literal["sgd", "adamw"] = Field(default="adamw", description="runtime/train/optim.py")
    lr: float = Field(default=1e-4, ge=0, description="peak learning rate (0 trains nothing)")
    weight_decay: float = Field(default=0.1, ge=0, description="AdamW's, on matrices and embeddings only")
    betas: tuple[float, float] = Field(default=(0.9, 0.95), description="AdamW's")
    eps: float = Field(default=1e-8, gt=0, description="AdamW's")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant", description="after warmup, down to min_lr at the last step"
    )
    warmup_steps: int = Field(default=0, ge=0, description="steps of linear warmup")
    min_lr: float = Field(default=0.0, ge=0, description="where linear and cosine decay end, at the last step")
    clip_norm: float = Field(default=0.0, ge=0, description="clip the global gradient norm to this (0: off)")
    module_lr: dict[str, float] = Field(default_factory=dict, description="module -> factor on lr")
    repeat_every: int = Field(
        default=0, ge=0, description="a fixed dataset of this many global batches, repeated (0: new batches)"
    )
    balance: Mode = Field(default=DEFAULT_BALANCE, description="post-balancing mode (runtime/train/post_balance.py)")
    encoder_balance: Literal["item", "sample"] = Field(
        default="item",
        description="encoder phases balanced by item (an image, a run of a video's frame groups: a sample's encoder "
        "work may run on several ranks, gathered back to its LLM rank) or by whole sample",
    )
    # -- the run options ---------------------------------------------------------------------------------------
    checkpoint_every: int = Field(
        default=0,
        ge=0,
        description="save a checkpoint to WORKDIR/checkpoints every K steps (0: only at the end; every run ends "
        "with one)",
    )
    keep_checkpoints: int = Field(
        default=0,
        ge=0,
        description="keep the newest K checkpoints; older ones are deleted once a newer one is published (0: all)",
    )
    resume: bool = Field(
        default=True,
        description="continue from WORKDIR's newest checkpoint that verifies, if any (false: the previous run is "
        "moved to WORKDIR/previous-<time>/)",
    )
    trace: str | None = Field(default=None, description="write a Chrome trace of the measured phases here")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto: CUDA + NCCL with a GPU per local rank, else CPU + gloo (runtime/device.py)"
    )
    load: Literal["auto", "destination", "origin"] = Field(
        default="auto",
        description="where a data file's samples are decoded: on the rank the dispatcher gives them (destination), "
        "at their initial DP index and then moved (origin); auto: destination",
    )
    loader_workers: int = Field(
        default=0, ge=0, description="processes per rank decoding a data file's next step (0: one thread)"
    )
    calibrate: bool | None = Field(
        default=None,
        description="time at start-up, for the dispatcher's cost model, the modules whose plan carries no "
        "profiled cost (ModulePlan.sample_cost); None: when balancing",
    )
    schedule: Schedule | None = Field(
        default=None, description="override the plan's schedule (three_phase runs islands one after the other)"
    )
    model_factory: str | None = Field(
        default=None, description="package.module:function returning your own modules (runtime/models/factory.py)"
    )
    watchdog_s: float = Field(
        default=300.0,
        ge=0,
        description="end the job, naming the rank, when a rank makes no progress (no phase boundary) for this "
        "long (0: off; runtime/launch/heartbeat.py)",
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="where rank 0 also logs each step's record: tensorboard, wandb (offline unless WANDB_MODE says "
        "otherwise), mlflow (a file store under WORKDIR unless MLFLOW_TRACKING_URI is set); runtime/reporting.py",
    )

    @field_validator("module_lr")
    @classmethod
    def _positive_factors(cls, value: dict[str, float]) -> dict[str, float]:
        for module, factor in value.items():
            if factor <= 0:
                raise ValueError(f"{module}: expected a factor > 0, got {factor}")
        return value

    @field_validator("betas")
    @classmethod
    def _betas_below_one(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= beta < 1.0 for beta in value):  # AdamW's own bound, said here rather than by every rank
            raise ValueError(f"expected two values in [0, 1), got {list(value)}")
        return value

    @model_validator(mode="after")
    def _steps_fit_the_dtype(self) -> TrainSpec:
        """The largest step size the optimizer computes is finite in the parameters' dtype (torch refuses a larger
        one in every rank): the rate times the largest module_lr factor, over 1 - beta1 under AdamW (its first
        step's bias correction)."""
        top, factor = DTYPE_MAX[self.dtype], max([1.0, *self.module_lr.values()])
        correction = 1.0 - self.betas[0] if self.optimizer == "adamw" else 1.0
        for name, rate in (("lr", self.lr), ("min_lr", self.min_lr)):
            if rate * factor / correction > top:
                raise ValueError(
                    f"{name} {rate:g}: the optimizer's step size reaches {rate * factor / correction:.4g}, more than "
                    f"the parameters' {self.dtype} holds ({top:.4g})"
                )
        return self

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


# The fields that decide what a run trains (the first group above): a resumed run that sets one otherwise than its
# checkpoint was trained with says so (`changed_settings`). The run options change how, not what: not compared.
OPTIMISATION = (
    "steps", "seed", "dtype", "optimizer", "lr", "weight_decay", "betas", "eps", "lr_schedule", "warmup_steps",
    "min_lr", "clip_norm", "module_lr", "repeat_every", "balance", "encoder_balance",
)  # fmt: skip


def changed_settings(was: Mapping[str, Any], now: TrainSpec) -> dict[str, tuple[Any, Any]]:
    """Field -> (then, now) of each OPTIMISATION field `now` sets otherwise than `was` (a checkpoint's train.json as
    read); a field `was` lacks (an older file) is not compared."""
    current = now.model_dump(mode="json")
    return {f: (was[f], current[f]) for f in OPTIMISATION if f in was and was[f] != current[f]}


# The runtime's name for the same model (the trainer, the optimizer, the tests): one definition, two names.
TrainConfig = TrainSpec

__all__ = [
    "DEFAULT_BALANCE", "DTYPES", "ELEM_BYTES", "OPTIMISATION", "TrainConfig", "TrainSpec", "changed_settings",
    "torch_dtype",
]  # fmt: skip
