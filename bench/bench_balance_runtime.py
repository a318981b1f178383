"""Post-balancing in the running system: `--balance orch` vs `--balance none`, measured here.

2 gloo processes (one per core, one torch thread each), homogeneous DP2 (2 emulated nodes of one
rank), a widened tiny model and a skewed multimodal mix (`bench_specs`: four in five samples
are short captions, one in ten a long video, one in ten an ASR clip), global batch 16 (8
samples per rank, so which rank draws the videos decides the step), float64. Both modes
calibrate the dispatcher's cost model at startup (TrainConfig.calibrate, calibration.calibrate_module),
so their predicted costs are comparable. The two modes run as two executors in one process group on the
same global batches, step k of each back to back in alternating order (the load of this shared
machine drifts; alternating cancels it). Per mode: median step time over the steps after
warm-up, the ratio, per-rank compute (encoder forwards + backwards + LLM forward/backward) as
max/mean over ranks, the dispatcher's seconds and how many were hidden behind the previous step,
bytes moved inside and across nodes. The losses of the two modes must agree to 1e-9 relative
(asserted). Columns: "compute max s / max/mean" over the per-rank sums of encoder forwards and
backwards and the LLM; "critical s" the sum over those phases of the slowest rank's seconds (each
phase ends in a collective, so this is what a step waits for) and "ideal s" of the mean rank's
(perfect balance; the floor of "critical s").

The speed-up is given three ways over the same steps (ratio of median step times, median of the
per-step ratios: both modes ran step k's batch; ratio of total times), next to the ceiling of any
balancing on the same batches, measured in the same run from the unbalanced steps: each step
with its phases at their mean rank ("every phase at its mean rank"), or, where one sample alone
outweighs the mean rank, at that sample's cost ("whole samples": the dispatcher's floor_cost).
With two ranks the ceiling itself is about 1.3x; bench_balance_scaling.py shows how it grows
with DP. Prints a table, writes bench/out/balance_runtime.json. Ratios, not absolute times, are
the result (docs/design.md, Measuring).

    .venv/bin/python bench/bench_balance_runtime.py [--steps 30] [--mix skewed|video-heavy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from orch.planner.plan import Layout, Plan
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

WARMUP = 2  # steps left out of the medians (first-touch allocation, gloo connection set-up)
MODES = ("none", "orch")
MIXES = ("skewed", "video-heavy")


def bench_specs(mix: str = "skewed") -> tuple[ModelSpec, DataSpec]:
    """The tiny preset, widened so that per-sample cost (and a step) is dominated by compute."""
    tiny = load_model("tiny")
    mods = tiny.model_dump()["modules"]
    mods["vision"].update(hidden=128, heads=4, ffn=256, layers=2)
    mods["audio"].update(hidden=128, heads=4, ffn=256, layers=2)
    mods["llm"].update(hidden=192, heads=4, kv_heads=2, ffn=384, layers=3)
    model = ModelSpec.model_validate({**tiny.model_dump(), "name": "tiny-wide", "modules": mods})
    # The skewed mix of the issue: long videos and ASR clips among short captions. Lengths are
    # log-normal around the mean (planner/data.py), capped at `max`; an LLM length counts the
    # projected encoder tokens too (vision: 1 LLM token per encoder token, audio: 1 per 2), so a
    # video is ~550 LLM tokens, an ASR clip ~250 and a caption ~40 (real ones: a few thousand, a
    # thousand or two, a hundred or two). With attention, a video costs ~20-30 captions and an ASR
    # clip ~7: with 8 samples per rank, which rank draws the one or two videos decides the step.
    data = DataSpec(
        name="skewed-mix",
        global_batch=16,
        seq_len=1024,
        tasks=[
            # 80% short captions: a small image and a one-line caption
            {"name": "caption", "weight": 0.8, "tokens": {"vision": 16, "llm": 40}, "max": {"vision": 32, "llm": 64}},
            # 10% long videos: many frames' tokens and a short description
            {
                "name": "video",
                "weight": 0.1,
                "tokens": {"vision": 512, "llm": 544},
                "max": {"vision": 1024, "llm": 1024},
            },
            # 10% ASR clips: audio tokens (stride-2 projector) and their transcript
            {"name": "asr", "weight": 0.1, "tokens": {"audio": 384, "llm": 256}, "max": {"audio": 768, "llm": 448}},
        ],
    )
    if mix == "video-heavy":
        # Fewer captions, more and longer-tailed videos and clips (spread 1.0): 4 in 10 captions, 3 videos,
        # 3 ASR clips. Which rank draws them decides more of the step, as with video-first data mixes.
        tasks = [dict(t) for t in data.model_dump()["tasks"]]
        tasks[0]["weight"] = 0.4
        for t in tasks[1:]:
            t.update(weight=0.3, spread=1.0)
        data = DataSpec.model_validate({**data.model_dump(), "name": "video-heavy-mix", "tasks": tasks})
    return model, data


def bench_plan(model: ModelSpec, data: DataSpec) -> Plan:
    plan = hand_plan(model, data, {"llm": (Layout(dp=2), [0, 1])}, micro_batches=1)
    return plan.model_copy(update={"ranks_per_node": 1})


def _compute(phases: dict[str, float], encoders: list[str], llm: str) -> float:
    return sum(phases.get(f"{e}.fwd", 0.0) + phases.get(f"{e}.bwd", 0.0) for e in encoders) + phases[f"{llm}.fwd_bwd"]


def _phase_times(phases: dict[str, float], encoders: list[str], llm: str) -> dict[str, float]:
    """Compute seconds per balanced phase: each encoder's forward, the LLM, each encoder's backward."""
    out = {f"{e}.fwd": phases.get(f"{e}.fwd", 0.0) for e in encoders}
    out[llm] = phases[f"{llm}.fwd_bwd"]
    out.update({f"{e}.bwd": phases.get(f"{e}.bwd", 0.0) for e in encoders})
    return out


def critical_and_ideal(record: dict, model: ModelSpec, whole_samples: bool = False) -> tuple[float, float]:
    """One step's compute: the sum over its phases of the slowest rank's seconds (what the step waits
    for: each phase ends in a collective) and of the mean rank's (every phase perfectly balanced).
    `whole_samples`: a phase's ideal is raised to its costliest sample where that sample alone
    outweighs the mean rank (the dispatcher's floor_cost / mean_cost: no rank can hold half a video), and at most
    to the phase's slowest rank measured (which ran that sample: where the dispatcher's calibrated costs overstate a
    long sample, their ratio would put the floor above what was measured)."""
    per_phase = [_phase_times(p, sorted(model.encoder_names), model.llm_name) for p in record["ranks"].values()]
    critical = sum(max(t[k] for t in per_phase) for k in per_phase[0])
    ideal = 0.0
    for k in per_phase[0]:
        stats = record["balance"]["llm" if k == model.llm_name else k.split(".")[0]]
        raise_to = stats["floor_cost"] / stats["mean_cost"] if whole_samples and stats["mean_cost"] > 0 else 1.0
        ideal += min(max(t[k] for t in per_phase), statistics.mean(t[k] for t in per_phase) * raise_to)
    return critical, ideal


def balanced_floor(records: list[dict], model: ModelSpec, whole_samples: bool = False) -> list[float]:
    """Per step (after warm-up), the step time had every phase run at its ideal (`critical_and_ideal`):
    the step minus (critical - ideal). Work is conserved, so no balancing beats the mean rank; nor,
    with whole samples, the costliest sample. step / floor of the unbalanced run is the ceiling of
    what any balancing can gain on these batches, measured in the same run."""
    out = []
    for r in records[WARMUP:]:
        critical, ideal = critical_and_ideal(r, model, whole_samples)
        out.append(r["step_time_s"] - critical + ideal)
    return out


def speedups(slow: list[float], fast: list[float]) -> dict[str, float]:
    """slow vs fast over the same steps: the ratio of median step times, the median of the per-step
    ratios (both modes ran the same global batch in step k), and the ratio of total times."""
    return {
        "ratio_of_medians": statistics.median(slow) / statistics.median(fast),
        "median_of_step_ratios": statistics.median(a / b for a, b in zip(slow, fast, strict=True)),
        "ratio_of_totals": sum(slow) / sum(fast),
    }


def summarise(records: list[dict], model: ModelSpec) -> dict[str, float]:
    kept = records[WARMUP:]
    encs = sorted(model.encoder_names)
    max_over_mean = []
    critical, ideal = [], []  # per step: sum over phases of the slowest rank, of the mean rank
    for r in kept:
        per_rank = [_compute(p, encs, model.llm_name) for p in r["ranks"].values()]
        max_over_mean.append(max(per_rank) / statistics.mean(per_rank))
        c, i = critical_and_ideal(r, model)
        critical.append(c)
        ideal.append(i)
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
        "mean_step_s": statistics.mean(r["step_time_s"] for r in kept),
        "median_compute_max_over_mean": statistics.median(max_over_mean),
        # the phases are separated by collectives (boundary moves): a step waits for each phase's slowest rank
        "median_compute_critical_s": statistics.median(critical),
        "median_compute_ideal_s": statistics.median(ideal),
        "median_compute_max_s": statistics.median(
            max(_compute(p, encs, model.llm_name) for p in r["ranks"].values()) for r in kept
        ),
        "predicted_llm_max_over_mean": statistics.median(b["llm"]["max_cost"] / b["llm"]["mean_cost"] for b in bal),
        "median_grad_sync_s": statistics.median(
            max(p.get("grad_sync", 0.0) for p in r["ranks"].values()) for r in kept
        ),
        "median_optimizer_s": statistics.median(
            max(p.get("optimizer", 0.0) for p in r["ranks"].values()) for r in kept
        ),
        "dispatcher_s": sum(b["dispatcher_s"] for b in bal),
        "dispatcher_hidden_s": sum(b["dispatcher_hidden_s"] for b in bal),
        "inter_node_mb": sum(b[p]["inter_node_bytes"] for b in bal for p in [*encs, "llm"]) / 1e6,
        "intra_node_mb": sum(b[p]["intra_node_bytes"] for b in bal for p in [*encs, "llm"]) / 1e6,
    }


def bench_config(steps: int, dtype: str, **fields) -> TrainConfig:
    """The training config of every benchmarked run: SGD lr 0.1, seed 0, the dispatcher calibrated at start-up;
    `fields`: the run's own (its balance, encoder_balance, ...)."""
    return TrainConfig(optimizer="sgd", lr=0.1, steps=steps, seed=0, dtype=dtype, calibrate=True, **fields)


