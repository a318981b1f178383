"""`orch launch`: run a plan for real (local processes, torchrun, or Slurm through submitit: cli/jobs_cmd.py).

The run's settings are one model, runtime/train/config.py `TrainSpec`: the `--config` file holds them, and a
few flags people type (`--steps --lr --dtype --seed --device --resume/--no-resume`) override it. The flags
that mirrored the rest of the file (`DEPRECATED`) still work for one release, with a one-line warning; the
one model validates every value (a bad one is one line naming the flag, or the file and field). `--help`
shows TrainSpec's defaults, read when help is asked for (`LaunchCommand`).

`launch` checks everything once (`checked_run`), then one function per executor runs the plan
(`_launch_local`, `_launch_torchrun`, `_launch_slurm`).

torch, pydantic's TrainSpec and the runtime are imported inside the command so `orch --help` stays fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand

from orch.cli.data_cmd import AUDIO_IN_VIDEO_HELP, INDEX_DIR_HELP, MEDIA_ROOT_HELP

EXECUTORS = ("local", "slurm", "torchrun")
# Flags that moved into the --config file (issue #28): TrainSpec field -> flag. Remove after one release.
DEPRECATED = (
    "optimizer", "lr_schedule", "warmup_steps", "min_lr", "clip_norm", "weight_decay", "checkpoint_every",
    "balance", "trace", "load", "loader_workers", "model_factory",
)  # fmt: skip
OVERRIDES = ("steps", "seed", "lr", "dtype", "device", "resume", "watchdog_s", "report_to")  # TrainSpec fields as flags


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


class LaunchCommand(TyperCommand):
    """`orch launch`'s command: its help shows TrainSpec's defaults beside the flags that override them
    (the flags themselves default to "not given": the file's value, else TrainSpec's)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from orch.runtime.train.config import TrainSpec

        shown: list[Any] = [p for p in self.params if p.name in OVERRIDES]  # click Options: they have show_default
        try:
            for param in shown:  # for this rendering only: a given flag is what overrides the file
                param.default, param.show_default = _shown_default(TrainSpec.model_fields[str(param.name)]), True
            super().format_help(ctx, formatter)
        finally:
            for param in shown:
                param.default, param.show_default = None, False


def _shown_default(field: Any) -> Any:
    """A TrainSpec field's default as its flag spells it (a list: comma-separated; empty: none)."""
    value = field.get_default(call_default_factory=True)
    return (",".join(value) or "none") if isinstance(value, list) else value


