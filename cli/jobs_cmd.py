"""`orch status/logs/cancel JOB` for Slurm jobs (`orch status WORKDIR` for a local or torchrun run too), and the
Slurm side of `orch launch` (submit, dry run, --wait).

The runtime submits (runtime/launch/slurm.py) and reads states (runtime/launch/jobs.py, torch-free, so
`orch status/logs/cancel` start as fast as `orch --help`); this module only renders them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from orch.planner.plan import Plan
    from orch.planner.specs import DataSpec
    from orch.runtime.launch.jobs import JobStatus
    from orch.runtime.launch.sbatch import SlurmOptions
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.debug import DebugConfig

_POLL_S = 2.0


def launch_slurm(
    plan: Plan,
    data: DataSpec,
    cfg: TrainConfig,
    opts: SlurmOptions,
    *,
    workdir: str,
    dry_run: bool,
    wait: bool,
    debug: DebugConfig | None = None,
    source: str = "plan",
) -> None:
    """Called by `orch launch --executor slurm`: print the sbatch script (--dry-run) or submit.

    `debug`: the tests' fault injection (never set by the CLI)."""
    from orch.cli.output import console, print_json_text
    from orch.runtime.launch.sbatch import allocation
    from orch.runtime.launch.slurm import plan_parameters, submit_train

    out = console()
    nodes, per_node = allocation(plan)
    params, script = plan_parameters(plan, opts, workdir, source)
    summary = (
        f"{plan.placement.value} plan: {plan.world_size} ranks on {nodes} node(s) x {per_node} task(s), "
        f"modules {', '.join(f'{n}:{m.layout.tp}tp/{m.layout.dp}dp' for n, m in plan.modules.items())}; "
        f"{cfg.steps} steps, {cfg.dtype}, time limit {params['time']} min"
    )
    if dry_run:
        out.print(summary, soft_wrap=True)
        print_json_text(script)
        out.print("dry run: nothing submitted")
        return
    record = submit_train(plan, data, cfg, opts, workdir=workdir, debug=debug, params=params).record
    out.print(summary, soft_wrap=True)
    out.print(
        f"submitted job [bold]{record.job_id}[/]; logs in {record.log_folder}, metrics in {record.workdir}",
        soft_wrap=True,
    )
    typer.echo(record.job_id)
    if wait:
        final = _watch_or_detach(record.job_id)
        if final.state != "COMPLETED":
            raise _job_failed(final)


def _watch_or_detach(job_id: str) -> JobStatus:
    """`--wait`: follow the job; Ctrl-C stops following, not the job (one line saying so, not click's "Aborted!")."""
    from orch.planner.errors import OrchError

    try:
        return _watch(job_id)
    except KeyboardInterrupt:
        raise OrchError(
            f"stopped following job {job_id}; it keeps running: orch status {job_id}, orch cancel {job_id}"
        ) from None


def _job_failed(status: JobStatus) -> Exception:
    from orch.planner.errors import OrchError

    if status.failure is not None:
        f = status.failure
        where = f"log: {f.log}" if f.by_rank or f.kind == "node_fail" else f"logs: {status.log_folder}"
        return OrchError(f"job {status.job_id} {status.state}: {f.summary} ({where})")
    return OrchError(f"job {status.job_id} ended {status.state} (exit {status.exit_code}; logs: {status.log_folder})")


def _line(status: JobStatus) -> str:
    step = "-" if status.step is None else str(status.step)
    loss = "-" if status.loss is None else f"{status.loss:.6f}"
    return f"job {status.job_id}  {status.state:<10} elapsed {status.elapsed or '-':<9} step {step:<5} loss {loss}"


def _watch(job_id: str) -> JobStatus:
    """A live line (state, elapsed, latest step/loss) until the job reaches a terminal state.

    On a terminal the line is redrawn in place; otherwise (a CI log, a pipe) rich would only print the final
    line, so a line is printed whenever the state or the step changes, and the final one."""
    from rich.live import Live

    from orch.cli.output import console
    from orch.runtime.launch.job_status import job_status
    from orch.runtime.launch.partition import stuck_reason

    out = console()
    status = job_status(job_id)
    if not out.is_terminal:
        seen = (status.state, status.step)
        out.print(_line(status))
        while not status.done:
            stuck_reason(status)
            time.sleep(_POLL_S)
            status = job_status(job_id)
            if (status.state, status.step) != seen or status.done:
                seen = (status.state, status.step)
                out.print(_line(status))
        return status
    with Live(_line(status), console=out, refresh_per_second=2, transient=False) as live:
        while not status.done:
            stuck_reason(status)
            time.sleep(_POLL_S)
            status = job_status(job_id)
            live.update(_line(status))
    return status


