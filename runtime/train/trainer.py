"""The training loop: the one every launcher runs and every distributed test drives.

`TrainTask` is the launchers' task (runtime/launch/base.py): `prepare` (once, before the ranks start, and
before anything is written) opens the run directory (runtime/workdir/run_dir.py: its lock, the checks of what it
holds, the checkpoint to resume from or the previous run moved aside), trims metrics.jsonl back to that
checkpoint and clears old failure records; `run` (every rank) is `Trainer.run`; `result` reads the
StepRecords back; `release` frees the run directory's lock (the launcher, once the ranks ended).

`Trainer.run`, on each rank: resume from the checkpoint rank 0's `prepare` chose (or start at 0), build the
rank's `TrainStep`, then per step: run it, gather every rank's phase times, rank 0 appends the step's record
(runtime/workdir/metrics.py), stop if the step diverged (a non-finite loss or gradient norm, before any checkpoint:
runtime/train/divergence.py), save a checkpoint every `checkpoint_every` steps, and stop at a step boundary when
the ranks agree on a stop request (Slurm's warning signal, a signal to the local launcher:
runtime/preemption.py), having saved there. The last step is always saved too, so `orch export` works after
any run. Each phase boundary beats the rank's heartbeat (the watchdog's: runtime/launch/heartbeat.py); rank 0
also hands each record to the `--report-to` sinks (runtime/reporting.py). At the end, the Chrome trace of the
measured phases (rank 0 writes it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orch.planner.io import write_text_atomic
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.launch.failures import clear_failures
from orch.runtime.launch.heartbeat import Heartbeat, clear_heartbeats
from orch.runtime.progress import Pace
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.divergence import Diverged, divergence
from orch.runtime.workdir.disk import no_space_guard
from orch.runtime.workdir.metrics import (
    StepRecord,
    append_record,
    last_record,
    metrics_path,
    read_metrics,
    truncate_after,
)
from orch.runtime.workdir.run_dir import DATA_FILE, PLAN_FILE, TRAIN_FILE

if TYPE_CHECKING:
    from orch.runtime.launch.rank import RankContext
    from orch.runtime.reporting import Reporter
    from orch.runtime.train.step import StepMetrics, TrainStep
    from orch.runtime.workdir.run_lock import RunLock


OPTIMIZER_STATES = {"adamw": 2, "sgd": 0}  # tensors a checkpoint holds per trainable parameter, beside it


def checkpoint_needs(plan: Plan, cfg: TrainConfig, workdir: str | Path) -> int:
    """About the bytes of one checkpoint of this run (what a full disk's line asks for): the newest checkpoint's
    size, else the plan's parameters and optimizer states as kept: fp32 masters under a 16-bit compute dtype
    (runtime/parallel/fsdp.py `master_dtype`), else the run's dtype."""
    from orch.runtime.train.config import ELEM_BYTES
    from orch.runtime.workdir.run_dir import checkpoint_bytes, saved_bytes

    saved = saved_bytes(workdir)
    if saved is not None:
        return saved
    kept = max(ELEM_BYTES[cfg.dtype], ELEM_BYTES["float32"])
    return checkpoint_bytes(plan, kept, OPTIMIZER_STATES[cfg.optimizer])


def belongs(plan: Plan, data: DataSpec, cfg: TrainConfig) -> dict[str, Any]:
    """A checkpoint manifest's fields saying what it belongs to (runtime/workdir/run_identity.py)."""
    from orch.runtime.workdir.run_identity import data_identity, fingerprint, layouts, model_identity

    identity = model_identity(plan.model, cfg.model_factory)
    return {
        "model": fingerprint(identity),
        "model_identity": identity,
        "layouts": layouts(plan),
        "data": fingerprint(data_identity(data)),
    }


def train_file_text(cfg: TrainConfig) -> str:
    """The run's config as the `--config` file that would run it again (TrainSpec: one model for both)."""
    return cfg.model_dump_json(indent=2) + "\n"


@dataclass
class TrainTask:
    """Train `plan` for `cfg.steps` steps in `workdir` (a launcher's task)."""

    plan: Plan
    data: DataSpec
    cfg: TrainConfig
    workdir: str
    debug: DebugConfig = field(default_factory=DebugConfig)
    timeout_s: float = 60.0
    start: int = field(default=0, init=False)  # set by `prepare`: completed steps the run continues after
    _lock: RunLock | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lock": None}  # the lock stays with the process that took it

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def device(self) -> str:
        return self.cfg.device

    @property
    def watchdog_s(self) -> float:
        return self.cfg.watchdog_s

    def prepare(self) -> None:
        from orch.runtime.workdir.run_dir import checkpoint_root, open_run

        out = Path(self.workdir)
        needs = checkpoint_needs(self.plan, self.cfg, out)
        with no_space_guard(checkpoint_root(out), needs, "a checkpoint"):
            opened = open_run(
                out,
                self.plan,
                resume=self.cfg.resume,
                factory=self.cfg.model_factory,
                checkpoint_needs=needs,
                data=self.data,
            )
        self._lock, self.start = opened.lock, opened.start
        try:
            with no_space_guard(checkpoint_root(out), needs, "a checkpoint"):
                truncate_after(metrics_path(out), self.start)
                clear_failures(out)
                clear_heartbeats(out)
                # What ran, for whoever reads the run later (`orch export` finds the model's sources here).
                write_text_atomic(out / PLAN_FILE, self.plan.model_dump_json(indent=2) + "\n")
                write_text_atomic(out / TRAIN_FILE, train_file_text(self.cfg))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def run(self, ctx: RankContext) -> None:
        import torch.distributed as dist

        from orch.runtime.workdir.checkpoint_agree import agree_checkpoint
        from orch.runtime.workdir.run_identity import model_identity

        start = [self.start]
        dist.broadcast_object_list(start, src=0)  # rank 0 prepared the run (on Slurm and torchrun, it alone)
        begin = int(start[0])
        if begin > 0:
            identity = model_identity(self.plan.model, self.cfg.model_factory)
            begin = agree_checkpoint(self.workdir, begin, identity, ctx.env.rank, ctx.env.world)
        Trainer(self.plan, self.data, self.cfg, self.workdir, ctx, self.debug, begin).run()

    def result(self) -> list[StepRecord]:
        return read_metrics(metrics_path(self.workdir), missing_ok=True)

    def diverged(self) -> Diverged | None:
        """Why the ranks stopped, when the last step they recorded diverged (the line each rank raised); the
        launcher's `rank R failed` would blame one rank for what every rank found."""
        last = last_record(metrics_path(self.workdir))
        if last is None or last.step < self.start:
            return None
        return divergence(
            last.step, last.loss, last.grad_norm, last.lr, self.cfg.steps, self.workdir, resumed_at=self.start
        )


class Trainer:
    """One rank's run of a plan: the loop around `TrainStep` (module docstring)."""

    def __init__(
        self,
        plan: Plan,
        data: DataSpec,
        cfg: TrainConfig,
        workdir: str,
        ctx: RankContext,
        debug: DebugConfig,
        start: int = 0,
    ) -> None:
        self.plan, self.data, self.cfg, self.workdir, self.ctx, self.debug = plan, data, cfg, workdir, ctx, debug
        self.start = start  # completed steps of the checkpoint to resume from (0: none)
        self.reporter: Reporter | None = None  # rank 0's --report-to sinks (runtime/reporting.py)
        self.pace = Pace(cfg.steps)  # rank 0's progress line in a Slurm job's log (runtime/progress.py)

    def run(self) -> None:
        import torch.distributed as dist

        from orch.runtime.train.optim import weights_finite
        from orch.runtime.train.step import TrainStep
        from orch.runtime.train.trace import RankTrace, write_trace
        from orch.runtime.workdir import checkpoint

        rank, world, cfg, start = self.ctx.env.rank, self.ctx.env.world, self.cfg, self.start
        if start >= cfg.steps:
            return
        t = time.perf_counter()
        from orch.runtime.data.problems import PROBLEMS_FILE, DataProblems

        problems = DataProblems(str(Path(self.workdir) / PROBLEMS_FILE), rank)
        heartbeat = Heartbeat(self.workdir, rank)  # read by the watchdog (runtime/launch/heartbeat.py)
        if rank == 0 and cfg.report_to:
            from orch.runtime.reporting import open_reporter

            self.reporter = open_reporter(cfg.report_to, self.workdir, cfg)
        step = TrainStep(
            self.plan, self.data, cfg, rank, world, self.ctx.device, self.debug, problems=problems, heartbeat=heartbeat
        )
        if start > 0:
            folder = checkpoint.checkpoint_root(self.workdir) / checkpoint.step_name(start)
            check_data_position(folder, step, start)
            changed = say_changed_settings(folder, cfg, rank)
            # a checkpoint of another optimizer: its state would not fit this one's (the weights still load)
            optimizer = None if "optimizer" in changed else step.optimizer
            checkpoint.load(self.workdir, start, step.modules, optimizer)
        setup_s = time.perf_counter() - t
        trace = RankTrace(rank, time.perf_counter())  # setup ends in collectives: origins agree closely
        belonging = belongs(self.plan, self.data, cfg)
        needs = checkpoint_needs(self.plan, cfg, self.workdir)

        def save(done: int, m: StepMetrics) -> None:
            nonlocal needs
            if not weights_finite(step.modules, step.device):  # a finite gradient's update can still overflow them
                broken = divergence(
                    done - 1, m.loss, m.grad_norm, m.lr, cfg.steps, self.workdir, weights_finite=False, resumed_at=start
                )
                if broken is not None:
                    raise broken
            checkpoint.save(
                self.workdir,
                done,
                step.modules,
                step.optimizer,
                self._files(step, done),
                belonging,
                needs,
                keep=cfg.keep_checkpoints,
            )
            needs = checkpoint_needs(self.plan, cfg, self.workdir)  # what the next one takes: this one's size

        for k in range(start, cfg.steps):
            m = step.step(k)
            trace.add(k, m.spans)
            step.beat("record")
            self._record(m, setup_s if k == start else 0.0)
            diverged = divergence(k, m.loss, m.grad_norm, m.lr, cfg.steps, self.workdir, resumed_at=start)
            if diverged is not None:  # the same verdict on every rank: loss and norm are all-reduced
                dist.barrier()  # rank 0's record of the step is written before any rank ends
                self._close_reporter()
                raise diverged  # before a checkpoint: the newest is still from before the divergence
            step.beat("step end")
            done = k + 1
            if done == cfg.steps:
                step.beat("checkpoint")
                save(done, m)  # always: `orch export` works after any run
                break
            saved = cfg.checkpoint_every > 0 and done % cfg.checkpoint_every == 0
            if saved:
                step.beat("checkpoint")
                save(done, m)
            if self.ctx.preemption.agreed():
                if not saved:
                    step.beat("checkpoint")
                    save(done, m)
                self.ctx.preemption.mark_stopped(done)
                heartbeat.close("stopped", done)
                self._close_reporter()
                step.balancer.close()
                return
        if cfg.trace is not None:
            gathered: list[list[dict[str, object]]] | None = [[] for _ in range(world)] if rank == 0 else None
            dist.gather_object(trace.events, gathered, dst=0)
            if rank == 0:
                assert gathered is not None
                write_trace(cfg.trace, gathered, self.plan.placement.value)
        step.finish()
        dist.barrier()
        heartbeat.close("done")
        self._close_reporter()

    def _close_reporter(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None

    def _files(self, step: TrainStep, done: int) -> dict[str, str]:
        """What a checkpoint keeps beside the tensors: the training config, and with a data file the sampler's
        position (the next step's place in its epoch, and the index it draws from)."""
        files = {TRAIN_FILE: train_file_text(self.cfg)}
        position = step.data_position(done)
        if position is not None:
            files[DATA_FILE] = json.dumps(position, indent=1) + "\n"
        return files

    def _record(self, m: StepMetrics, setup_s: float) -> None:
        """Every rank's phase times to rank 0, which appends the step's record (collective)."""
        import torch.distributed as dist

        rank, world = self.ctx.env.rank, self.ctx.env.world
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, ({**m.phases, "step": m.step_time_s}, m.processed, m.memory, m.data))
        if rank != 0:
            return
        times = [p[0] for p in everyone if p]
        processed = None
        if self.debug.count_tokens:
            processed = {
                str(r): {mod: {str(i): n for i, n in per.items()} for mod, per in p[1].items()}
                for r, p in enumerate(everyone)
                if p
            }
        record = StepRecord(
            step=m.step,
            loss=m.loss,
            tokens=m.tokens,
            step_time_s=max(p["step"] for p in times),
            setup_s=setup_s,
            ranks={str(r): p for r, p in enumerate(times)},
            # Tables and bytes are the same on every rank (a deterministic dispatcher); dispatcher seconds are
            # rank 0's.
            balance=m.balance,
            grad_norm=m.grad_norm,
            aux_loss=m.aux_loss,
            memory={str(r): p[2] for r, p in enumerate(everyone) if p},
            lr=m.lr,
            processed=processed,
            data=_data_counts([p[3] for p in everyone if p and p[3] is not None]),
        )
        append_record(metrics_path(self.workdir), record)
        if self.reporter is not None:
            self.reporter.log(record)
        if self.ctx.log_steps:
            print(f"orch: {self.pace.line(record)}", flush=True)


def _data_counts(per_rank: list[dict[str, int]]) -> dict[str, int] | None:
    """A data file's step outcomes: the batch's (the same on every rank), `failed` and `decoded` summed over
    the ranks."""
    if not per_rank:
        return None
    return {**per_rank[0], "failed": sum(d["failed"] for d in per_rank), "decoded": sum(d["decoded"] for d in per_rank)}


# What a changed setting means for the resumed run, where more than its new value follows.
CONSEQUENCES = {"optimizer": "the model's weights are loaded, the optimizer's state starts fresh"}


def say_changed_settings(folder: Path, cfg: TrainConfig, rank: int) -> dict[str, tuple[Any, Any]]:
    """Each setting of the run (config.py `OPTIMISATION`) that differs from the one the checkpoint in `folder` was
    trained with, said by rank 0 in one line, `name then -> now`; returns them (field -> (then, now)). A
    checkpoint without its config (an older one) compares nothing."""
    from orch.runtime.train.config import changed_settings
    from orch.runtime.workdir.run_dir import say_changed

    try:
        was = json.loads((folder / TRAIN_FILE).read_text())
    except (OSError, ValueError):
        was = None
    changes = changed_settings(was, cfg) if isinstance(was, dict) else {}
    if rank == 0:
        for name, (then, now) in changes.items():
            consequence = f": {CONSEQUENCES[name]}" if name in CONSEQUENCES else ""
            say_changed(folder.name, name, f"{_shown(then)} -> {_shown(now)}{consequence}")
    return changes


def _shown(value: Any) -> str:
    """A setting's value as a config file spells it (a list or mapping as JSON)."""
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def check_data_position(folder: Path, step: TrainStep, start: int) -> None:
    """Refuse to resume on other data than the checkpoint's (`orch launch` checked it already: this is for a run
    started otherwise)."""
    from orch.planner.errors import OrchError
    from orch.runtime.data.freshness import index_mismatch

    now = step.data_position(start)
    problem = None if now is None else index_mismatch(folder, str(now["index"]))
    if problem is not None:
        raise OrchError(problem)