def launch(
    plan_file: str = typer.Argument(..., metavar="PLAN", help="Plan file written by `orch plan` (YAML or JSON)."),
    config: str | None = typer.Option(
        None, "--config", help="Training config file (`orch schema train`): every setting; the flags below win."
    ),
    executor: str = typer.Option("local", "--executor", help=f"One of {', '.join(EXECUTORS)}."),
    nproc: int | None = typer.Option(None, "--nproc", help="Processes to start (default: the plan's world size)."),
    workdir: str = typer.Option("orch-run", "--workdir", help="Where metrics.jsonl and checkpoints are written."),
    data: str | None = typer.Option(
        None,
        "--data",
        "-d",
        help="Data to train on, as `orch plan --data` takes it: conversation data (a file, mix file, directory, or "
        "dataset_info.json:NAME[,NAME]), trained at the plan's global batch and seq_len, or a data spec file or "
        "preset (default: the plan's).",
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="tokenizer.json for a --data file (default: the plan's, else the LLM's HF directory)."
    ),
    index_dir: str | None = typer.Option(None, "--index-dir", help=INDEX_DIR_HELP),
    media_root: str | None = typer.Option(None, "--media-root", help=MEDIA_ROOT_HELP),
    use_audio_in_video: bool = typer.Option(False, "--use-audio-in-video", help=AUDIO_IN_VIDEO_HELP),
    steps: int | None = typer.Option(None, "--steps", help="Optimizer steps to run."),
    lr: float | None = typer.Option(None, "--lr", help="Peak learning rate (0 trains nothing)."),
    dtype: str | None = typer.Option(None, "--dtype", help="float32, bfloat16 or float64."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the initialisation and of the data."),
    device: str | None = typer.Option(
        None, "--device", help="auto (CUDA + NCCL if there is a GPU per local rank, else CPU + gloo), cpu or cuda."
    ),
    resume: bool | None = typer.Option(
        None,
        "--resume/--no-resume",
        help="Continue from WORKDIR's newest checkpoint that verifies; --no-resume moves the previous run to "
        "WORKDIR/previous-<time>/.",
    ),
    watchdog_s: float | None = typer.Option(
        None, "--watchdog-s", help="End the job, naming the rank, when a rank makes no progress this long (0: off)."
    ),
    report_to: str | None = typer.Option(
        None, "--report-to", help="Also log each step to tensorboard, wandb and/or mlflow (comma-separated; none)."
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
    rdzv_endpoint: str | None = typer.Option(
        None, "--rdzv-endpoint", help="HOST:PORT where a multi-node plan's ranks meet (--executor torchrun)."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the sbatch script, the torchrun command or the local launch and the plan summary; start nothing.",
    ),
    wait: bool = typer.Option(False, "--wait", help="Follow the Slurm job until it ends; non-zero exit if it fails."),
    # Deprecated: set these in the --config file (hidden; a warning each).
    optimizer: str | None = typer.Option(None, "--optimizer", hidden=True),
    lr_schedule: str | None = typer.Option(None, "--lr-schedule", hidden=True),
    warmup_steps: int | None = typer.Option(None, "--warmup-steps", hidden=True),
    min_lr: float | None = typer.Option(None, "--min-lr", hidden=True),
    clip_norm: float | None = typer.Option(None, "--clip-norm", hidden=True),
    weight_decay: float | None = typer.Option(None, "--weight-decay", hidden=True),
    checkpoint_every: int | None = typer.Option(None, "--checkpoint-every", hidden=True),
    balance: str | None = typer.Option(None, "--balance", hidden=True),
    trace: str | None = typer.Option(None, "--trace", hidden=True),
    load: str | None = typer.Option(None, "--load", hidden=True),
    loader_workers: int | None = typer.Option(None, "--loader-workers", hidden=True),
    model_factory: str | None = typer.Option(None, "--model-factory", hidden=True),
) -> None:
    """Run PLAN for the config's steps and write one metrics line per step to WORKDIR/metrics.jsonl.

    Settings come from --config (see `orch schema train`; templates/train/*.yaml to copy); the flags override it.
    """
    given = {
        "steps": steps, "seed": seed, "lr": lr, "dtype": dtype, "device": device, "resume": resume,
        "optimizer": optimizer, "lr_schedule": lr_schedule, "warmup_steps": warmup_steps, "min_lr": min_lr,
        "clip_norm": clip_norm, "weight_decay": weight_decay, "checkpoint_every": checkpoint_every,
        "balance": balance, "trace": trace, "load": load, "loader_workers": loader_workers,
        "model_factory": model_factory, "watchdog_s": watchdog_s,
        "report_to": None if report_to is None else report_backends(report_to),
    }  # fmt: skip
    given = {k: v for k, v in given.items() if v is not None}
    run = checked_run(
        plan_file,
        config,
        given,
        executor,
        nproc,
        workdir,
        data,
        tokenizer,
        index_dir,
        media_root,
        dry_run,
        use_audio_in_video,
    )
    if executor == "slurm":
        from orch.runtime.launch.sbatch import SlurmOptions

        opts = SlurmOptions(partition=partition, account=account, qos=qos, time=time_limit, setup=setup, mem=mem)
        _launch_slurm(run, opts, dry_run=dry_run, wait=wait)
    elif executor == "torchrun":
        _launch_torchrun(run, rdzv_endpoint, dry_run=dry_run)
    else:
        _launch_local(run, dry_run=dry_run)


@dataclass(frozen=True)
class _Run:
    """What every executor launches, once `checked_run` has checked it: the plan, its data, the run's settings."""

    plan: Any
    data: Any  # DataSpec
    cfg: Any  # TrainSpec
    workdir: str
    world: int
    source: str  # the plan file, as the sbatch script names it


def checked_run(
    plan_file: str,
    config: str | None,
    given: dict[str, Any],
    executor: str,
    nproc: int | None,
    workdir: str,
    data: str | None,
    tokenizer: str | None,
    index_dir: str | None,
    media_root: str | None,
    dry_run: bool,
    use_audio_in_video: bool = False,
) -> _Run:
    """Everything checked here, before any executor starts a rank or submits a job: the flags and the config
    file, the plan against its data and the runtime, a local run's device, a model factory, a Hugging Face
    plan's files and, unless a dry run, the run directory (busy, or another model's)."""
    from orch.planner.errors import SpecError
    from orch.planner.loading import check_data_against_model, load_json_file
    from orch.planner.plan import Plan

    if executor not in EXECUTORS:
        raise SpecError("--executor", "", f"expected one of {', '.join(EXECUTORS)}, got '{executor}'")
    for key in DEPRECATED:
        if key in given:
            typer.echo(f"warning: {_flag(key)} is deprecated: set {key} in the --config file", err=True)
    cfg = train_spec(config, given)
    plan = load_json_file(Plan, plan_file)
    data_spec = (plan.data if data is None
                 else launch_data(plan, data, tokenizer, index_dir, media_root, use_audio_in_video))  # fmt: skip
    check_data_against_model(data_spec, plan.model, data or plan_file)
    from orch.runtime.data.freshness import check_index_current

    check_index_current(data_spec, data or plan_file)  # a data file edited since `orch plan`: here, before any rank
    if data is None and data_spec.source is not None and data_spec.manifest is not None:  # (--data's warns itself)
        from orch.cli.data_cmd import warn_batch_over_data
        from orch.planner.data import read_manifest

        warn_batch_over_data(data_spec.global_batch, len(read_manifest(data_spec.manifest)), data_spec.source)
    world = nproc if nproc is not None else plan.world_size
    if world != plan.world_size:
        raise SpecError("--nproc", "", f"the plan needs {plan.world_size} processes, got {world}")

    from orch.runtime.device import DeviceError, device_kind
    from orch.runtime.train.support import check_supported

    check_supported(plan)
    if cfg.report_to:
        from orch.runtime.reporting import check_installed

        try:
            check_installed(cfg.report_to)
        except SpecError as exc:
            raise _where("report_to", given, config, exc.message) from None
    if executor == "local":  # Slurm's and torchrun's ranks choose on their nodes (this host may have no GPU)
        try:
            cfg = cfg.model_copy(update={"device": device_kind(cfg.device, world)})
        except DeviceError as exc:
            raise _where("device", given, config, str(exc)) from None
    if cfg.model_factory is not None:
        from orch.runtime.models.factory import build_from_factory

        try:
            build_from_factory(cfg.model_factory, plan.model, cfg.seed, cfg.torch_dtype)  # here, not in every rank
        except SpecError as exc:
            field = ".".join(p for p in ("model_factory", exc.field) if p)
            raise (
                exc if "model_factory" in given else SpecError(config or "train config", field, exc.message)
            ) from None
    if any(m.hf is not None for m in plan.model.modules.values()):
        from orch.runtime.train.support import check_hf_plan

        check_hf_plan(plan)  # configs, safetensors names and shapes, the layout: here, not in every rank
    if not dry_run:  # a busy run directory, or one of another model, is refused before a job is submitted or a
        # task file written (rank 0 checks both again when it prepares the run)
        from orch.runtime.workdir.run_lock import probe

        probe(workdir)
        if cfg.resume:
            from orch.runtime.data.freshness import check_resume_data
            from orch.runtime.workdir.run_dir import check_same_model
            from orch.runtime.workdir.run_identity import model_identity

            identity = model_identity(plan.model, cfg.model_factory)
            check_same_model(workdir, plan, identity, cfg.model_factory, tell=lambda line: None)  # prepare says
            check_resume_data(workdir, data_spec, identity)  # a re-plan's index
    return _Run(plan, data_spec, cfg, workdir, world, plan_file)


def _launch_slurm(run: _Run, opts: Any, *, dry_run: bool, wait: bool) -> None:
    """`--executor slurm`: one allocation through submitit. The sbatch script, the submission and `--wait` are
    the jobs commands' (cli/jobs_cmd.py `launch_slurm`); the task each rank runs is built by
    runtime/launch/slurm.py `submit_train`, which the Slurm tests also call."""
    from orch.cli.jobs_cmd import launch_slurm

    launch_slurm(run.plan, run.data, run.cfg, opts, workdir=run.workdir, dry_run=dry_run, wait=wait, source=run.source)


def _launch_torchrun(run: _Run, rdzv_endpoint: str | None, *, dry_run: bool) -> None:
    """`--executor torchrun`: the task pickled to WORKDIR/task.pkl and one torchrun command per node; a dry run
    prints the command and leaves the task file for it."""
    from pathlib import Path

    from orch.cli.output import console, print_json_text
    from orch.cli.progress import StepProgress
    from orch.runtime.launch.sbatch import allocation
    from orch.runtime.launch.torchrun import TorchrunLauncher, command_text
    from orch.runtime.train.trainer import TrainTask
    from orch.runtime.workdir.metrics import metrics_path

    plan, cfg, workdir = run.plan, run.cfg, run.workdir
    out = console()
    task = TrainTask(plan, run.data, cfg, workdir)
    nodes, per_node = allocation(plan)
    launcher = TorchrunLauncher(nodes, per_node, rdzv_endpoint)
    if dry_run:
        print_json_text(command_text(launcher.command(task)))
        out.print(f"dry run: task written to {Path(workdir).absolute() / 'task.pkl'}; run the command above on "
                  f"each of {nodes} node(s)", soft_wrap=True)  # fmt: skip
        return
    handle = launcher.submit(task)
    out.print(f"launching {plan.placement} plan under torchrun: {nodes} node(s) x {per_node} ranks ({cfg.dtype})")
    with _divergence_said(task):
        records = handle.result()
    steps = StepProgress(out, metrics_path(workdir), cfg.steps)
    for r in records:
        steps.show(r)
    _say_stopped(out, handle.stopped_by, handle.stopped_at)
    _say_finished(out, records, workdir, cfg.trace)


def _launch_local(run: _Run, *, dry_run: bool) -> None:
    """`--executor local`: the plan's world of processes on this host, followed step by step."""
    from pathlib import Path

    from orch.cli.output import console
    from orch.cli.progress import StepProgress
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.train.trainer import TrainTask
    from orch.runtime.workdir.metrics import metrics_path

    plan, cfg, workdir, world = run.plan, run.cfg, run.workdir, run.world
    out = console()
    task = TrainTask(plan, run.data, cfg, workdir)
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    if dry_run:
        out.print(
            f"dry run: would launch the {plan.placement} plan on {world} local processes ({cfg.device}/{backend}, "
            f"{cfg.dtype}, seed {cfg.seed}, {cfg.steps} steps) into {Path(workdir).absolute()}; started nothing",
            soft_wrap=True,
        )
        return
    out.print(
        f"launching {plan.placement} plan on {world} local processes ({cfg.device}/{backend}, {cfg.dtype}, "
        f"seed {cfg.seed})"
    )
    local = LocalLauncher(world).submit(task)
    with _divergence_said(task), StepProgress(out, metrics_path(workdir), cfg.steps) as steps:
        local.wait(on_poll=steps.poll)
    records = task.result()
    _say_stopped(out, local.stopped_by, local.stopped_at)
    _say_finished(out, records, workdir, cfg.trace)


def _say_finished(out: Any, records: list[Any], workdir: str, trace: str | None) -> None:
    """The lines after a local or torchrun run: what its data gave and skipped, and where its files are."""
    from pathlib import Path

    counts = [r.data for r in records if r.data is not None]
    if counts:
        total = {k: sum(c[k] for c in counts) for k in ("samples", "skipped", "truncated", "failed")}
        from orch.runtime.data.problems import PROBLEMS_FILE

        listed = Path(workdir) / PROBLEMS_FILE
        out.print(
            f"data: {total['samples']} samples over {len(counts)} steps; {total['skipped']} skipped (no longer "
            f"parse), {total['truncated']} truncated to seq_len, {total['failed']} with media gone or that did not "
            "decode (trained nothing)" + (f"; the media: {listed}" if listed.is_file() else "")
        )
    out.print(f"metrics written to [bold]{workdir}/metrics.jsonl[/]")
    if trace is not None and Path(trace).exists():
        out.print(f"trace written to [bold]{trace}[/]")


def launch_data(
    plan: Any,
    data: str,
    tokenizer: str | None,
    index_dir: str | None,
    media_root: str | None,
    use_audio_in_video: bool = False,
) -> Any:
    """`--data` read as `orch plan --data` reads it (`data_spec_for`). Conversation data is trained at the plan's
    global batch and seq_len, what its layouts were chosen for; a data spec file or preset carries its own."""
    from orch.cli.data_cmd import data_spec_for
    from orch.cli.output import console
    from orch.runtime.data.conversations import is_conversation_data

    planned = (plan.data.global_batch, plan.data.seq_len) if is_conversation_data(data) else (None, None)
    spec, hint = data_spec_for(
        plan.model,
        data,
        "launched on",
        *planned,
        tokenizer or plan.data.tokenizer,
        index_dir,
        media_root,
        use_audio_in_video,
    )
    if hint is not None:
        from rich.markup import escape

        console().print(f"hint: {escape(hint)}")
    return spec


@contextmanager
def _divergence_said(task: Any) -> Iterator[None]:
    """A run that stopped because a step diverged is said as such, in the line every rank raised
    (runtime/train/divergence.py), not as one rank's failure."""
    from orch.runtime.launch.base import LaunchError

    try:
        yield
    except LaunchError:
        diverged = task.diverged()
        if diverged is None:
            raise
        raise diverged from None


def report_backends(text: str) -> list[str]:
    """`--report-to tensorboard,wandb` as HF Trainer spells it: comma-separated names, `none` for nothing (the
    names are checked by TrainSpec, as the config file's are)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return [n for n in names if n != "none"]


def _where(field: str, given: dict[str, Any], config: str | None, message: str) -> Exception:
    """A bad value of `field`: named by its flag when given on the command line, else by the file and field."""
    from orch.planner.errors import SpecError

    if field in given:
        return SpecError(_flag(field), "", message)
    return SpecError(config or "train config", field, message)


def train_spec(config: str | None, given: dict[str, Any]) -> Any:
    """The run's TrainSpec: the --config file (or TrainSpec's defaults) with the flags given on top. The one
    model validates both: a bad value is one line naming the flag, or the file and field."""
    from pydantic import ValidationError

    from orch.planner.errors import SpecError, SpecErrors
    from orch.planner.loading import load_json_file, validation_errors
    from orch.runtime.train.config import TrainSpec

    base = load_json_file(TrainSpec, config) if config else TrainSpec()
    try:
        return TrainSpec.model_validate({**base.model_dump(exclude_unset=True), **given})
    except ValidationError as exc:
        source = config or "train config"
        flags = [e for e in exc.errors() if e["loc"] and e["loc"][0] in given]
        if not flags:
            raise validation_errors(source, exc, TrainSpec) from None
        raise SpecErrors([SpecError(_flag(str(e["loc"][0])), "", _flag_message(e)) for e in flags]) from None


def _flag_message(err: Any) -> str:
    """A flag's pydantic error as the CLI words it: what was expected, and what was given."""
    ctx, got = err.get("ctx", {}), err.get("input")
    if err["type"] in ("literal_error", "enum"):
        choices = str(ctx.get("expected", "")).replace(" or ", ", ").replace("'", "")
        return f"expected one of {choices}, got '{got}'"
    if err["type"] in ("greater_than_equal", "greater_than"):
        bound = format(ctx.get("ge", ctx.get("gt")), "g")  # the field's bound: 0, not 0.0
        return f"expected a value {'>=' if err['type'] == 'greater_than_equal' else '>'} {bound}, got {got}"
    if err["type"] == "finite_number":
        return f"expected a finite number, got {got}"
    if err["type"] == "value_error":  # a validator's own words
        return str(err["msg"]).removeprefix("Value error, ")
    return f"{err['msg']} (got {got!r})"


def register(app: typer.Typer) -> None:
    app.command(cls=LaunchCommand)(launch)


def _say_stopped(out: Any, by: str | None, at: int | None) -> None:
    """The one line of a run that a stop signal ended after its ranks saved a checkpoint."""
    if by is None or at is None:
        return
    from orch.runtime.workdir.run_dir import step_name

    out.print(
        f"stopped at step {at} by {by}; checkpoint {step_name(at)}; relaunch the same command to resume",
        soft_wrap=True,
    )
