"""The local executor: N processes on this machine run a plan (`orch launch --executor local`).

Each rank runs on `cuda:{rank}` with NCCL when the machine has a GPU per rank (or `--device cuda`),
else on the CPU with gloo (runtime/device.py); the choice is made once, before the processes start.

A rank that raises terminates the others (torch.multiprocessing's ProcessContext) and the
launcher raises LaunchError naming the rank and its error; process groups get a timeout so
a rank blocked in a collective with a dead peer cannot hang forever.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from orch.planner.errors import OrchError
from orch.planner.io import write_text_atomic
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.device import device_kind, rank_device
from orch.runtime.launch.procgroup import free_port, init_rank
from orch.runtime.train.step import RunConfig


class LaunchError(OrchError):
    def __init__(self, rank: int, message: str) -> None:
        self.rank = rank
        self.message = message
        super().__init__(f"rank {rank} failed: {message}")


@dataclass(frozen=True)
class _Job:
    plan_json: str
    data_json: str
    cfg: RunConfig
    workdir: str
    port: int
    world: int
    timeout_s: float
    start: int = 0  # completed steps of the checkpoint to resume from (0: a fresh run)
    master: str = "127.0.0.1"  # rendezvous host (the Slurm launcher passes the allocation's first node)
    log_steps: bool = False  # rank 0 prints "orch: step K loss L" per step on stdout (the Slurm job's log)
    local_rank: int | None = None  # this rank's index on its node (None: the global rank, one machine)
    local_ranks: int | None = None  # ranks on its node (None: the world)


def _failure_dir(workdir: str) -> Path:
    return Path(workdir) / ".failures"


def _worker(rank: int, job: _Job) -> None:
    """Run one rank; a rank that raises first records when and why, so the launcher can name
    the root cause rather than a peer that merely lost its connection to it."""
    try:
        _run_rank(rank, job)
    except BaseException as exc:
        import time
        import traceback

        text = "".join(traceback.format_exception(exc))
        error = _last_line(text)
        kind = "oom" if is_out_of_memory(exc) else "error"
        if kind == "oom":
            error = f"out of memory: {error}"
        record = {"time": time.time(), "rank": rank, "error": error, "kind": kind, "traceback": text}
        folder = _failure_dir(job.workdir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{rank}.json").write_text(json.dumps(record))
        raise


# What allocators say when a request cannot be met: torch's CPU allocator raises a plain RuntimeError.
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "not enough memory", "cannot allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError (Python), torch.OutOfMemoryError (CUDA and other device allocators), or an allocator's
    RuntimeError saying it cannot allocate (torch's CPU allocator)."""
    import torch

    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES)


def _first_failure(workdir: Path) -> tuple[int, str] | None:
    """(rank, its error line and where its whole traceback is) of the earliest failure, or None."""
    first = first_failure_record(workdir)
    if first is None:
        return None
    rank = int(first["rank"])
    where = _failure_dir(str(workdir)) / f"rank{rank}.json"
    return rank, f"{first['error']} (traceback: {where})" if "traceback" in first else str(first["error"])


