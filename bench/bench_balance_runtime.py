"""Post-balancing in the running system: `--balance orch` vs `--balance none`, measured here.

2 gloo processes (one per core, one torch thread each), homogeneous DP2 (2 emulated nodes of one
rank), a widened tiny model and a skewed multimodal mix (mostly short captions, some long
videos and ASR clips), float64. The two modes run as two executors in one process group on the
same global batches, step k of each back to back in alternating order (the load of this shared
machine drifts; alternating cancels it). Per mode: median step time over the steps after
warm-up, the ratio, per-rank compute (encoder forwards + backwards + LLM forward/backward) as
max/mean over ranks, the dispatcher's seconds and how many were hidden behind the previous step,
bytes moved inside and across nodes. The losses of the two modes must agree to 1e-9 relative
(asserted). Prints a table, writes bench/out/balance_runtime.json. Ratios, not absolute times,
are the result (DESIGN.md, Measuring).

    .venv/bin/python bench/bench_balance_runtime.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from orch.planner.loading import load_model
from orch.planner.plan import Layout, Plan
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.executor import RunConfig
from orch.runtime.plans import hand_plan

WARMUP = 2  # steps left out of the medians (first-touch allocation, gloo connection set-up)
MODES = ("none", "orch")


def bench_specs() -> tuple[ModelSpec, DataSpec]:
    """The tiny preset, widened so that per-sample cost (and a step) is dominated by compute."""
    tiny = load_model("tiny")
    mods = tiny.model_dump()["modules"]
    mods["vision"].update(hidden=128, heads=4, ffn=256, layers=2)
    mods["audio"].update(hidden=128, heads=4, ffn=256, layers=2)
    mods["llm"].update(hidden=192, heads=4, kv_heads=2, ffn=384, layers=3)
    model = ModelSpec.model_validate({**tiny.model_dump(), "name": "tiny-wide", "modules": mods})
    data = DataSpec(
        name="skewed-mix",
        global_batch=16,
        seq_len=1024,
        tasks=[
            # 60% short captions, 20% long videos, 20% ASR clips: per-rank cost differs ~1.3x
            # between the two DP ranks in a typical step (the cost model's median).
            {"name": "caption", "weight": 0.6, "tokens": {"vision": 16, "llm": 32}, "max": {"vision": 32, "llm": 64}},
            {"name": "video", "weight": 0.2, "tokens": {"vision": 384, "llm": 64}, "max": {"vision": 768, "llm": 128}},
            {"name": "asr", "weight": 0.2, "tokens": {"audio": 256, "llm": 32}, "max": {"audio": 512, "llm": 64}},
        ],
    )
    return model, data


def bench_plan(model: ModelSpec, data: DataSpec) -> Plan:
    plan = hand_plan(model, data, {"llm": (Layout(dp=2), [0, 1])}, micro_batches=1)
    return plan.model_copy(update={"ranks_per_node": 1})


def _compute(phases: dict[str, float], encoders: list[str], llm: str) -> float:
    return sum(phases.get(f"{e}.fwd", 0.0) + phases.get(f"{e}.bwd", 0.0) for e in encoders) + phases[f"{llm}.fwd_bwd"]


def summarise(records: list[dict], model: ModelSpec) -> dict[str, float]:
    kept = records[WARMUP:]
    encs = sorted(model.encoder_names)
    max_over_mean = []
    for r in kept:
        per_rank = [_compute(p, encs, model.llm_name) for p in r["ranks"].values()]
        max_over_mean.append(max(per_rank) / statistics.mean(per_rank))
    bal = [r["balance"] for r in records]
    names = sorted({k for r in kept for p in r["ranks"].values() for k in p})
    phases = {
        k: [
            statistics.median(p.get(k, 0.0) for r in kept for p in [r["ranks"][rank]])
            for rank in sorted(kept[0]["ranks"])
        ]
        for k in names
    }
    return {
        "phases_median_per_rank_s": phases,
        "median_step_s": statistics.median(r["step_time_s"] for r in kept),
        "median_compute_max_over_mean": statistics.median(max_over_mean),
        "median_compute_max_s": statistics.median(
            max(_compute(p, encs, model.llm_name) for p in r["ranks"].values()) for r in kept
        ),
        "predicted_llm_max_over_mean": statistics.median(b["llm"]["max_cost"] / b["llm"]["mean_cost"] for b in bal),
        "dispatcher_s": sum(b["dispatcher_s"] for b in bal),
        "dispatcher_hidden_s": sum(b["dispatcher_hidden_s"] for b in bal),
        "inter_node_mb": sum(b[p]["inter_node_bytes"] for b in bal for p in [*encs, "llm"]) / 1e6,
        "intra_node_mb": sum(b[p]["intra_node_bytes"] for b in bal for p in [*encs, "llm"]) / 1e6,
    }


def _worker(rank: int, port: int, plan_json: str, data_json: str, steps: int, dtype: str, out: str) -> None:
    """Both modes in one process group, step k of each back to back (order alternating per step),
    so that the machine's drifting load hits both alike."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from orch.runtime.executor import Executor

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=300)
    )
    try:
        plan, data = Plan.model_validate_json(plan_json), DataSpec.model_validate_json(data_json)
        exs = {m: Executor(plan, data, RunConfig(steps=steps, seed=0, dtype=dtype, balance=m), rank, 2) for m in MODES}
        records: dict[str, list[dict]] = {m: [] for m in MODES}
        for k in range(steps):
            for mode in MODES if k % 2 == 0 else MODES[::-1]:
                dist.barrier()
                m = exs[mode].step(k)
                everyone: list[dict[str, float] | None] = [None] * 2
                dist.all_gather_object(everyone, {**m.phases, "step": m.step_time_s})
                ranks = {str(r): p for r, p in enumerate(everyone) if p}
                step_s = max(p["step"] for p in ranks.values())
                records[mode].append(
                    {"step": k, "loss": m.loss, "step_time_s": step_s, "ranks": ranks, "balance": m.balance}
                )
        for ex in exs.values():
            ex.finish()
        if rank == 0:
            Path(out).write_text(json.dumps(records))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from orch.runtime.local import _free_port

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dtype", default="float64")
    args = parser.parse_args()
    model, data = bench_specs()
    plan = bench_plan(model, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.json"
        job = (_free_port(), plan.model_dump_json(), data.model_dump_json(), args.steps, args.dtype, str(path))
        mp.start_processes(_worker, args=job, nprocs=plan.world_size, start_method="spawn")
        runs: dict[str, list[dict]] = json.loads(path.read_text())
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(runs["orch"], runs["none"], strict=True))
    summary = {mode: summarise(records, model) for mode, records in runs.items()}
    speedup = summary["none"]["median_step_s"] / summary["orch"]["median_step_s"]

    head = (
        f"{'balance':<8} {'step s (med)':>12} {'compute max/mean':>17} {'cost max/mean (llm)':>20} "
        f"{'dispatch s':>11} {'hidden s':>9} {'MB in-node':>11} {'MB x-node':>10}"
    )
    print(f"bench_balance_runtime: {args.steps} steps ({WARMUP} warm-up left out), 2 processes, {args.dtype}")
    print(head)
    for mode in MODES:
        s = summary[mode]
        print(
            f"{mode:<8} {s['median_step_s']:>12.3f} {s['median_compute_max_over_mean']:>17.2f} "
            f"{s['predicted_llm_max_over_mean']:>20.2f} {s['dispatcher_s']:>11.3f} {s['dispatcher_hidden_s']:>9.3f} "
            f"{s['intra_node_mb']:>11.2f} {s['inter_node_mb']:>10.2f}"
        )
    print(f"speed-up orch vs none (median step time): {speedup:.2f}x; worst loss difference {worst:.1e} relative")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "balance_runtime.json").write_text(
        json.dumps(
            {
                "steps": args.steps,
                "dtype": args.dtype,
                "speedup": speedup,
                "loss_rel_diff": worst,
                "summary": summary,
                "losses": {m: [r["loss"] for r in rs] for m, rs in runs.items()},
            },
            indent=2,
        )
    )
    assert worst <= 1e-9 if args.dtype == "float64" else worst <= 1e-4, f"losses differ: {worst:.2e}"


if __name__ == "__main__":
    main()
