"""How post-balancing's gain grows with the number of DP ranks, predicted with the runtime's own
dispatcher and its cost model calibrated on this machine.

bench_balance_runtime measures DP 2 (this machine has two cores). Two ranks bound the gain: a
step waits for the larger of two rank loads, and no placement of whole samples does better than
every phase at its mean rank (or the longest single sample, if that is longer). This bench draws
global batches of 8 samples per rank (as the runtime bench does) from the same model and mixes
for DP 2 to 64, and prices each step's compute critical path, Σ over phases (each encoder's
forward+backward, the LLM's) of the slowest rank's seconds:

  none     the samples where they were drawn (`--balance none`);
  orch     where `PostBalancer.dispatch` puts them (the runtime's code: token cap, fallback);
  floor    Σ over phases of max(mean rank, longest sample): what no balancing can beat.

Costs are the dispatcher's model (planner/sample_cost.py: constant + linear·len + quadratic·len² per
sample), in seconds, calibrated as the runtime does it when the plan carries no profiled cost. Fixed
per-step work (gradient sync, optimizer, routes) is left out, so these are compute ratios; at DP 2 compare them with
bench_balance_runtime's measured "critical s" columns. Prints a table, writes
bench/out/balance_scaling.json.

With `--search N` it also draws N random caption/video/ASR mixes (weights, lengths, spread, 2 to
16 samples per rank) and prints how high the two-rank ceiling goes over them.

    .venv/bin/python bench/bench_balance_scaling.py [--steps 64] [--dp 2 4 8 16 64] [--search 40]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from bench_balance_runtime import MIXES, bench_specs

from orch.planner.balance.mode import Mode
from orch.planner.plan import Layout
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.plans import hand_plan

SAMPLES_PER_RANK = 8
RANKS_PER_NODE = 8


def calibrated_costs(model: ModelSpec, data: DataSpec) -> dict[str, SampleCost]:
    """Per module: the dispatcher's start-up calibration, in seconds (runtime/train/calibration.py)."""
    import torch

    from orch.runtime.data.batch import encoder_order
    from orch.runtime.host_memory import keep_freed_memory
    from orch.runtime.train.calibration import calibrate_module, longest_sample

    torch.set_num_threads(1)
    keep_freed_memory()  # as a rank runs (runtime/launch/procgroup.py)
    calibration = {}
    for m in [*encoder_order(model), model.llm_name]:
        cost = calibrate_module(model, m, torch.float64, "cpu", longest_sample(data, model, m)).cost
        if cost is None:
            raise SystemExit(f"{m}: this machine was too noisy to time the module; run the bench again")
        calibration[m] = cost
    return calibration


def step_costs(
    model: ModelSpec,
    data: DataSpec,
    dp: int,
    steps: int,
    calibration: dict[str, SampleCost],
    samples_per_rank: int = SAMPLES_PER_RANK,
) -> dict[str, list[float]]:
    """Per step: the compute critical path in seconds with none, with orch, and the floor."""
    from orch.runtime.data.synthetic import SyntheticBatch
    from orch.runtime.parallel.grid import build_grids
    from orch.runtime.train.post_balance import PostBalancer, lengths_columns, phase_name

    data_dp = data.model_copy(update={"global_batch": samples_per_rank * dp})
    plan = hand_plan(model, data_dp, {model.llm_name: (Layout(dp=dp), list(range(dp)))}, micro_batches=1)
    plan = plan.model_copy(update={"ranks_per_node": min(RANKS_PER_NODE, dp)})
    orch = PostBalancer(plan, build_grids(plan.modules), Mode.ORCH, 8, calibration)
    out: dict[str, list[float]] = {"none": [], "orch": [], "floor": []}
    for step in range(steps):
        batch = SyntheticBatch.build(model, data_dp, 0, step)
        lengths = lengths_columns(model, batch)
        stats = orch.dispatch(step, lengths).stats
        none = balanced = floor = 0.0
        for m in lengths:
            s = stats[phase_name(model, m)]  # seconds: the calibration's unit
            none += s["max_cost_before"]
            balanced += s["max_cost"]
            floor += s["floor_cost"]
        out["none"].append(none)
        out["orch"].append(balanced)
        out["floor"].append(floor)
    return out