def _interleaved(
    plan_json: str, data_json: str, steps: int, dtype: str, out: str, ctx, extra=None, configs=None
) -> None:
    """Both modes in one process group, step k of each back to back (order alternating per step),
    so that the machine's drifting load hits both alike. `extra`: a picklable `extra(ctx, plan, data)`
    returning more runs {name: step(k)} to interleave with the modes (each step returning what
    TrainStep.step does: loss, step_time_s, phases, balance), e.g. bench_qwen_vl.py's DDP baseline; its
    `finish()`, where it has one, is called after the last step (bench_omni.py's run of another plan).
    `configs`: run name -> TrainConfig fields (default: each of MODES as `balance`), e.g. bench_item_balance.py's
    encoder_balance settings."""

    import torch.distributed as dist

    from orch.runtime.train.step import TrainStep

    rank, world = ctx.env.rank, ctx.env.world
    plan, data = Plan.model_validate_json(plan_json), DataSpec.model_validate_json(data_json)
    configs = configs or {m: {"balance": m} for m in MODES}
    exs = {m: TrainStep(plan, data, bench_config(steps, dtype, **fields), rank, world) for m, fields in configs.items()}
    runs = {m: ex.step for m, ex in exs.items()}
    if extra is not None:
        runs.update(extra(ctx, plan, data))
    names = list(runs)
    records: dict[str, list[dict]] = {m: [] for m in names}
    for k in range(steps):
        for mode in names if k % 2 == 0 else names[::-1]:
            dist.barrier()
            m = runs[mode](k)
            everyone: list[dict[str, float] | None] = [None] * world
            dist.all_gather_object(everyone, {**m.phases, "step": m.step_time_s})
            ranks = {str(r): p for r, p in enumerate(everyone) if p}
            step_s = max(p["step"] for p in ranks.values())
            records[mode].append(
                {"step": k, "loss": m.loss, "step_time_s": step_s, "ranks": ranks, "balance": m.balance}
            )
    for ex in exs.values():
        ex.finish()
    if extra is not None and hasattr(extra, "finish"):
        extra.finish()
    if rank == 0:
        Path(out).write_text(json.dumps(records))
    dist.barrier()


