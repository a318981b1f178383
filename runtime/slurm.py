"""The Slurm executor: one allocation of the plan's nodes through submitit, one task per rank.

Each task runs the same rank body as the local executor (runtime/local.py `_worker`), with its rank,
world size and rendezvous host from `submitit.JobEnvironment`. On Slurm's warning signal (preemption or
time limit) every task only flags it (`_StopOnSignal`); at the next step boundary the ranks agree on the
flag, save a checkpoint of that step collectively and return, and task 0 then runs submitit's own
checkpoint/requeue handler: `RankTask.checkpoint` returns a DelayedSubmission of itself, submitit requeues
the job, and the requeued job resumes from WORKDIR/checkpoints/latest (that checkpoint: no step is
recomputed), trimming metrics.jsonl back to it, as `run_local` does.

A small record per job (~/.orch/jobs/JOBID.json, or $ORCH_STATE_DIR/jobs) lets `orch status/logs/cancel`
find the workdir and the log folder; state comes from sacct (submitit reads it too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from orch.planner.errors import OrchError
from orch.planner.io import write_text_atomic
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.executor import RunConfig
from orch.runtime.slurm_sbatch import SlurmOptions, default_setup_text, executor_parameters, sbatch_text

TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


class JobRecord(BaseModel):
    job_id: str
    workdir: str
    log_folder: str
    world_size: int
    steps: int


class Failure(BaseModel):
    rank: int
    error: str
    log: str


class JobStatus(BaseModel):
    job_id: str
    state: str
    elapsed: str = ""
    exit_code: str = ""
    workdir: str
    log_folder: str
    step: int | None = None
    loss: float | None = None
    failure: Failure | None = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


def state_dir() -> Path:
    return Path(os.environ.get("ORCH_STATE_DIR") or Path.home() / ".orch") / "jobs"


def log_path(record: JobRecord, rank: int, stream: str = "out") -> Path:
    """submitit's per-task log: FOLDER/%j_%t_log.{out,err} (the folder is WORKDIR/slurm/%j)."""
    return Path(record.log_folder) / f"{record.job_id}_{rank}_log.{stream}"


def _prepare(workdir: Path, cfg: RunConfig, rank: int) -> int:
    """Steps already done (newest complete checkpoint, or 0); rank 0 trims metrics.jsonl back to it."""
    from orch.runtime.checkpoint import latest_step
    from orch.runtime.local import _failure_dir

    start = (latest_step(workdir) if cfg.resume else None) or 0
    if rank == 0:
        metrics = workdir / "metrics.jsonl"
        if start == 0:
            metrics.unlink(missing_ok=True)
        elif metrics.exists():
            kept = [ln for ln in metrics.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < start]
            write_text_atomic(metrics, "".join(ln + "\n" for ln in kept))
        shutil.rmtree(_failure_dir(str(workdir)), ignore_errors=True)
    return start


class _StopOnSignal:
    """Every task's handler of Slurm's warning signal, installed over submitit's (after its setup).

    The handler only sets checkpoint's stop flag: the ranks agree on it at the next step boundary, save a
    checkpoint there and return; then task 0 runs submitit's own handler (`requeue`), which calls
    `RankTask.checkpoint`, requeues the job (`scontrol requeue`) and exits. If the ranks have not reached a
    step boundary `grace_s` after the signal (a step longer than the signal's lead time), task 0 requeues
    anyway, from the newest complete checkpoint, rather than let the time limit end the job unrequeued.
    """

    def __init__(self, rank: int, grace_s: float | None) -> None:
        import signal
        import threading

        from orch.runtime import checkpoint

        self.rank = rank
        self.grace_s = grace_s
        self.signum = signal.SIGUSR2  # submitit's SlurmJobEnvironment.USR_SIG, the `--signal` of the sbatch script
        self.submitit_handler = signal.getsignal(self.signum)
        self._lock = threading.Lock()
        self._requeued = False
        self._timer: threading.Timer | None = None
        checkpoint.arm_stop_request()
        signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        import threading

        from orch.runtime import checkpoint

        checkpoint.request_stop()
        if self.rank == 0 and self.grace_s is not None and self._timer is None:
            self._timer = threading.Timer(self.grace_s, self._late)
            self._timer.daemon = True
            self._timer.start()

    def requeue(self) -> None:
        """Task 0, after the ranks saved at the signal: submitit's checkpoint/requeue (exits the process)."""
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._requeued:
                return
            self._requeued = True
        if callable(self.submitit_handler):
            self.submitit_handler(self.signum, None)

    def _late(self) -> None:
        from orch.runtime import checkpoint

        if checkpoint.stopped_at() is not None:
            return
        print(f"orch: no step boundary {self.grace_s:.0f} s after the warning signal: requeue", file=sys.stderr)
        try:
            self.requeue()
        finally:
            os._exit(1)  # a thread cannot sys.exit the process; the requeued job resumes from `latest`


