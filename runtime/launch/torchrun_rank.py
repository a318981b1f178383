"""One rank under torchrun (or a Kubernetes PyTorchJob): `python -m orch.runtime.launch.torchrun_rank --sha256 HEX
TASKFILE`.

Reads the task `orch launch --executor torchrun` pickled (runtime/launch/torchrun.py), once its bytes have the
sha256 the command carries (a task file rewritten since is refused in one line, never unpickled), and torch's standard
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: `RankEnv.from_torch_env`), then runs
the rank-start path of every launcher (runtime/launch/rank.py `run_rank`). Rank 0 prepares the task before
the rendezvous (the others wait in it), as a Slurm job's task 0 does. A missing or bad task file, or a
variable absent, is one line on stderr and exit code 2: no traceback, no process group. A SIGTERM (torchrun's
agent forwards the one it gets) is a stop request: the ranks save at the next step boundary and exit 0. With a
watchdog (`watchdog_s`), rank 0 watches the heartbeats and ends the job naming a rank that stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import replace

from orch.planner.errors import OrchError
from orch.runtime.launch.failures import record_stall
from orch.runtime.launch.heartbeat import Stall, Watchdog
from orch.runtime.launch.rank import RankEnv, run_rank
from orch.runtime.launch.torchrun import read_task
from orch.runtime.preemption import Preemption, take_stop_signals

USAGE = (
    "usage: python -m orch.runtime.launch.torchrun_rank --sha256 HEX TASKFILE (under torchrun: the command "
    "`orch launch --executor torchrun --dry-run` prints)"
)


def _end_stalled_job(workdir: str, stall: Stall) -> None:
    """The watchdog (rank 0) named a rank that stopped: record why, then end the job. The other ranks torchrun's
    agent started on this node are killed (the stopped one would hold out through the agent's own SIGTERM) and
    this one exits: the agent fails the job, the other nodes' ranks fail on the lost peers."""
    from orch.runtime.launch.torchrun import child_pids

    record_stall(workdir, stall.rank, stall.message)
    print(f"orch: {stall.message}", file=sys.stderr, flush=True)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        for pid in child_pids(os.getppid()) or []:
            if pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "--sha256" or args[2].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    # torchrun's agent passes a SIGTERM (or SIGINT) it gets on to every rank as SIGTERM, and waits for them before
    # it kills them: each is a stop request (the ranks save at the next step boundary and end), from the start (a
    # request while rank 0 prepares the run is kept for the first step boundary, not a traceback).
    stop = Preemption(armed=True)  # every rank arms it: they agree at each step boundary
    take_stop_signals(stop)
    sha256, task_file = args[1], args[2]
    try:
        env = RankEnv.from_torch_env("auto")
        task = read_task(task_file, sha256)
        if env.world != task.world_size:
            raise OrchError(f"WORLD_SIZE={env.world}: the task in {task_file} needs {task.world_size} ranks")
        env = replace(env, device=task.device)  # "auto" is chosen on this rank's node (runtime/device.py)
        if env.rank == 0:
            task.prepare()  # before the rendezvous: no rank has started its body yet (a workdir in use: refused)
    except OrchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    workdir = str(task.workdir)
    limit = float(getattr(task, "watchdog_s", 0.0) or 0.0)
    watchdog = Watchdog(workdir, limit, lambda stall: _end_stalled_job(workdir, stall))
    if env.rank == 0:
        watchdog.start()
    try:
        ctx = run_rank(task, env, preemption=stop)
    finally:
        watchdog.stop()
    if env.rank == 0 and ctx.preemption.stopped_at is not None:
        print(f"orch: stop signal: saved checkpoint step {ctx.preemption.stopped_at}", file=sys.stderr, flush=True)
    # As a local rank does (runtime/launch/local.py): done, files written, group destroyed; leave without the
    # interpreter's teardown, where a finished gloo rank now and then aborts on a joinable C++ thread.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
