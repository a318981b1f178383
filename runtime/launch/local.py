"""The local launcher: N processes on this machine run a task (`orch launch --executor local`).

Each rank runs on `cuda:{rank}` with NCCL when the machine has a GPU per rank (or `--device cuda`),
else on the CPU with gloo (runtime/device.py); the choice is made once, before the processes start.

A rank that raises terminates the others (torch.multiprocessing's ProcessContext) and `wait` raises
LaunchError naming the rank that failed first and where its traceback is; process groups get a
timeout so a rank blocked in a collective with a dead peer cannot hang forever.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from orch.planner.errors import OrchError
from orch.runtime.launch.base import Handle, LaunchError, Task
from orch.runtime.launch.failures import first_failure, last_line
from orch.runtime.launch.rank import RankEnv, run_rank


def _spawned(index: int, task: Task, env: RankEnv) -> None:
    """torch.multiprocessing's entry point: rank `index` of the local job."""
    import os
    import sys
    from dataclasses import replace

    run_rank(task, replace(env, rank=index, local_rank=index))
    # The rank's work is done, its files written and its process group destroyed. Leave without the
    # interpreter's teardown: there, a finished gloo rank now and then aborts on a C++ thread still joinable
    # ("terminate called without an active exception", exit -6) and a job that completed would be failed.
    # A rank that raised takes torch.multiprocessing's path instead (its traceback to the launcher, exit 1).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What a forkserver imports once, so each rank it forks starts with torch and the trainer already loaded.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "orch.runtime.train.trainer", "orch.runtime.train.step"]


@dataclass
class LocalLauncher:
    """`nproc` processes on this machine (None: the task's world size, which it must equal).

    `start_method`: "spawn" (a fresh interpreter per rank: what `orch launch` uses) or "forkserver" (ranks
    forked from one server process started with torch and the trainer imported: a launch costs about
    0.1 s instead of seconds of imports; the server keeps the environment it started with, so later
    changes to os.environ do not reach the ranks). The tests launch many small jobs and use the latter.
    """

    nproc: int | None = None
    start_method: str = "spawn"

    def submit(self, task: Task) -> LocalHandle:
        """Prepare the task and start its ranks (spawned); the handle waits for them."""
        import torch.multiprocessing as mp

        from orch.runtime.device import device_kind
        from orch.runtime.launch.procgroup import free_port

        nproc = self.nproc if self.nproc is not None else task.world_size
        if nproc != task.world_size:
            raise OrchError(f"--nproc {nproc}: the plan needs {task.world_size} ranks")
        device = device_kind(task.device, nproc)  # every rank the same kind ("auto" resolved); DeviceError here
        task.prepare()
        try:
            env = RankEnv(0, nproc, 0, nproc, port=free_port(), device=device)
            if self.start_method == "forkserver":
                import multiprocessing

                multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # read when the server first starts
            context = mp.start_processes(
                _spawned, args=(task, env), nprocs=nproc, join=False, start_method=self.start_method
            )
        except BaseException:
            task.release()
            raise
        return LocalHandle(task, context, str(context.pids()[0]) if context.pids() else "local")


class LocalHandle(Handle):
    def __init__(self, task: Task, context: Any, job_id: str) -> None:
        self.task, self.context, self.job_id = task, context, job_id
        self._state = "RUNNING"
        self._error: LaunchError | None = None

    def state(self) -> str:
        if self._state == "RUNNING" and all(not p.is_alive() for p in self.context.processes):
            with contextlib.suppress(OrchError):
                self.wait()
        return self._state

    def wait(self) -> None:
        import torch.multiprocessing as mp

        if self._state == "COMPLETED":
            return
        if self._error is None:
            # The run directory's lock is freed once the ranks are gone (the context terminates the others when
            # one fails), not on an interrupt of this wait, when they may still be writing.
            try:
                while not self.context.join():
                    pass
            except mp.ProcessRaisedException as exc:
                self.task.release()
                found = first_failure(self.task.workdir) or (exc.error_index, last_line(str(exc)))
                self._error = LaunchError(*found)
            except mp.ProcessExitedException as exc:
                self.task.release()
                found = first_failure(self.task.workdir) or (exc.error_index, f"exited with code {exc.exit_code}")
                self._error = LaunchError(*found)
            else:
                self.task.release()
                self._state = "COMPLETED"
                return
        self._state = "FAILED"
        raise self._error

    def result(self) -> Any:
        self.wait()
        return self.task.result()

    def logs(self, rank: int = 0) -> str:
        return ""  # local ranks print to the launching terminal; nothing is kept


__all__ = ["LocalHandle", "LocalLauncher"]
