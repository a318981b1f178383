"""Comparing a parallel run's tensors with the single-process reference (float64 equivalence)."""

from pathlib import Path

import torch


def merged(workdir: Path, what: str) -> dict[str, torch.Tensor]:
    """The full tensors every rank wrote as `{what}.rank*.pt`, merged by name."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(workdir.glob(f"{what}.rank*.pt")):
        out.update(torch.load(f))
    return out


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rel: float) -> None:
    """Same names, and every tensor within `rel` of the reference's largest magnitude."""
    assert set(got) == set(want)
    for name, ref in want.items():
        scale = max(ref.abs().max().item(), 1e-300)
        err = (got[name] - ref).abs().max().item()
        assert err <= rel * scale, f"{name}: max error {err:.3e} vs scale {scale:.3e}"


def _plans_worker(rank: int, port: int, world: int, runs: list, data_json: str, cfg, out: str) -> None:
    """Each (name, plan JSON) of `runs` as its own Executor, one after another, in one process group.

    Rank 0 writes out/<name>/losses.json; every rank dumps its step-0 gradients and final parameters
    there (RunConfig.dump_dir). Process start-up and the gloo rendezvous, not the plans, dominated
    the time when every plan was a launch of its own.
    """
    import dataclasses
    import json

    import torch.distributed as dist

    from orch.planner.plan import Plan
    from orch.planner.specs import DataSpec
    from orch.runtime.launch.procgroup import init_rank
    from orch.runtime.train.step import Executor

    init_rank(rank, world, master="127.0.0.1", port=port, timeout_s=120)
    try:
        data = DataSpec.model_validate_json(data_json)
        for name, plan_json in runs:
            workdir = Path(out) / name
            workdir.mkdir(parents=True, exist_ok=True)
            ex = Executor(
                Plan.model_validate_json(plan_json), data, dataclasses.replace(cfg, dump_dir=str(workdir)), rank, world
            )
            losses = [ex.step(k).loss for k in range(cfg.steps)]
            ex.finish()
            if rank == 0:
                (workdir / "losses.json").write_text(json.dumps(losses))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def run_plans(plans: dict, data, cfg, out: Path) -> dict[str, tuple[list[float], dict, dict]]:
    """Run every plan (all of one world size) in ONE launch; name -> (losses, merged grads, merged params)."""
    import json

    import torch.multiprocessing as mp

    from orch.runtime.launch.procgroup import free_port

    worlds = {p.world_size for p in plans.values()}
    assert len(worlds) == 1, f"one launch needs one world size, got {sorted(worlds)}"
    world = worlds.pop()
    runs = [(name, plan.model_dump_json()) for name, plan in plans.items()]
    args = (free_port(), world, runs, data.model_dump_json(), cfg, str(out))
    mp.start_processes(_plans_worker, args=args, nprocs=world, start_method="spawn")
    return {
        name: (
            json.loads((out / name / "losses.json").read_text()),
            merged(out / name, "grads"),
            merged(out / name, "params"),
        )
        for name in plans
    }
