"""`orch launch`: run a plan for real (local processes, or Slurm through submitit: cli/jobs_cmd.py).

`--device auto|cpu|cuda` (runtime/device.py): CUDA with NCCL, one GPU per local rank, or the CPU with gloo.

torch and the runtime are imported inside the command so `orch --help` stays fast.
"""

from __future__ import annotations

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
    steps: int = typer.Option(3, "--steps", help="Optimizer steps to run."),
    seed: int = typer.Option(0, "--seed", help="Seed of the initialisation and of the data."),
    lr: float = typer.Option(0.1, "--lr", help="Learning rate (0 trains nothing: weights come back as loaded)."),
    optimizer: str = typer.Option("sgd", "--optimizer", help=f"One of {', '.join(OPTIMIZERS)}."),
    lr_schedule: str = typer.Option("constant", "--lr-schedule", help=f"After warmup: {', '.join(SCHEDULES)}."),
    warmup_steps: int = typer.Option(0, "--warmup-steps", help="Steps of linear learning-rate warmup."),
    min_lr: float = typer.Option(0.0, "--min-lr", help="Where linear and cosine decay end."),
    clip_norm: float = typer.Option(0.0, "--clip-norm", help="Clip the global gradient norm to this (0: off)."),
    weight_decay: float = typer.Option(0.1, "--weight-decay", help="AdamW's, on matrices and embeddings."),
    dtype: str = typer.Option("float32", "--dtype", help=f"One of {', '.join(DTYPES)}."),
    device: str = typer.Option(
        "auto",
        "--device",
        help="auto (CUDA + NCCL if there is a GPU per local rank, else CPU + gloo), cpu or cuda.",
    ),
    workdir: str = typer.Option("orch-run", "--workdir", help="Where metrics.jsonl is written."),
    data: str | None = typer.Option(None, "--data", "-d", help="Data spec file or preset (default: the plan's)."),
    trace: str | None = typer.Option(None, "--trace", help="Write a Chrome trace of the measured phases here."),
    checkpoint_every: int = typer.Option(
        0, "--checkpoint-every", help="Save a checkpoint to WORKDIR/checkpoints every K steps (0: never)."
    ),
    resume: bool = typer.Option(
        True, "--resume/--no-resume", help="Continue from WORKDIR's newest complete checkpoint, if any."
    ),
    balance: str = typer.Option(
        DEFAULT_BALANCE.value,
        "--balance",
        help=f"Post-balance samples across DP ranks every step: one of {', '.join(BALANCE)}.",
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
    if dtype not in DTYPES:
        raise SpecError("--dtype", "", f"expected one of {', '.join(DTYPES)}, got '{dtype}'")
    if balance not in BALANCE:
        raise SpecError("--balance", "", f"expected one of {', '.join(BALANCE)}, got '{balance}'")
    if device not in DEVICES:
        raise SpecError("--device", "", f"expected one of {', '.join(DEVICES)}, got '{device}'")
    if optimizer not in OPTIMIZERS:
        raise SpecError("--optimizer", "", f"expected one of {', '.join(OPTIMIZERS)}, got '{optimizer}'")
    if lr < 0:
        raise SpecError("--lr", "", f"expected a learning rate >= 0, got {lr}")
    if lr_schedule not in SCHEDULES:
        raise SpecError("--lr-schedule", "", f"expected one of {', '.join(SCHEDULES)}, got '{lr_schedule}'")
    for flag, value in (("--warmup-steps", warmup_steps), ("--min-lr", min_lr), ("--clip-norm", clip_norm),
                        ("--weight-decay", weight_decay)):  # fmt: skip
        if value < 0:
            raise SpecError(flag, "", f"expected a value >= 0, got {value}")
    if steps <= 0:
        raise SpecError("--steps", "", f"expected a positive step count, got {steps}")
    if checkpoint_every < 0:
        raise SpecError("--checkpoint-every", "", f"expected a step count >= 0, got {checkpoint_every}")
    plan = load_json_file(Plan, plan_file)
    data_spec = load_data(data) if data else plan.data
    check_data_against_model(data_spec, plan.model, data or plan_file)
    world = nproc if nproc is not None else plan.world_size
    if world != plan.world_size:
        raise SpecError("--nproc", "", f"the plan needs {plan.world_size} processes, got {world}")

    from orch.runtime.device import DeviceError, device_kind
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.support import check_supported
    from orch.runtime.train.trainer import TrainTask

    check_supported(plan)
    if executor == "local":  # Slurm tasks choose on their nodes (the submitting host may have no GPU)
        try:
            device = device_kind(device, world)
        except DeviceError as exc:
            raise SpecError("--device", "", str(exc)) from None
    cfg = TrainConfig(
        model_factory=model_factory,
        steps=steps,
        seed=seed,
        dtype=dtype,
        lr=lr,
        optimizer=optimizer,
        lr_schedule=lr_schedule,
        warmup_steps=warmup_steps,
        min_lr=min_lr,
        clip_norm=clip_norm,
        weight_decay=weight_decay,
        trace=trace,
        checkpoint_every=checkpoint_every,
        resume=resume,
        balance=Mode(balance),
        device=device,
    )
    if model_factory is not None:
        from orch.runtime.models.factory import build_from_factory

        build_from_factory(model_factory, plan.model, seed, cfg.torch_dtype)  # fail here, not in every rank
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
    out.print(f"launching {plan.placement} plan on {world} local processes ({device}/{backend}, {dtype}, seed {seed})")
    records = LocalLauncher(world).submit(TrainTask(plan, data_spec, cfg, workdir)).result()
    for r in records:
        out.print(f"step {r.step}: loss {r.loss:.6f}  tokens {r.tokens}  step {r.step_time_s:.3f} s")
    out.print(f"metrics written to [bold]{workdir}/metrics.jsonl[/]")
    if trace is not None and Path(trace).exists():
        out.print(f"trace written to [bold]{trace}[/]")


def register(app: typer.Typer) -> None:
    app.command()(launch)
