"""The local launcher: N processes on this machine run a task (`orch launch --executor local`).

Each rank runs on `cuda:{rank}` with NCCL when the machine has a GPU per rank (or `--device cuda`),
else on the CPU with gloo (runtime/device.py); the choice is made once, before the processes start.

A rank that raises terminates the others (torch.multiprocessing's ProcessContext) and `wait` raises
LaunchError naming the rank that failed first and where its traceback is; process groups get a
timeout so a rank blocked in a collective with a dead peer cannot hang forever. A rank that failed on a
collective (a timeout, a reset connection) is not blamed when the heartbeats show another rank stopped first.

Signals, as a Slurm job's warning signal (runtime/preemption.py): SIGTERM, SIGINT or SIGUSR1 to the launcher
while it waits is forwarded to the ranks as SIGUSR1; every rank stops at the next step boundary, where they
save a checkpoint together, and exits 0 (`LocalHandle.stopped_by`, `.stopped_at`). A second one kills the
ranks at once (`Aborted`). Ranks take the same signals as stop requests: one sent to the whole process group
(a terminal's Ctrl-C, systemd's stop, `kill -TERM -PGID`) reaches the launcher and every rank at once, and the
ranks stop together at one step as when the launcher alone had it. The launcher kills a rank with SIGKILL;
torch's SIGTERM to the survivors of a failed rank is a stop request they cannot reach (their peer is gone),
and they are SIGKILLed a grace period later. The launcher's handlers are in place from the moment it starts the
ranks, and each rank starts with the signals held until its own are (`_held`): a stop signal as the run starts is
neither lost nor a death.

The watchdog: while waiting, the launcher reads the ranks' heartbeats (runtime/launch/heartbeat.py) and, once
a rank made no progress for the task's `watchdog_s`, kills the ranks and raises `RankStalled` naming that rank
and its last phase. Nothing runs on after `wait` returns or raises.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from orch.planner.errors import OrchError
from orch.runtime.launch.base import Aborted, Handle, LaunchError, RankStalled
from orch.runtime.launch.failures import first_failure, is_peer_error, last_line
from orch.runtime.launch.heartbeat import blame, read_beats, stalled
from orch.runtime.launch.rank import RankEnv, Task, run_rank
from orch.runtime.preemption import STOP_SIGNALS, Preemption, take_stop_signals

POLL_S = 0.5


def _spawned(index: int, task: Task, env: RankEnv) -> None:
    """torch.multiprocessing's entry point: rank `index` of the local job."""
    import sys
    from dataclasses import replace

    stop = Preemption(armed=True)  # every local rank arms it: they agree at each step boundary
    take_stop_signals(stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held since the launcher started it (`_held`)
    run_rank(task, replace(env, rank=index, local_rank=index), preemption=stop)
    # The rank's work is done, its files written and its process group destroyed. Leave without the
    # interpreter's teardown: there, a finished gloo rank now and then aborts on a C++ thread still joinable
    # ("terminate called without an active exception", exit -6) and a job that completed would be failed.
    # A rank that raised takes torch.multiprocessing's path instead (its traceback to the launcher, exit 1).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What a forkserver imports once, so each rank it forks starts with torch, the trainer and transformers' model code
# already loaded (transformers.modeling_utils alone is about 3 s of CPU a rank that builds a Hugging Face model).
FORKSERVER_PRELOAD = [
    "torch",
    "torch.distributed",
    "orch.runtime.train.trainer",
    "orch.runtime.train.step",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
]


@dataclass
class LocalLauncher:
    """`nproc` processes on this machine (None: the task's world size, which it must equal).

    `start_method`: "spawn" (a fresh interpreter per rank: what `orch launch` uses) or "forkserver" (ranks
    forked from one server process started with torch, the trainer and transformers imported: a launch costs about
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
        signals = StopSignals([])
        try:
            env = RankEnv(0, nproc, 0, nproc, port=free_port(), device=device)
            import multiprocessing
            from multiprocessing import resource_tracker

            if self.start_method == "forkserver":
                multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # read when the server first starts
            # Started before `_held`: starting it unblocks SIGINT and SIGTERM in this thread (the standard library
            # blocks them around its spawn and then unblocks them, whatever the mask was), so a rank would not
            # inherit them held.
            resource_tracker.ensure_running()
            # From here a stop signal to the launcher is a stop request, as while it waits (not its death with the
            # ranks left running); each rank starts with them held and takes one that came early once it can.
            signals.install()
            with _held(STOP_SIGNALS):
                context = mp.start_processes(
                    _spawned, args=(task, env), nprocs=nproc, join=False, start_method=self.start_method
                )
                signals.pids = list(context.pids())
        except BaseException:
            signals.restore()
            task.release()
            raise
        return LocalHandle(task, context, str(context.pids()[0]) if context.pids() else "local", signals)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _held(signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """These signals blocked in this thread meanwhile: a process it starts inherits the mask (through exec too), so
    a signal sent to it before its handlers are in place waits for them (`_spawned` unblocks them)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class StopSignals:
    """The launcher's handlers of STOP_SIGNALS while it waits: the first asks the ranks to stop at the next step
    boundary (SIGUSR1 to each, repeated at each poll: a rank still starting may have missed it), the second
    aborts. Installed only in the main thread (Python's rule), from the ranks' start (`install`) or on entry;
    restored on exit."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.first: str | None = None
        self.second: str | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if _main_thread() and not self._old:
            self._old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        return self

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old = {}

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.first is None:
            self.first = name
            self.forward()
        else:
            self.second = name

    def forward(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)


class LocalHandle(Handle):
    def __init__(self, task: Task, context: Any, job_id: str, signals: StopSignals | None = None) -> None:
        self.task, self.context, self.job_id = task, context, job_id
        self.signals = signals or StopSignals(list(context.pids()))  # installed from the ranks' start (`submit`)
        self._state = "RUNNING"
        self._error: OrchError | None = None
        self.stopped_by: str | None = None  # the signal the ranks stopped at, saving a checkpoint
        self.stopped_at: int | None = None  # the steps done when they saved (None: the run reached its end first)

    def state(self) -> str:
        if self._state == "RUNNING" and all(not p.is_alive() for p in self.context.processes):
            with contextlib.suppress(OrchError):
                self.wait()
        return self._state

    def wait(self, on_poll: Callable[[], None] | None = None) -> None:
        """Until the ranks end; `on_poll` is called about every POLL_S meanwhile (the CLI's progress line)."""
        if self._state == "COMPLETED":
            return
        if self._error is None:
            # The run directory's lock is freed once the ranks are gone: _follow kills any still running
            # before it returns or raises, so none is writing when the next launch may take the directory.
            try:
                self._error = self._follow(on_poll)
            finally:
                self.task.release()
            if self._error is None:
                self._state = "COMPLETED"
                return
        self._state = "FAILED"
        raise self._error

    def _follow(self, on_poll: Callable[[], None] | None) -> OrchError | None:
        import torch.multiprocessing as mp

        workdir, limit = self.task.workdir, float(getattr(self.task, "watchdog_s", 0.0) or 0.0)
        with self.signals as signals:
            try:
                # grace_period: a stopped rank ignores torch's SIGTERM; it is SIGKILLed after this, not after 30 s.
                while not self.context.join(timeout=POLL_S, grace_period=1.0):
                    if signals.second is not None:
                        self.kill()
                        return Aborted(
                            f"aborted by a second {signals.second}: the ranks were killed without saving; relaunch "
                            "to resume from the newest checkpoint"
                        )
                    if signals.first is not None:
                        signals.forward()
                    stall = stalled(read_beats(workdir), time.time(), limit) if limit > 0 else None
                    if stall is not None:
                        self.kill()
                        return RankStalled(stall.rank, stall.message)
                    if on_poll is not None:
                        on_poll()
            except mp.ProcessRaisedException as exc:
                return self._failure(exc.error_index, last_line(str(exc)))
            except mp.ProcessExitedException as exc:
                return self._failure(exc.error_index, f"exited with code {exc.exit_code}")
            finally:
                self.kill()  # no rank runs on after the launcher returns (nothing to do when all ended)
        if on_poll is not None:
            on_poll()
        if signals.first is not None:
            self.stopped_by = signals.first
            rank0 = read_beats(workdir).get(0)
            self.stopped_at = rank0.step if rank0 is not None and rank0.phase == "stopped" else None
        return None

    def _failure(self, index: int, fallback: str) -> LaunchError:
        """The rank that failed first; another one if the heartbeats show it stopped first and this rank only
        failed waiting for it."""
        rank, error = first_failure(self.task.workdir) or (index, fallback)
        if is_peer_error(error):
            culprit = blame(read_beats(self.task.workdir), time.time(), rank)
            if culprit is not None:
                return RankStalled(culprit.rank, f"{culprit.summary}; rank {rank} failed waiting for it: {error}")
        return LaunchError(rank, error)

    def kill(self) -> None:
        """SIGKILL every rank still running (a stopped one too) and reap it."""
        for process in self.context.processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
        for process in self.context.processes:
            process.join(timeout=10)

    def result(self) -> Any:
        self.wait()
        return self.task.result()

    def logs(self, rank: int = 0) -> str:
        return ""  # local ranks print to the launching terminal; nothing is kept


__all__ = ["LocalHandle", "LocalLauncher"]
