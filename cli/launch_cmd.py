"""`orch launch`: run a plan for real (local processes, or Slurm through submitit: cli/jobs_cmd.py).

`--device auto|cpu|cuda` (runtime/device.py): CUDA with NCCL, one GPU per local rank, or the CPU with gloo.

torch and the runtime are imported inside the command so `orch --help` stays fast.
"""

from __future__ import annotations

from typing import Any

import typer

from orch.planner.balance.mode import Mode
from orch.runtime.train.config import DEFAULT_BALANCE, DTYPES

EXECUTORS = ("local", "slurm")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("constant", "linear", "cosine")  # runtime/train/optim.py SCHEDULES (not imported: it imports torch)
BALANCE = tuple(m.value for m in Mode)  # post-balancing modes (runtime/train/orchestrator.py)
DEVICES = ("auto", "cpu", "cuda")  # runtime/device.py DEVICES (not imported: it imports torch)


def launch(
    plan_file: str = typer.Argument(..., metavar="PLAN", help="Plan file written by `orch plan` (YAML or JSON)."),
    executor: str = typer.Option("local", "--executor", help=f"One of {', '.join(EXECUTORS)}."),
    nproc: int | None = typer.Option(None, "--nproc", help="Processes to start (default: the plan's world size)."),
    config: str | None = typer.Option(
        None, "--config", help="Training config file (`orch schema train`); the flags below override it."
    ),
    steps: int | None = typer.Option(None, "--steps", help="Optimizer steps to run [default: 3]."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the initialisation and of the data [default: 0]."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate [default: 0.1; 0 trains nothing]."),
    optimizer: str | None = typer.Option(None, "--optimizer", help=f"One of {', '.join(OPTIMIZERS)} [default: sgd]."),
    lr_schedule: str | None = typer.Option(None, "--lr-schedule", help=f"After warmup: {', '.join(SCHEDULES)}."),
    warmup_steps: int | None = typer.Option(None, "--warmup-steps", help="Steps of linear learning-rate warmup."),
    min_lr: float | None = typer.Option(None, "--min-lr", help="Where linear and cosine decay end."),
    clip_norm: float | None = typer.Option(None, "--clip-norm", help="Clip the global gradient norm (0: off)."),
    weight_decay: float | None = typer.Option(None, "--weight-decay", help="AdamW's [default: 0.1]."),
    dtype: str | None = typer.Option(None, "--dtype", help=f"One of {', '.join(DTYPES)} [default: float32]."),
    device: str = typer.Option(
        "auto",
        "--device",
        help="auto (CUDA + NCCL if there is a GPU per local rank, else CPU + gloo), cpu or cuda.",
    ),
    workdir: str = typer.Option("orch-run", "--workdir", help="Where metrics.jsonl is written."),
    data: str | None = typer.Option(None, "--data", "-d", help="Data spec file or preset (default: the plan's)."),
    trace: str | None = typer.Option(None, "--trace", help="Write a Chrome trace of the measured phases here."),
    checkpoint_every: int | None = typer.Option(
        None, "--checkpoint-every", help="Save a checkpoint to WORKDIR/checkpoints every K steps (0: never)."
    ),
    resume: bool = typer.Option(
        True, "--resume/--no-resume", help="Continue from WORKDIR's newest complete checkpoint, if any."
    ),
    balance: str | None = typer.Option(
        None,
        "--balance",
        help=f"Post-balance samples across DP ranks every step: one of {', '.join(BALANCE)} "
        f"[default: {DEFAULT_BALANCE.value}].",
    ),
    load: str = typer.Option(
        "auto", "--load", help="Where a data file's samples are decoded: destination, origin, auto (destination)."
    ),
    loader_workers: int = typer.Option(
        0, "--loader-workers", help="Processes per rank decoding a data file's next step (0: one thread)."
    ),
    partition: str | None = typer.Option(None, "--partition", help="Slurm partition (--executor slurm)."),
    account: str | None = typer.Option(None, "--account", help="Slurm account (--executor slurm)."),
    qos: str | None = typer.Option(None, "--qos", help="Slurm QOS (--executor slurm)."),
    mem: str | None = typer.Option(
        None, "--mem", help="Slurm memory per node, e.g. 64G (--executor slurm; default: the cluster's)."
    ),
    time_limit: str = typer.Option("4:00:00", "--time", help="Slurm time limit, e.g. 4:00:00 (--executor slurm)."),
    setup: str | None = typer.Option(
        None, "--setup", help="Setup file rendered into the sbatch script (default: templates/slurm/default-setup.sh)."
    ),
    model_factory: str | None = typer.Option(
        None,
        "--model-factory",
        help="package.module:function returning your own modules (docs: runtime/models/factory.py).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the sbatch script and plan summary; submit nothing."),
    wait: bool = typer.Option(False, "--wait", help="Follow the Slurm job until it ends; non-zero exit if it fails."),
) -> None:
    """Run PLAN up to step --steps and write one metrics line per step to WORKDIR/metrics.jsonl."""
    from pathlib import Path

    from orch.cli.output import console
    from orch.planner.errors import SpecError
    from orch.planner.loading import check_data_against_model, load_data, load_json_file
    from orch.planner.plan import Plan

    if executor not in EXECUTORS:
        raise SpecError("--executor", "", f"expected one of {', '.join(EXECUTORS)}, got '{executor}'")
    if device not in DEVICES:
        raise SpecError("--device", "", f"expected one of {', '.join(DEVICES)}, got '{device}'")
    flags = {
        "steps": steps, "seed": seed, "dtype": dtype, "optimizer": optimizer, "lr": lr, "lr_schedule": lr_schedule,
        "warmup_steps": warmup_steps, "min_lr": min_lr, "clip_norm": clip_norm, "weight_decay": weight_decay,
        "checkpoint_every": checkpoint_every, "balance": balance,
    }  # fmt: skip
    train = train_spec(config, {k: v for k, v in flags.items() if v is not None})
    plan = load_json_file(Plan, plan_file)
    data_spec = load_data(data) if data else plan.data
    check_data_against_model(data_spec, plan.model, data or plan_file)
    world = nproc if nproc is not None else plan.world_size
    if world != plan.world_size:
        raise SpecError("--nproc", "", f"the plan needs {plan.world_size} processes, got {world}")

    from orch.runtime.device import DeviceError, device_kind
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.train.support import check_supported
    from orch.runtime.train.trainer import TrainTask

    check_supported(plan)
    if executor == "local":  # Slurm tasks choose on their nodes (the submitting host may have no GPU)
        try:
            device = device_kind(device, world)
        except DeviceError as exc:
            raise SpecError("--device", "", str(exc)) from None
    if load not in ("auto", "destination", "origin"):
        raise SpecError("--load", "", f"expected destination, origin or auto, got '{load}'")
    if loader_workers < 0:
        raise SpecError("--loader-workers", "", f"expected a count >= 0, got {loader_workers}")
    cfg = train.config(
        model_factory=model_factory, trace=trace, resume=resume, device=device, load=load, loader_workers=loader_workers
    )
    if model_factory is not None:
        from orch.runtime.models.factory import build_from_factory

        build_from_factory(model_factory, plan.model, cfg.seed, cfg.torch_dtype)  # fail here, not in every rank
    if any(m.hf is not None for m in plan.model.modules.values()):
        from orch.runtime.train.support import check_hf_plan

        check_hf_plan(plan)  # configs, safetensors names and shapes, the layout: here, not in every rank
    if executor == "slurm":
        from orch.cli.jobs_cmd import launch_slurm
        from orch.runtime.launch.sbatch import SlurmOptions

        opts = SlurmOptions(partition=partition, account=account, qos=qos, time=time_limit, setup=setup, mem=mem)
        launch_slurm(plan, data_spec, cfg, opts, workdir=workdir, dry_run=dry_run, wait=wait, source=plan_file)
        return
    out = console()
    backend = "nccl" if device == "cuda" else "gloo"
    out.print(
        f"launching {plan.placement} plan on {world} local processes ({device}/{backend}, {cfg.dtype}, seed {cfg.seed})"
    )
    records = LocalLauncher(world).submit(TrainTask(plan, data_spec, cfg, workdir)).result()
    for r in records:
        out.print(f"step {r.step}: loss {r.loss:.6f}  tokens {r.tokens}  step {r.step_time_s:.3f} s")
    counts = [r.data for r in records if r.data is not None]
    if counts:
        total = {k: sum(c[k] for c in counts) for k in ("samples", "skipped", "truncated", "failed")}
        out.print(
            f"data: {total['samples']} samples over {len(counts)} steps; {total['skipped']} skipped (no longer "
            f"parse), {total['truncated']} truncated to seq_len, {total['failed']} with unreadable media"
        )
    out.print(f"metrics written to [bold]{workdir}/metrics.jsonl[/]")
    if trace is not None and Path(trace).exists():
        out.print(f"trace written to [bold]{trace}[/]")


