"""The Slurm executor: one allocation of the plan's nodes through submitit, one task per rank.

Each task runs the same rank body as the local executor (runtime/launch/local.py `_worker`), with its rank,
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
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from orch.planner.errors import OrchError
from orch.planner.io import write_text_atomic
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.launch.sbatch import SlurmOptions, default_setup_text, executor_parameters, sbatch_text
from orch.runtime.train.step import RunConfig

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
    tasks_per_node: int | None = None  # None in records written before it was kept: world_size / nodes


class Failure(BaseModel):
    """Why a job failed. `kind`: "error" (a rank raised), "oom" (a rank ran out of memory: its allocator
    refused, or Slurm killed its node's ranks over --mem) or "node_fail" (a node of the allocation died)."""

    rank: int
    error: str
    log: str
    kind: str = "error"
    node: str | None = None
    ranks: list[int] = []  # node_fail: the ranks that were on the failed node

    @property
    def summary(self) -> str:
        if self.kind == "node_fail":
            return self.error
        return f"rank {self.rank} failed: {self.error}"


class JobStatus(BaseModel):
    job_id: str
    state: str
    elapsed: str = ""
    exit_code: str = ""
    nodes: str = ""  # the allocation's node list (Slurm's notation)
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


def _ranks_dir(workdir: Path) -> Path:
    return workdir / ".ranks"


def _record_node(workdir: Path, job_id: str, rank: int) -> None:
    """Each task records the node it runs on: the job's real task layout, for `orch status` after a node dies."""
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    write_text_atomic(_ranks_dir(workdir) / f"rank{rank}.json", json.dumps({"job_id": job_id, "node": node}))


def _prepare(workdir: Path, cfg: RunConfig, rank: int) -> int:
    """Steps already done (newest complete checkpoint, or 0); rank 0 trims metrics.jsonl back to it."""
    from orch.runtime.checkpoint import latest_step
    from orch.runtime.launch.local import _failure_dir

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
        _allow_requeue()
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
        from orch.runtime.launch.local import _Job, _worker

        env = submitit.JobEnvironment()
        stop = _StopOnSignal(env.global_rank, self.grace_s)
        plan = Plan.model_validate_json(self.plan_json)
        if env.num_tasks != plan.world_size:
            raise OrchError(f"the allocation has {env.num_tasks} tasks, the plan needs {plan.world_size}")
        workdir = Path(self.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        _record_node(workdir, str(env.job_id), env.global_rank)
        start = _prepare(workdir, self.cfg, env.global_rank)
        if start >= self.cfg.steps:
            return
        port = rendezvous_port(env.job_id)
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
            log_steps=True,
            # Device and backend (runtime/device.py) are chosen in the task, on its node: cuda:{local_rank}
            # with NCCL when the node has a GPU per task (one task per GPU, runtime/launch/sbatch.py), else gloo.
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
    setup = setup_text(opts)
    folder = str(Path(workdir).absolute() / "slurm" / "%j")
    params = executor_parameters(plan, opts, str(Path(workdir).absolute()), setup)
    return params, sbatch_text(params, folder, _python())


def _python() -> str:
    import shlex

    return shlex.quote(sys.executable)


def rendezvous_port(job_id: object) -> int:
    """The rank-0 port of a job: one per job incarnation, so a requeued job never meets its predecessor's
    TIME_WAIT sockets."""
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    digits = int("".join(c for c in str(job_id) if c.isdigit()) or 0)
    return 20000 + (digits * 7 + restart) % 20000


def setup_text(opts: SlurmOptions) -> str:
    """The set-up lines: the documented default or the user's --setup file."""
    return default_setup_text() if opts.setup is None else _read_setup(opts.setup)


def _read_setup(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise OrchError(f"{path}: cannot read the setup file: {exc.strerror}") from None


def submit(
    plan: Plan, data: DataSpec, cfg: RunConfig, opts: SlurmOptions, *, workdir: str | os.PathLike[str]
) -> JobRecord:
    """Submit the plan as one allocation; return (and store) its job record."""
    out = Path(workdir).absolute()
    params, _ = build_executor_parameters(plan, opts, out)
    # Half the warning signal's lead time to reach a step boundary and save; the rest to requeue and exit.
    grace_s = float(params["signal_delay_s"]) / 2  # type: ignore[arg-type]
    task = RankTask(plan.model_dump_json(), data.model_dump_json(), cfg, str(out), grace_s=grace_s)
    return submit_task(task, params, out, world_size=plan.world_size, steps=cfg.steps)


def submit_task(task: object, params: dict[str, object], out: Path, *, world_size: int, steps: int) -> JobRecord:
    """Submit one submitit callable as an allocation with `params`; return (and store) its job record, so
    `orch status`, `logs` and `cancel` know it."""
    import submitit

    out.mkdir(parents=True, exist_ok=True)
    executor = submitit.SlurmExecutor(folder=out / "slurm" / "%j", max_num_timeout=3)
    executor.update_parameters(**params)
    try:
        job = executor.submit(task)
    except (subprocess.CalledProcessError, FileNotFoundError, RuntimeError) as exc:
        raise OrchError(f"sbatch failed: {_last_line(str(exc))}") from None
    record = JobRecord(
        job_id=str(job.job_id),
        workdir=str(out),
        log_folder=str(job.paths.folder),
        world_size=world_size,
        steps=steps,
        tasks_per_node=int(params["ntasks_per_node"]),  # type: ignore[call-overload]
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


class Accounting(BaseModel):
    """The allocation's own sacct line (or squeue's, before accounting has it)."""

    state: str = "UNKNOWN"
    elapsed: str = ""
    exit_code: str = ""
    nodes: str = ""
    start: str = ""
    end: str = ""


def accounting(job_id: str) -> Accounting:
    """State, elapsed time, exit code, node list, start and end from sacct, else squeue, else UNKNOWN."""
    fields = ["State", "Elapsed", "ExitCode", "NodeList", "Start", "End"]
    lines = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", ",".join(fields)]).strip().splitlines()
    if lines:
        state, elapsed, code, nodes, start, end = [*lines[-1].split("|"), *[""] * 6][:6]
        return Accounting(
            state=state.split()[0] if state else "UNKNOWN",
            elapsed=elapsed,
            exit_code=code,
            nodes="" if nodes == "None assigned" else nodes,
            start=start,
            end=end,
        )
    queued = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%M|%N"]).strip().splitlines()
    if queued:
        state, elapsed, nodes = [*queued[0].split("|"), "", ""][:3]
        return Accounting(state=state, elapsed=elapsed, nodes=nodes)
    return Accounting()


def slurm_state(job_id: str) -> tuple[str, str, str]:
    """(state, elapsed, exit code) of the allocation."""
    acct = accounting(job_id)
    return acct.state, acct.elapsed, acct.exit_code


def job_status(job_id: str) -> JobStatus:
    record = load_record(job_id)
    acct = accounting(job_id)
    status = JobStatus(
        job_id=job_id,
        state=acct.state,
        elapsed=acct.elapsed,
        exit_code=acct.exit_code,
        nodes=acct.nodes,
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
    if acct.state != "COMPLETED":
        status.failure = _failure(record, acct)
    return status


def _failure(record: JobRecord, acct: Accounting) -> Failure | None:
    """The root cause, most specific first: a rank whose allocator refused memory, Slurm's memory limit, a failed
    node, then the first rank that raised (peers of a dead rank fail after it, with connection errors)."""
    from orch.runtime.launch.local import first_failure_record

    first = first_failure_record(Path(record.workdir))
    if first is not None and first.get("kind") == "oom":
        rank = int(str(first["rank"]))
        return Failure(rank=rank, error=str(first["error"]), log=str(log_path(record, rank, "err")), kind="oom")
    if acct.state in TERMINAL:
        oom = _memory_limit_failure(record, acct)
        if oom is not None:
            return oom
    if acct.state == "NODE_FAIL":
        return _node_failure(record, acct)
    if first is not None:
        rank = int(str(first["rank"]))
        return Failure(rank=rank, error=str(first["error"]), log=str(log_path(record, rank, "err")))
    return None


# slurmstepd's line when jobacct_gather's OverMemoryKill (or a job-level limit) kills a step, in the task logs.
_MEM_KILL = re.compile(
    r"slurmstepd-(\S+): error: (?:StepId=|Step |Job )?\S* ?exceeded (?:job )?memory limit \((\d+) > (\d+)\)"
)


def _memory_limit_failure(record: JobRecord, acct: Accounting) -> Failure | None:
    """Slurm killed ranks over the job's --mem: the job ends OUT_OF_MEMORY (cgroup enforcement) or, with
    jobacct_gather's OverMemoryKill (no cgroups), FAILED/CANCELLED with slurmstepd's "exceeded memory limit" in
    the logs. The limit is per node: the rank named is the one sacct saw largest (MaxRSSTask) on that node."""
    found, where_logged = None, None
    for path in sorted(Path(record.log_folder).glob(f"{record.job_id}_*_log.err")):
        m = _MEM_KILL.search(_tail(path))
        if m:
            found, where_logged = m, path
            break
    if found is None and acct.state != "OUT_OF_MEMORY":
        return None
    node, used, limit = (found.group(1), int(found.group(2)), int(found.group(3))) if found else (None, 0, 0)
    rank, peak, peak_node = _largest_task(record.job_id)
    node = node or peak_node
    if rank is None:
        layout = _rank_layout(record, _hostnames(acct.nodes))
        on_node = sorted(r for r, n in layout.items() if n == node)
        rank = on_node[0] if on_node else 0
    where = f" on {node}" if node else ""
    detail = f" ({_mib(used)} > {_mib(limit)} per node)" if found else ""
    error = f"out of memory: Slurm killed the ranks{where} over the job's memory limit{detail}"
    if peak:
        error += f"; rank {rank} had the largest resident size ({_mib(_slurm_bytes(peak))})"
    if where_logged is not None and where_logged != log_path(record, rank, "err"):
        error += f"; slurmstepd's message is in {where_logged.name}"
    return Failure(rank=rank, error=error, log=str(log_path(record, rank, "err")), kind="oom", node=node)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _slurm_bytes(size: str) -> int:
    """sacct's sizes: 1652668K, 1.5G, 512M, 1024 (bytes)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    try:
        if size and size[-1].upper() in units:
            return int(float(size[:-1]) * units[size[-1].upper()])
        return int(float(size))
    except ValueError:
        return 0


def _largest_task(job_id: str) -> tuple[int | None, str, str | None]:
    """(rank, MaxRSS, node) of the ranks' step's largest task, from sacct (jobacct_gather); (None, "", None)."""
    lines = _run(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,MaxRSS,MaxRSSNode,MaxRSSTask"]).splitlines()
    for line in lines:
        step, rss, node, task = [*line.split("|"), "", "", ""][:4]
        if step.startswith(f"{job_id}.") and step.split(".", 1)[1].isdigit() and task.isdigit():
            return int(task), rss, node or None
    return None, "", None


def _node_failure(record: JobRecord, acct: Accounting) -> Failure:
    """NODE_FAIL: which node died (accounting's node events during the job, else srun's "Node failure on X" in
    the batch log, else a node of the allocation that is down now) and which ranks were on it."""
    hosts = _hostnames(acct.nodes)
    failed = _down_events(hosts, acct.start, acct.end) or _srun_node_failures(record) or _down_now(hosts)
    layout = _rank_layout(record, hosts)
    ranks = sorted(r for r, n in layout.items() if n in failed)
    names = ", ".join(failed) if failed else "of the allocation"
    on = f"ranks {', '.join(map(str, ranks))} were on it" if ranks else "its ranks are unknown"
    rank = ranks[0] if ranks else 0
    log = str(log_path(record, rank, "err"))
    error = f"node {names} failed ({acct.state}): {on}"
    return Failure(rank=rank, error=error, log=log, kind="node_fail", node=failed[0] if failed else None, ranks=ranks)


def _hostnames(nodelist: str) -> list[str]:
    if not nodelist:
        return []
    return _run(["scontrol", "show", "hostnames", nodelist]).split()


def _rank_layout(record: JobRecord, hosts: list[str]) -> dict[int, str]:
    """rank -> node: what each task recorded at its start, else Slurm's block distribution over `hosts`."""
    layout: dict[int, str] = {}
    per_node = record.tasks_per_node or (record.world_size // len(hosts) if hosts else 0)
    for rank in range(record.world_size):
        if per_node and rank // per_node < len(hosts):
            layout[rank] = hosts[rank // per_node]
    for path in _ranks_dir(Path(record.workdir)).glob("rank*.json"):
        try:
            seen = json.loads(path.read_text())
            rank = int(path.stem[len("rank") :])
        except (OSError, ValueError):
            continue
        if str(seen.get("job_id")) == record.job_id and 0 <= rank < record.world_size:
            layout[rank] = str(seen["node"])
    return layout


def _down_events(hosts: list[str], start: str, end: str) -> list[str]:
    """Nodes of `hosts` that accounting saw go down between the job's start and a minute after its end."""
    from datetime import datetime, timedelta

    if not hosts or not start or start == "Unknown":
        return []
    try:
        t0 = datetime.fromisoformat(start)
        t1 = datetime.fromisoformat(end) + timedelta(minutes=1) if end and end != "Unknown" else datetime.max
    except ValueError:
        return []
    nodes = ",".join(hosts)
    out = _run(
        ["sacctmgr", "-n", "-P", "list", "event", f"nodes={nodes}", f"start={start}", "format=NodeName,TimeStart,State"]
    )
    failed = []
    for line in out.splitlines():
        node, when, state = [*line.split("|"), "", ""][:3]
        try:
            at = datetime.fromisoformat(when)
        except ValueError:
            continue
        if node in hosts and t0 <= at <= t1 and "DOWN" in state.upper() and node not in failed:
            failed.append(node)
    return failed


def _srun_node_failures(record: JobRecord) -> list[str]:
    batch = log_path(record, 0, "err")  # the batch script's stderr (submitit's %j_0_log.err)
    found = re.findall(r"srun: error: Node failure on (\S+)", _tail(batch)) if batch.exists() else []
    return list(dict.fromkeys(found))


def _down_now(hosts: list[str]) -> list[str]:
    if not hosts:
        return []
    out = _run(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N|%t"])
    return [n for n, st in (ln.split("|", 1) for ln in out.splitlines() if "|" in ln) if st.startswith("down")]


def _tail(path: Path, limit: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


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


__all__ = [
    "Failure",
    "JobRecord",
    "JobStatus",
    "RankTask",
    "accounting",
    "cancel",
    "job_status",
    "load_record",
    "log_path",
    "submit",
]