def random_mix(rng: random.Random, data: DataSpec) -> DataSpec:
    """A caption / video / ASR mix with random weights, lengths and spread (the ranges the runtime
    bench's mixes come from), to see how high the two-rank ceiling goes over mixes."""
    captions = rng.choice([0.3, 0.5, 0.7, 0.8, 0.9])
    videos = rng.uniform(0.05, 1 - captions)
    spread = rng.choice([0.5, 1.0, 1.5])
    vision, audio = rng.choice([128, 256, 512]), rng.choice([128, 256, 384])
    tasks = [
        {"name": "caption", "weight": captions, "tokens": {"vision": 16, "llm": 40}, "max": {"vision": 32, "llm": 64}},
        {
            "name": "video",
            "weight": videos,
            "tokens": {"vision": vision, "llm": vision + 32},
            "max": {"vision": 1024, "llm": 1024},
            "spread": spread,
        },
        {
            "name": "asr",
            "weight": max(1 - captions - videos, 0.01),
            "tokens": {"audio": audio, "llm": audio // 2 + 64},
            "max": {"audio": 1024, "llm": 1024},
            "spread": spread,
        },
    ]
    return DataSpec.model_validate({**data.model_dump(), "name": "random-mix", "tasks": tasks})


def search_mixes(count: int, steps: int, dp: int, seed: int) -> list[dict]:
    """`count` random mixes (and 2 to 16 samples per rank) at `dp` ranks: ceiling and orch per mix."""
    model, data = bench_specs("skewed")
    calibration = calibrated_costs(model, data)
    rng, rows = random.Random(seed), []
    for _ in range(count):
        mix = random_mix(rng, data)
        per_rank = rng.choice([2, 4, 8, 16])
        c = step_costs(model, mix, dp, steps, calibration, per_rank)
        rows.append(
            {
                "samples_per_rank": per_rank,
                "tasks": [(t.name, round(t.weight, 2), t.tokens, t.spread) for t in mix.tasks],
                "ceiling": _speedup(c["none"], c["floor"]),
                "orch": _speedup(c["none"], c["orch"]),
            }
        )
    return rows


def _speedup(slow: list[float], fast: list[float]) -> tuple[float, float]:
    """(ratio of median step times, ratio of totals) over the same steps."""
    return statistics.median(slow) / statistics.median(fast), sum(slow) / sum(fast)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=64, help="global batches drawn per DP size")
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4, 8, 16, 64])
    parser.add_argument("--mix", choices=MIXES, nargs="+", default=list(MIXES))
    parser.add_argument("--search", type=int, default=0, help="also this many random mixes at DP 2")
    args = parser.parse_args()
    print(
        f"bench_balance_scaling: compute critical path per step, {SAMPLES_PER_RANK} samples per rank, "
        f"{args.steps} global batches per DP size; costs calibrated here (float64, one thread)"
    )
    head = (
        f"{'mix':<12} {'dp':>4} {'none ms':>9} {'orch ms':>9} {'floor ms':>9} "
        f"{'orch x (med)':>13} {'orch x (tot)':>13} {'ceiling x (med)':>16} {'ceiling x (tot)':>16} {'orch/ceiling':>13}"
    )
    print(head)
    rows = []
    for mix in args.mix:
        model, data = bench_specs(mix)
        calibration = calibrated_costs(model, data)
        for dp in args.dp:
            c = step_costs(model, data, dp, args.steps, calibration)
            orch_med, orch_tot = _speedup(c["none"], c["orch"])
            ceil_med, ceil_tot = _speedup(c["none"], c["floor"])
            rows.append(
                {
                    "mix": mix,
                    "dp": dp,
                    "median_none_s": statistics.median(c["none"]),
                    "median_orch_s": statistics.median(c["orch"]),
                    "median_floor_s": statistics.median(c["floor"]),
                    "orch_speedup_medians": orch_med,
                    "orch_speedup_totals": orch_tot,
                    "ceiling_speedup_medians": ceil_med,
                    "ceiling_speedup_totals": ceil_tot,
                    "steps": c,
                }
            )
            print(
                f"{mix:<12} {dp:>4} {1e3 * statistics.median(c['none']):>9.0f} {1e3 * statistics.median(c['orch']):>9.0f} "
                f"{1e3 * statistics.median(c['floor']):>9.0f} {orch_med:>12.2f}x {orch_tot:>12.2f}x "
                f"{ceil_med:>15.2f}x {ceil_tot:>15.2f}x {orch_tot / ceil_tot:>12.0%}"
            )
    searched = search_mixes(args.search, args.steps, 2, seed=1) if args.search else []
    if searched:
        print(f"\n{args.search} random mixes at DP 2 (compute only; ratio of medians, ratio of totals):")
        for label, key in (("ceiling", "ceiling"), ("orch", "orch")):
            for k, stat in ((0, "medians"), (1, "totals")):
                vals = sorted(r[key][k] for r in searched)
                q = [vals[int(f * (len(vals) - 1))] for f in (0.0, 0.5, 0.9, 1.0)]
                print(
                    f"  {label:<8} ({stat:<7}): min {q[0]:.2f}x  median {q[1]:.2f}x  p90 {q[2]:.2f}x  max {q[3]:.2f}x"
                )
        top = max(searched, key=lambda r: r["ceiling"][1])
        print(
            f"  highest ceiling: {top['ceiling'][1]:.2f}x (totals), {top['samples_per_rank']} per rank, {top['tasks']}"
        )
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "balance_scaling.json").write_text(
        json.dumps(
            {"samples_per_rank": SAMPLES_PER_RANK, "steps": args.steps, "rows": rows, "search": searched}, indent=2
        )
    )


if __name__ == "__main__":
    main()