class RankTask:
    """The submitit callable: one instance runs in every task of the allocation."""

    def __init__(
        self,
        plan_json: str,
        data_json: str,
        cfg: RunConfig,
        workdir: str,
        timeout_s: float = 120,
        grace_s: float | None = None,
    ) -> None:
        self.plan_json = plan_json
        self.data_json = data_json
        self.cfg = cfg
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.grace_s = grace_s  # after the warning signal, requeue anyway if no step boundary came by then

    def __call__(self) -> None:
        import submitit

        from orch.runtime import checkpoint
        from orch.runtime.local import _Job, _worker

        env = submitit.JobEnvironment()
        stop = _StopOnSignal(env.global_rank, self.grace_s)
        plan = Plan.model_validate_json(self.plan_json)
        if env.num_tasks != plan.world_size:
            raise OrchError(f"the allocation has {env.num_tasks} tasks, the plan needs {plan.world_size}")
        workdir = Path(self.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        start = _prepare(workdir, self.cfg, env.global_rank)
        if start >= self.cfg.steps:
            return
        # A port per job incarnation: a requeued job must not meet its predecessor's TIME_WAIT sockets.
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        job_id = int("".join(c for c in str(env.job_id) if c.isdigit()) or 0)
        port = 20000 + (job_id * 7 + restart) % 20000
        job = _Job(
            self.plan_json,
            self.data_json,
            self.cfg,
            str(workdir),
            port,
            env.num_tasks,
            self.timeout_s,
            start,
            master=env.hostnames[0],
            # Device and backend (runtime/device.py) are chosen in the task, on its node: cuda:{local_rank}
            # with NCCL when the node has a GPU per task (one task per GPU, runtime/slurm_sbatch.py), else gloo.
            local_rank=env.local_rank,
            local_ranks=env.num_tasks // max(1, env.num_nodes),
        )
        _worker(env.global_rank, job)
        step = checkpoint.stopped_at()
        if step is not None:  # the warning signal: every rank saved step_{step}; task 0 requeues, the others end
            print(f"orch: warning signal: saved checkpoint step {step}, requeueing", file=sys.stderr, flush=True)
            if env.global_rank == 0:
                stop.requeue()

    def checkpoint(self, *args: object, **kwargs: object) -> object:
        """submitit's handler calls this (task 0, after the save at the signal): requeue the same task; it
        resumes from `latest`."""
        import submitit

        return submitit.helpers.DelayedSubmission(
            RankTask(self.plan_json, self.data_json, self.cfg, self.workdir, self.timeout_s, self.grace_s)
        )


def build_executor_parameters(
    plan: Plan, opts: SlurmOptions, workdir: str | os.PathLike[str]
) -> tuple[dict[str, object], str]:
    """(submitit parameters, sbatch text) for `plan`; validates every flag and setup value."""
    setup = default_setup_text() if opts.setup is None else _read_setup(opts.setup)
    folder = str(Path(workdir).absolute() / "slurm" / "%j")
    params = executor_parameters(plan, opts, str(Path(workdir).absolute()), setup)
    return params, sbatch_text(params, folder, _python())


def _python() -> str:
    import shlex

    return shlex.quote(sys.executable)


def _read_setup(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise OrchError(f"{path}: cannot read the setup file: {exc.strerror}") from None


def submit(
    plan: Plan, data: DataSpec, cfg: RunConfig, opts: SlurmOptions, *, workdir: str | os.PathLike[str]
) -> JobRecord:
    """Submit the plan as one allocation; return (and store) its job record."""
    import submitit

    out = Path(workdir).absolute()
    params, _ = build_executor_parameters(plan, opts, out)
    out.mkdir(parents=True, exist_ok=True)
    executor = submitit.SlurmExecutor(folder=out / "slurm" / "%j", max_num_timeout=3)
    executor.update_parameters(**params)
    # Half the warning signal's lead time to reach a step boundary and save; the rest to requeue and exit.
    grace_s = float(params["signal_delay_s"]) / 2  # type: ignore[arg-type]
    task = RankTask(plan.model_dump_json(), data.model_dump_json(), cfg, str(out), grace_s=grace_s)
    try:
        job = executor.submit(task)
    except (subprocess.CalledProcessError, FileNotFoundError, RuntimeError) as exc:
        raise OrchError(f"sbatch failed: {_last_line(str(exc))}") from None
    record = JobRecord(
        job_id=str(job.job_id),
        workdir=str(out),
        log_folder=str(job.paths.folder),
        world_size=plan.world_size,
        steps=cfg.steps,
    )
    write_text_atomic(state_dir() / f"{record.job_id}.json", record.model_dump_json(indent=2) + "\n")
    return record


def load_record(job_id: str) -> JobRecord:
    if not job_id.isdigit():
        raise OrchError(f"{job_id!r} is not a Slurm job id")
    path = state_dir() / f"{job_id}.json"
    try:
        return JobRecord.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise OrchError(
            f"job {job_id}: no record in {state_dir()} (submitted with `orch launch --executor slurm`?)"
        ) from None


def _run(cmd: list[str], timeout: float = 20) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        raise OrchError(f"{cmd[0]} did not answer: {exc}") from None


def slurm_state(job_id: str) -> tuple[str, str, str]:
    """(state, elapsed, exit code) from sacct (the allocation's own line), else squeue, else UNKNOWN."""
    lines = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,Elapsed,ExitCode"]).strip().splitlines()
    if lines:
        state, elapsed, code = [*lines[-1].split("|"), "", "", ""][:3]
        return state.split()[0] if state else "UNKNOWN", elapsed, code
    queued = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%M"]).strip().splitlines()
    if queued:
        state, elapsed = [*queued[0].split("|"), ""][:2]
        return state, elapsed, ""
    return "UNKNOWN", "", ""


def job_status(job_id: str) -> JobStatus:
    from orch.runtime.local import _first_failure

    record = load_record(job_id)
    state, elapsed, code = slurm_state(job_id)
    status = JobStatus(
        job_id=job_id,
        state=state,
        elapsed=elapsed,
        exit_code=code,
        workdir=record.workdir,
        log_folder=record.log_folder,
    )
    metrics = Path(record.workdir) / "metrics.jsonl"
    if metrics.exists():
        lines = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
        if lines:
            try:
                last = json.loads(lines[-1])
                status.step, status.loss = int(last["step"]), float(last["loss"])
            except (json.JSONDecodeError, KeyError, ValueError):
                pass
    first = _first_failure(Path(record.workdir))
    if first is not None and state != "COMPLETED":
        rank, message = first
        status.failure = Failure(rank=rank, error=message, log=str(log_path(record, rank, "err")))
    return status


def cancel(job_id: str) -> None:
    load_record(job_id)
    try:
        done = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=20, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        raise OrchError(f"scancel did not answer: {exc}") from None
    if done.returncode != 0:
        raise OrchError(f"scancel {job_id}: {_last_line(done.stderr)}")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"


__all__ = ["JobRecord", "JobStatus", "RankTask", "cancel", "job_status", "load_record", "log_path", "submit"]
