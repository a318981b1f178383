"""The local executor: N gloo processes on this machine run a plan (`orch launch --executor local`).

A rank that raises terminates the others (torch.multiprocessing's ProcessContext) and the
launcher raises LaunchError naming the rank and its error; process groups get a timeout so
a rank blocked in a collective with a dead peer cannot hang forever.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from orch.planner.errors import OrchError
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.executor import RunConfig


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, job: _Job) -> None:
    import time

    import torch
    import torch.distributed as dist

    from orch.runtime.executor import Executor

    torch.set_num_threads(1)  # shared 2-core machines: one thread per rank
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{job.port}",
        rank=rank,
        world_size=job.world,
        timeout=timedelta(seconds=job.timeout_s),
    )
    try:
        plan = Plan.model_validate_json(job.plan_json)
        data = DataSpec.model_validate_json(job.data_json)
        t = time.perf_counter()
        ex = Executor(plan, data, job.cfg, rank, job.world)
        setup_s = time.perf_counter() - t
        for k in range(job.cfg.steps):
            m = ex.step(k)
            everyone: list[dict[str, float] | None] = [None] * job.world
            dist.all_gather_object(everyone, {**m.phases, "step": m.step_time_s})
            if rank == 0:
                record = {
                    "step": m.step,
                    "loss": m.loss,
                    "tokens": m.tokens,
                    "step_time_s": max(p["step"] for p in everyone if p),
                    "setup_s": setup_s if k == 0 else 0.0,
                    "ranks": {str(r): p for r, p in enumerate(everyone)},
                }
                with open(Path(job.workdir) / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
        ex.finish()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_local(
    plan: Plan, data: DataSpec, cfg: RunConfig, *, nproc: int, workdir: str | os.PathLike[str], timeout_s: float = 60
) -> list[dict[str, object]]:
    """Run `cfg.steps` steps of `plan` on `nproc` local processes; return the metrics records."""
    import torch.multiprocessing as mp

    if nproc != plan.world_size:
        raise OrchError(f"--nproc {nproc}: the plan needs {plan.world_size} ranks")
    out = Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    job = _Job(plan.model_dump_json(), data.model_dump_json(), cfg, str(out), _free_port(), nproc, timeout_s)
    try:
        mp.start_processes(_worker, args=(job,), nprocs=nproc, join=True, start_method="spawn")
    except mp.ProcessRaisedException as exc:
        raise LaunchError(exc.error_index, _last_line(str(exc))) from None
    except mp.ProcessExitedException as exc:
        raise LaunchError(exc.error_index, f"exited with code {exc.exit_code}") from None
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def _last_line(traceback_text: str) -> str:
    lines = [ln for ln in traceback_text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "unknown error"


__all__ = ["LaunchError", "run_local"]