def status(
    job: str = typer.Argument(
        ..., metavar="JOB|WORKDIR", help="Slurm job id printed by `orch launch`, or a local or torchrun run's workdir."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the status as JSON on stdout."),
) -> None:
    """A Slurm job's state, elapsed time, latest step/loss and, for a failed job, the failing rank, its error and
    log; or a run directory's: running, stopped, failed or finished, the lock's holder, each rank's heartbeat."""
    from rich.markup import escape

    from orch.cli.output import console, print_json
    from orch.planner.errors import OrchError
    from orch.runtime.launch.job_status import job_status
    from orch.runtime.launch.run_status import is_run_dir

    if is_run_dir(job) or (Path(job).is_dir() and not job.isdigit()):
        _run_status(job, json_out)
        return
    if not job.isdigit():
        raise OrchError(f"{job}: neither a Slurm job id nor a run directory (`orch launch --workdir`)")
    st = job_status(job)
    if json_out:
        print_json(st)
        return
    out = console()
    # soft_wrap: paths stay on one line (copy-pastable) whatever the terminal's width.
    out.print(_line(st))
    if st.reason:
        out.print(f"pending: Reason={st.reason}")
    out.print(f"workdir {st.workdir}  logs {st.log_folder}", soft_wrap=True)
    if st.failure is not None:
        out.print(f"[red]{escape(st.failure.summary)}[/]", soft_wrap=True)
        if st.failure.by_rank or st.failure.kind == "node_fail":
            out.print(f"log: {st.failure.log}", soft_wrap=True)


def _run_status(workdir: str, json_out: bool) -> None:
    """`orch status WORKDIR`: the run's state line, the lock's holder, a line per rank's heartbeat, and how it
    ended (runtime/launch/run_status.py)."""
    from rich.markup import escape

    from orch.cli.output import console, print_json
    from orch.runtime.launch.run_status import is_frozen, run_status

    st = run_status(workdir)
    if json_out:
        print_json(st)
        return
    out = console()
    step = "-" if st.step is None else str(st.step)
    of = "" if st.steps is None else f" of {st.steps}"
    loss = "-" if st.loss is None else f"{st.loss:.6f}"
    out.print(f"run {escape(st.workdir)}  {st.state:<11} step {step}{of}  loss {loss}", soft_wrap=True)
    h = st.holder
    if h is None:
        out.print("lock: free")
    else:
        alive = "alive" if h.alive else ("gone" if h.alive is False else "on another host: not checked from here")
        out.print(f"lock: {'held' if h.held else 'free, still naming'} {escape(h.describe)}: {alive}", soft_wrap=True)
    for b in st.ranks:
        where = b.phase if b.step is None else f"step {b.step} {b.phase}"
        frozen = " (frozen: its process is stopped)" if st.state == "running" and is_frozen(b) else ""
        out.print(f"rank {b.rank}  pid {b.pid}  {escape(where)}  {_age(b.progress_age_s)} ago{frozen}")
    if st.state == "stopped":
        out.print(f"stopped at step {st.stopped_at} by a signal; checkpoint {st.checkpoint}; relaunch the same command "
                  "to resume", soft_wrap=True)  # fmt: skip
    if st.failure is not None:
        out.print(f"[red]{escape(st.failure.summary)}[/]", soft_wrap=True)
        out.print(f"record: {st.failure.log}", soft_wrap=True)
    elif st.reason:
        out.print(f"[red]{escape(st.reason)}[/]", soft_wrap=True)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def logs(
    job_id: str = typer.Argument(..., metavar="JOB"),
    rank: int = typer.Option(0, "--rank", help="Task (global rank) whose log to print."),
    err: bool = typer.Option(
        False, "--err", help="The rank's stderr (tracebacks) instead of its stdout (submitit's log)."
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
) -> None:
    """Print a rank's log (submitit's WORKDIR/slurm/JOB/JOB_RANK_log.err|out) on stdout."""
    import sys

    from orch.planner.errors import OrchError
    from orch.runtime.launch.job_status import job_status
    from orch.runtime.launch.jobs import load_record, log_path

    record = load_record(job_id)
    if not 0 <= rank < record.world_size:
        raise OrchError(f"--rank {rank}: the job has ranks 0..{record.world_size - 1}")
    path = log_path(record, rank, "err" if err else "out")
    offset = 0
    while True:
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        elif not follow:
            raise OrchError(f"{path}: no log yet (job {job_id} may still be pending)")
        if not follow or (job_status(job_id).done and _settled(path, offset)):
            return
        time.sleep(_POLL_S)


def _settled(path: Path, offset: int) -> bool:
    return not path.exists() or path.stat().st_size <= offset


def cancel(job_id: str = typer.Argument(..., metavar="JOB")) -> None:
    """Cancel the job (scancel)."""
    from orch.cli.output import console
    from orch.runtime.launch.jobs import cancel as cancel_job

    cancel_job(job_id)
    console().print(f"cancel requested for job {job_id}")


def register(app: typer.Typer) -> None:
    app.command()(status)
    app.command()(logs)
    app.command()(cancel)
