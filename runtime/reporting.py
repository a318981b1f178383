"""`--report-to tensorboard,wandb,mlflow`: rank 0 also logs each step's record where people watch runs.

What is logged is the StepRecord rank 0 appends to metrics.jsonl (runtime/workdir/metrics.py), as scalars
(`step_scalars`): loss, learning rate, gradient norm, tokens per second, the step's and each phase's time
(the slowest rank's), each post-balanced phase's imbalance (slowest rank over mean) and the largest rank's
memory. One sink per backend, each imported inside itself (a missing package is one line naming what to
install, checked by `orch launch` before any rank starts):

* tensorboard: event files in WORKDIR/tensorboard (torch.utils.tensorboard's SummaryWriter);
* wandb: a run under WORKDIR/wandb, offline unless WANDB_MODE says otherwise (`wandb sync` uploads it later);
  WANDB_PROJECT names the project (default orch);
* mlflow: MLFLOW_TRACKING_URI, else a file store in WORKDIR/mlruns; MLFLOW_EXPERIMENT_NAME (default orch).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orch.planner.errors import OrchError, SpecError
from orch.runtime.workdir.metrics import StepRecord, phase_imbalance

if TYPE_CHECKING:
    from orch.runtime.train.config import TrainConfig

# backend -> (the module it imports, what to install)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}


def check_installed(backends: list[str]) -> None:
    """SpecError for the first backend whose package is missing: what to install."""
    for name in backends:
        module, package = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise SpecError(
                "--report-to", "", f"{name} is not installed: pip install {package} (or pip install 'orch[report]')"
            )


def step_scalars(record: StepRecord) -> dict[str, float]:
    """The record's numbers as scalars named `group/name`."""
    out = {"train/loss": record.loss, "train/tokens": float(record.tokens), "time/step_s": record.step_time_s}
    if record.step_time_s > 0:
        out["train/tokens_per_s"] = record.tokens / record.step_time_s
    if record.lr is not None:
        out["train/lr"] = record.lr
    if record.grad_norm is not None:
        out["train/grad_norm"] = record.grad_norm
    phases = sorted({p for times in record.ranks.values() for p in times if p != "step"})
    for phase in phases:
        out[f"time/{phase}"] = max(times.get(phase, 0.0) for times in record.ranks.values())
    for phase, ratio in phase_imbalance(record).items():
        out[f"imbalance/{phase}"] = ratio
    for key in ("peak_bytes", "state_bytes"):
        values = [m[key] for m in record.memory.values() if key in m]
        if values:
            out[f"memory/{key.removesuffix('_bytes')}_gib"] = max(values) / 2**30
    return out


class Sink(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class Reporter:
    """Rank 0's sinks: `log(record)` after each step, `close()` at the end of the run."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def log(self, record: StepRecord) -> None:
        scalars = step_scalars(record)
        for sink in self.sinks:
            sink.log(record.step, scalars)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_reporter(backends: list[str], workdir: str | Path, cfg: TrainConfig) -> Reporter:
    check_installed(backends)
    out = Path(workdir).absolute()
    config = json.loads(cfg.model_dump_json())
    run_name = out.name
    sinks: list[Sink] = []
    for name in backends:
        if name == "tensorboard":
            sinks.append(TensorBoardSink(out / "tensorboard", config))
        elif name == "wandb":
            sinks.append(WandbSink(out, run_name, config))
        elif name == "mlflow":
            sinks.append(MlflowSink(out, run_name, config))
    return Reporter(sinks)


class TensorBoardSink:
    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # what a watcher sees is on disk at each step (one small append)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, workdir: Path, run_name: str, config: dict[str, Any]) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "orch"), name=run_name, dir=str(workdir), mode=mode,
                config=config, settings=wandb.Settings(console="off", x_disable_stats=True, quiet=True),
            )  # fmt: skip
        except Exception as exc:  # wandb's errors (a login, a network) are many classes
            raise OrchError(f"wandb: cannot start a run in {workdir} (WANDB_MODE={mode}): {exc}") from None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    def __init__(self, workdir: Path, run_name: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the run's own file store (MLflow 3 asks to opt in to file stores: this one is ours)
            uri = (workdir / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "orch")
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=run_name).info.run_id
        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in sorted(config.items())]
        self.client.log_batch(self.run_id, params=params)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


__all__ = ["Reporter", "check_installed", "open_reporter", "step_scalars"]