NON_NEGATIVE = ("lr", "warmup_steps", "min_lr", "clip_norm", "weight_decay", "checkpoint_every")
ENUMS = {"dtype": DTYPES, "optimizer": OPTIMIZERS, "lr_schedule": SCHEDULES, "balance": BALANCE}


def train_spec(config: str | None, given: dict[str, Any]) -> Any:
    """The run's TrainSpec: the --config file (or the defaults) with the flags given on top; a bad value
    is one line naming the flag, or the file and field."""
    from pydantic import ValidationError

    from orch.planner.errors import SpecError
    from orch.planner.loading import load_json_file, validation_errors
    from orch.runtime.train.config import TrainSpec

    for key, value in given.items():
        flag = "--" + key.replace("_", "-")
        if key in ENUMS and value not in ENUMS[key]:
            raise SpecError(flag, "", f"expected one of {', '.join(ENUMS[key])}, got '{value}'")
        if key == "steps" and value <= 0:
            raise SpecError(flag, "", f"expected a positive step count, got {value}")
        if key in NON_NEGATIVE and value < 0:
            raise SpecError(flag, "", f"expected a value >= 0, got {value}")
    base = load_json_file(TrainSpec, config) if config else TrainSpec()
    try:
        return TrainSpec.model_validate({**base.model_dump(), **given})
    except ValidationError as exc:
        raise validation_errors("command line", exc, TrainSpec) from None


def register(app: typer.Typer) -> None:
    app.command()(launch)
