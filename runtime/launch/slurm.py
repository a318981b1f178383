"""The Slurm launcher: one allocation through submitit, one task per rank, running any launcher task.

Each Slurm task takes its place from submitit's JobEnvironment (`RankEnv.from_submitit`) and runs the
task's rank body through the same rank-start path as the local launcher (runtime/launch/rank.py). Rank 0
prepares the task (`Task.prepare`: for training, metrics trimmed back to the checkpoint it resumes from)
before the rendezvous.

Preemption: on Slurm's warning signal (preemption or time limit) every task only flags it
(`_StopOnSignal`, a runtime/preemption.py `Preemption`); at the next step boundary the ranks agree on
the flag, save a checkpoint of that step collectively and return, and task 0 then runs submitit's own
checkpoint/requeue handler: `SlurmTask.checkpoint` returns a DelayedSubmission of itself, submitit
requeues the job, and the requeued job resumes from WORKDIR/checkpoints/latest (no step is recomputed).

The watchdog: task 0 reads the ranks' heartbeats (runtime/launch/heartbeat.py); when a rank made no progress
for the task's `watchdog_s` it records that rank's stall and cancels the job (`orch status` names the rank and
its last phase). A stopped task 0 cannot watch: the others' collectives then time out and the post-mortem
blames it from the heartbeats.

Job records, states and post-mortems (torch-free, for `orch status/logs/cancel`): runtime/launch/jobs.py
and runtime/launch/diagnose.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orch.planner.errors import OrchError
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.launch.base import Handle, LaunchError
from orch.runtime.launch.diagnose import REFUSED, record_node
from orch.runtime.launch.failures import last_line, record_stall
from orch.runtime.launch.heartbeat import Stall, Watchdog
from orch.runtime.launch.job_status import job_status
from orch.runtime.launch.jobs import JobRecord, JobStatus, log_path, save_record
from orch.runtime.launch.partition import fit_to_partition, read_partition, stuck_reason
from orch.runtime.launch.rank import RankEnv, Task, run_rank
from orch.runtime.launch.sbatch import SlurmOptions, default_setup_text, executor_parameters, sbatch_text
from orch.runtime.preemption import Preemption
from orch.runtime.workdir.files import make_workdir

if TYPE_CHECKING:  # launch/ knows tasks through base.Task; training is imported by submit_train alone
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.debug import DebugConfig

POLL_S = 2.0


class _StopOnSignal:
    """Every task's handler of Slurm's warning signal, installed over submitit's (after its setup).

    The handler only flags `self.preemption`: the ranks agree on it at the next step boundary, save a
    checkpoint there and return; then task 0 runs submitit's own handler (`requeue`), which calls
    `SlurmTask.checkpoint`, requeues the job (`scontrol requeue`) and exits. If the ranks have not reached a
    step boundary `grace_s` after the signal (a step longer than the signal's lead time), task 0 requeues
    anyway, from the newest complete checkpoint, rather than let the time limit end the job unrequeued.
    """

    def __init__(self, rank: int, grace_s: float | None) -> None:
        import signal
        import threading

        self.rank = rank
        self.grace_s = grace_s
        self.signum = signal.SIGUSR2  # submitit's SlurmJobEnvironment.USR_SIG, the `--signal` of the sbatch script
        self.submitit_handler = signal.getsignal(self.signum)
        self._lock = threading.Lock()
        self._requeued = False
        self._timer: threading.Timer | None = None
        self.preemption = Preemption(armed=True)
        signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        import threading

        self.preemption.request()
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
        _allow_requeue()
        if callable(self.submitit_handler):
            self.submitit_handler(self.signum, None)

    def _late(self) -> None:
        if self.preemption.stopped_at is not None:
            return
        print(f"orch: no step boundary {self.grace_s:.0f} s after the warning signal: requeue", file=sys.stderr)
        try:
            self.requeue()
        finally:
            os._exit(1)  # a thread cannot sys.exit the process; the requeued job resumes from `latest`


def _allow_requeue() -> None:
    """orch submits with --no-requeue, so that a node failure ends the job rather than requeueing it to wait for
    nodes; its own requeue at the warning signal needs the job requeueable (`scontrol requeue` refuses otherwise)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return
    try:
        done = subprocess.run(
            ["scontrol", "update", f"jobid={job_id}", "Requeue=1"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"orch: cannot make job {job_id} requeueable: {exc}", file=sys.stderr, flush=True)
        return
    if done.returncode != 0:
        print(f"orch: scontrol update Requeue=1: {done.stderr.strip()}", file=sys.stderr, flush=True)


def _end_stalled_job(workdir: Path, job_id: str, stall: Stall) -> None:
    """The watchdog named a rank that stopped: record why (`orch status` reads it before sacct's CANCELLED) and
    cancel the job, whose stopped rank would otherwise hold it until its time limit."""
    record_stall(workdir, stall.rank, stall.message)
    print(f"orch: {stall.message}", file=sys.stderr, flush=True)
    try:
        subprocess.run(["scancel", str(job_id)], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"orch: scancel {job_id}: {exc}", file=sys.stderr, flush=True)


class SlurmTask:
    """The submitit callable: one instance runs in every Slurm task of the allocation."""

    def __init__(self, task: Task, grace_s: float | None = None) -> None:
        self.task = task
        self.grace_s = grace_s  # after the warning signal, requeue anyway if no step boundary came by then

    def __call__(self) -> None:
        env = RankEnv.from_submitit(self.task.device)
        stop = _StopOnSignal(env.rank, self.grace_s)
        if env.world != self.task.world_size:
            raise OrchError(f"the allocation has {env.world} tasks, the task needs {self.task.world_size}")
        workdir = make_workdir(self.task.workdir)
        record_node(workdir, env.job_id, env.rank)
        refusal: str | None = None
        if env.rank == 0:
            try:
                self.task.prepare()  # before the rendezvous: no rank has started its body yet
            except OrchError as exc:
                refusal = str(exc)  # said to every rank once they meet (run_rank), not left to their timeout
                print(f"{REFUSED}{refusal}", file=sys.stderr, flush=True)  # what `orch status` reads
        limit = float(getattr(self.task, "watchdog_s", 0.0) or 0.0)
        watchdog = Watchdog(workdir, limit, lambda stall: _end_stalled_job(workdir, env.job_id, stall))
        if env.rank == 0 and refusal is None:  # a refused run's workdir holds another run's heartbeats
            watchdog.start()
        try:
            ctx = run_rank(self.task, env, preemption=stop.preemption, log_steps=True, prepared=(refusal,))
        finally:
            watchdog.stop()
        step = ctx.preemption.stopped_at
        if step is not None:  # the warning signal: every rank saved step_{step}; task 0 requeues, the others end
            print(f"orch: warning signal: saved checkpoint step {step}, requeueing", file=sys.stderr, flush=True)
            if env.rank == 0:
                stop.requeue()

    def checkpoint(self, *args: object, **kwargs: object) -> object:
        """submitit's handler calls this (task 0, after the save at the signal): requeue the same task; it
        resumes from `latest`."""
        import submitit

        return submitit.helpers.DelayedSubmission(SlurmTask(self.task, self.grace_s))


@dataclass
class SlurmLauncher:
    """Submits tasks as one allocation with these submitit parameters (`plan_parameters`, or a profile's)."""

    params: dict[str, object]

    def submit(self, task: Task) -> SlurmHandle:
        import submitit

        out = make_workdir(Path(task.workdir).absolute())  # before submitit makes its folder inside it
        # Half the warning signal's lead time to reach a step boundary and save; the rest to requeue and exit.
        grace_s = float(self.params["signal_delay_s"]) / 2  # type: ignore[arg-type]
        executor = submitit.SlurmExecutor(folder=out / "slurm" / "%j", max_num_timeout=3)
        executor.update_parameters(**self.params)
        try:
            job = executor.submit(SlurmTask(task, grace_s))
        except (subprocess.CalledProcessError, FileNotFoundError, RuntimeError) as exc:
            raise OrchError(f"sbatch failed: {last_line(str(exc))}") from None
        record = JobRecord(
            job_id=str(job.job_id),
            workdir=str(out),
            log_folder=str(job.paths.folder),
            world_size=task.world_size,
            steps=int(getattr(getattr(task, "cfg", None), "steps", 0)),
            tasks_per_node=int(self.params["ntasks_per_node"]),  # type: ignore[call-overload]
        )
        save_record(record)
        return SlurmHandle(record, task)


class SlurmHandle(Handle):
    """A submitted job: its state from sacct, its root cause from the post-mortem, its logs from submitit's files."""

    def __init__(self, record: JobRecord, task: Task | None = None) -> None:
        self.record, self.task, self.job_id = record, task, record.job_id

    def status(self) -> JobStatus:
        return job_status(self.job_id)

    def state(self) -> str:
        return self.status().state

    def wait(self, poll_s: float = POLL_S) -> None:
        status = self.status()
        while not status.done:
            stuck_reason(status)  # a job that can never start is cancelled, with why
            time.sleep(poll_s)
            status = self.status()
        if status.state != "COMPLETED":
            failure = status.failure
            if failure is not None and failure.by_rank:
                raise LaunchError(failure.rank, f"{failure.error} (log: {failure.log})")
            if failure is not None and failure.kind != "node_fail":
                raise OrchError(f"job {self.job_id} {failure.summary} (logs: {status.log_folder})")
            raise OrchError(f"job {self.job_id} ended {status.state} (logs: {status.log_folder})")

    def result(self) -> Any:
        self.wait()
        if self.task is None:
            raise OrchError(f"job {self.job_id}: no task to read a result with")
        return self.task.result()

    def logs(self, rank: int = 0) -> str:
        parts = []
        for stream in ("out", "err"):
            path = log_path(self.record, rank, stream)
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "".join(parts)


def plan_parameters(
    plan: Plan, opts: SlurmOptions, workdir: str | os.PathLike[str], source: str = "plan"
) -> tuple[dict[str, object], str]:
    """(submitit parameters, sbatch text) of a training plan; validates every flag and setup value."""
    setup = setup_text(opts)
    folder = str(Path(workdir).absolute() / "slurm" / "%j")
    params = executor_parameters(plan, opts, str(Path(workdir).absolute()), setup)
    memory = max((m.memory_gb for m in plan.modules.values()), default=0.0)  # a GPU's, all its modules
    given = plan.cluster.cpus_per_gpu is not None
    part = read_partition(opts.partition)
    params = fit_to_partition(params, part, cpus_given=given, memory_gb_per_rank=memory, source=source)
    return params, sbatch_text(params, folder, python_command())


def submit_train(
    plan: Plan,
    data: DataSpec,
    cfg: TrainConfig,
    opts: SlurmOptions,
    *,
    workdir: str | os.PathLike[str],
    debug: DebugConfig | None = None,
    params: dict[str, object] | None = None,
) -> SlurmHandle:
    """Train `plan` as one allocation (`orch launch --executor slurm`); the handle of the submitted job.

    `params`: `plan_parameters`' result when the caller already has it (the partition is read once)."""
    from orch.runtime.train.debug import DebugConfig
    from orch.runtime.train.trainer import TrainTask

    out = Path(workdir).absolute()
    if params is None:
        params, _ = plan_parameters(plan, opts, out)
    task = TrainTask(plan, data, cfg, str(out), debug or DebugConfig(), timeout_s=120.0)
    return SlurmLauncher(params).submit(task)


def python_command() -> str:
    import shlex

    return shlex.quote(sys.executable)


def setup_text(opts: SlurmOptions) -> str:
    """The set-up lines: the documented default or the user's --setup file."""
    return default_setup_text() if opts.setup is None else _read_setup(opts.setup)


def _read_setup(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise OrchError(f"{path}: cannot read the setup file: {exc.strerror}") from None


__all__ = ["SlurmHandle", "SlurmLauncher", "SlurmTask", "plan_parameters", "setup_text", "submit_train"]