def first_failure_record(workdir: Path) -> dict[str, object] | None:
    """The earliest failure record of the ranks ({time, rank, error, kind, traceback}), or None."""
    records = []
    for path in sorted(_failure_dir(str(workdir)).glob("rank*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not records:
        return None
    first: dict[str, object] = min(records, key=lambda r: r["time"])
    return first


def _run_rank(rank: int, job: _Job) -> None:
    import time

    import torch.distributed as dist

    from orch.runtime import checkpoint
    from orch.runtime.train.step import Executor
    from orch.runtime.train.trace import RankTrace, write_trace

    local_rank = rank if job.local_rank is None else job.local_rank
    dev = rank_device(job.cfg.device, local_rank, job.world if job.local_ranks is None else job.local_ranks)
    init_rank(
        rank,
        job.world,
        master=job.master,
        port=job.port,
        timeout_s=job.timeout_s,
        backend=dev.backend,
        device=dev.device,
    )
    try:
        plan = Plan.model_validate_json(job.plan_json)
        data = DataSpec.model_validate_json(job.data_json)
        t = time.perf_counter()
        ex = Executor(plan, data, job.cfg, rank, job.world, device=dev.device)
        if job.start > 0:
            checkpoint.load(job.workdir, job.start, ex.modules, ex.optimizer)
        setup_s = time.perf_counter() - t
        trace = RankTrace(rank, time.perf_counter())  # setup ends in collectives: origins agree closely
        for k in range(job.start, job.cfg.steps):
            m = ex.step(k)
            trace.add(k, m.spans)
            everyone: list[tuple[dict[str, float], dict[str, dict[int, int]]] | None] = [None] * job.world
            dist.all_gather_object(everyone, ({**m.phases, "step": m.step_time_s}, m.processed))
            if rank == 0:
                times = [p[0] for p in everyone if p]
                record = {
                    "step": m.step,
                    "loss": m.loss,
                    "tokens": m.tokens,
                    "step_time_s": max(p["step"] for p in times),
                    "setup_s": setup_s if k == job.start else 0.0,
                    "ranks": {str(r): p for r, p in enumerate(times)},
                    # Tables and bytes are the same on every rank (a deterministic dispatcher);
                    # dispatcher seconds are rank 0's.
                    "balance": m.balance,
                }
                if job.cfg.count_tokens:
                    record["processed"] = {str(r): p[1] for r, p in enumerate(everyone) if p}
                with open(Path(job.workdir) / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
                if job.log_steps:
                    print(f"orch: step {m.step} loss {m.loss:.6f}", flush=True)
            every = job.cfg.checkpoint_every
            saved = every > 0 and (k + 1) % every == 0
            if saved:
                checkpoint.save(job.workdir, k + 1, ex.modules, ex.optimizer)
            # Slurm's warning signal (runtime/launch/slurm.py arms it; never set locally): save here, stop, requeue.
            if k + 1 < job.cfg.steps and checkpoint.stop_agreed():
                if not saved:
                    checkpoint.save(job.workdir, k + 1, ex.modules, ex.optimizer)
                checkpoint.mark_stopped(k + 1)
                ex.orch.close()
                return
        if job.cfg.trace is not None:
            gathered: list[list[dict[str, object]]] | None = [[] for _ in range(job.world)] if rank == 0 else None
            dist.gather_object(trace.events, gathered, dst=0)
            if rank == 0:
                assert gathered is not None
                write_trace(job.cfg.trace, gathered, plan.placement.value)
        ex.finish()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_local(
    plan: Plan, data: DataSpec, cfg: RunConfig, *, nproc: int, workdir: str | os.PathLike[str], timeout_s: float = 60
) -> list[dict[str, object]]:
    """Run `plan` up to step `cfg.steps` on `nproc` local processes; return the metrics records.

    `cfg.device` is resolved here (DeviceError before any process starts if it cannot be had).

    With `cfg.resume` and a complete checkpoint in `workdir`, the run continues after it and
    appends to metrics.jsonl (dropping lines of steps past the checkpoint); otherwise it starts
    at step 0 with a fresh metrics file.
    """
    import torch.multiprocessing as mp

    from orch.runtime.checkpoint import latest_step

    if nproc != plan.world_size:
        raise OrchError(f"--nproc {nproc}: the plan needs {plan.world_size} ranks")
    cfg = replace(cfg, device=device_kind(cfg.device, nproc))  # every rank the same device kind ("auto" resolved)
    out = Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    start = (latest_step(out) if cfg.resume else None) or 0
    if start == 0:
        metrics.unlink(missing_ok=True)
    elif metrics.exists():
        kept = [ln for ln in metrics.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < start]
        write_text_atomic(metrics, "".join(ln + "\n" for ln in kept))
    if start >= cfg.steps:
        return _records(metrics)
    job = _Job(plan.model_dump_json(), data.model_dump_json(), cfg, str(out), free_port(), nproc, timeout_s, start)
    shutil.rmtree(_failure_dir(str(out)), ignore_errors=True)
    try:
        mp.start_processes(_worker, args=(job,), nprocs=nproc, join=True, start_method="spawn")
    except mp.ProcessRaisedException as exc:
        rank, message = _first_failure(out) or (exc.error_index, _last_line(str(exc)))
        raise LaunchError(rank, message) from None
    except mp.ProcessExitedException as exc:
        rank, message = _first_failure(out) or (exc.error_index, f"exited with code {exc.exit_code}")
        raise LaunchError(rank, message) from None
    return _records(metrics)


def _records(metrics: Path) -> list[dict[str, object]]:
    if not metrics.exists():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def _last_line(traceback_text: str) -> str:
    lines = [ln for ln in traceback_text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "unknown error"


__all__ = ["LaunchError", "run_local"]