def main() -> None:
    from functools import partial

    from orch.runtime.launch.base import FunctionTask
    from orch.runtime.launch.local import LocalLauncher

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--mix", choices=MIXES, default="skewed", help="the skewed mix, or a video-heavier one")
    args = parser.parse_args()
    model, data = bench_specs(args.mix)
    plan = bench_plan(model, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.json"
        body = partial(_interleaved, plan.model_dump_json(), data.model_dump_json(), args.steps, args.dtype, str(path))
        LocalLauncher().submit(FunctionTask(body, plan.world_size, tmp, timeout_s=300)).wait()
        runs: dict[str, list[dict]] = json.loads(path.read_text())
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(runs["orch"], runs["none"], strict=True))
    summary = {mode: summarise(records, model) for mode, records in runs.items()}
    steps = {mode: [r["step_time_s"] for r in records[WARMUP:]] for mode, records in runs.items()}
    achieved = speedups(steps["none"], steps["orch"])
    ceiling = speedups(steps["none"], balanced_floor(runs["none"], model))
    whole = speedups(steps["none"], balanced_floor(runs["none"], model, whole_samples=True))
    speedup = achieved["ratio_of_medians"]

    head = (
        f"{'balance':<8} {'step s (med)':>12} {'step s (mean)':>13} {'compute max s':>14} {'compute max/mean':>17} "
        f"{'critical s':>11} {'ideal s':>8} "
        f"{'cost max/mean (llm)':>20} {'sync s':>7} {'optim s':>8} "
        f"{'dispatch s':>11} {'hidden s':>9} {'MB in-node':>11} {'MB x-node':>10}"
    )
    print(
        f"bench_balance_runtime --mix {args.mix} ({data.name}): {args.steps} steps ({WARMUP} warm-up left out), 2 processes, {args.dtype}"
    )
    print(head)
    for mode in MODES:
        s = summary[mode]
        print(
            f"{mode:<8} {s['median_step_s']:>12.3f} {s['mean_step_s']:>13.3f} {s['median_compute_max_s']:>14.3f} "
            f"{s['median_compute_max_over_mean']:>17.2f} {s['median_compute_critical_s']:>11.3f} "
            f"{s['median_compute_ideal_s']:>8.3f} {s['predicted_llm_max_over_mean']:>20.2f} "
            f"{s['median_grad_sync_s']:>7.3f} {s['median_optimizer_s']:>8.3f} "
            f"{s['dispatcher_s']:>11.3f} {s['dispatcher_hidden_s']:>9.3f} "
            f"{s['intra_node_mb']:>11.2f} {s['inter_node_mb']:>10.2f}"
        )
    print(f"worst loss difference orch vs none: {worst:.1e} relative")
    # the step-time distribution is skewed and bimodal (a step whose videos land on one rank is slow,
    # and gains most): three statistics of the same steps, next to the ceiling measured on them
    print(f"{'speed-up vs none':<44} {'ratio of medians':>16} {'median step ratio':>18} {'ratio of totals':>16}")
    for label, sp in (
        ("orch (measured)", achieved),
        ("ceiling: every phase at its mean rank", ceiling),
        ("ceiling: whole samples (none split)", whole),
    ):
        print(
            f"{label:<44} {sp['ratio_of_medians']:>15.2f}x {sp['median_of_step_ratios']:>17.2f}x "
            f"{sp['ratio_of_totals']:>15.2f}x"
        )
    for label, top in (("mean rank", ceiling), ("whole samples", whole)):
        shares = (
            f"{achieved[k] / top[k]:.0%}" for k in ("ratio_of_medians", "median_of_step_ratios", "ratio_of_totals")
        )
        print(f"orch / ceiling ({label}): {', '.join(shares)}")
    mean_speedup = achieved["ratio_of_totals"]
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    name = "balance_runtime.json" if args.mix == "skewed" else f"balance_runtime_{args.mix}.json"
    (out / name).write_text(
        json.dumps(
            {
                "steps": args.steps,
                "mix": args.mix,
                "data": data.model_dump(mode="json"),
                "dtype": args.dtype,
                "speedup": speedup,
                "speedup_mean_step": mean_speedup,
                "speedups": achieved,
                "ceiling": ceiling,
                "ceiling_whole_samples": whole,
                "loss_rel_diff": worst,
                "summary": summary,
                "losses": {m: [r["loss"] for r in rs] for m, rs in runs.items()},
                "records": runs,  # per step and rank: every phase's seconds, the balance metrics
            },
            indent=2,
        )
    )
    assert worst <= 1e-9 if args.dtype == "float64" else worst <= 1e-4, f"losses differ: {worst:.2e}"


if __name__ == "__main__":
    main()
