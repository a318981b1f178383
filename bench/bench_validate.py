"""Close the loop on this machine: profile -> plan -> launch -> validate, through the `orch` CLI.

1. `orch profile --model tiny --nproc 4 --quick` (4 gloo processes, 2 emulated nodes x 2);
2. `orch plan --cluster local-cpu --profile` once per placement: the homogeneous baseline and
   the planner's own best colocated and best disaggregated plans (no pins: the runtime executes
   every layout the planner emits for tiny);
3. `orch launch` each for 20 steps, `--rounds` times (default 2, the plans interleaved: the
   shared machine's load drifts); 4. `orch validate --json` each, over its runs' pooled steps.

Prints predicted vs measured step time, the relative error (target: within 20%) and whether
the planner ranks the two plans as the measurement does; writes bench/out/validate.json
(validate_full.json with --full).
The profile comes from the benchmark only: no constant here is tuned to the run.
Usage: .venv/bin/python bench/bench_validate.py [--full] [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from orch_cli import OrchFailed, run_orch

PLANS = {"homogeneous": "homogeneous", "colocated": "colocated", "disaggregated": "disaggregated"}
TARGET = 0.20


def _orch(*args: str) -> str:
    try:
        return run_orch(*args)
    except OrchFailed as err:
        raise SystemExit(str(err)) from None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="the full profile instead of --quick")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="launches per plan, interleaved; their steps are pooled")
    args = ap.parse_args()
    out_dir = Path(__file__).parent / "out"
    out_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="orch-validate-") as tmp:
        work = Path(tmp)
        prof = work / "profile.json"
        t = time.perf_counter()
        quick = [] if args.full else ["--quick"]
        _orch(
            "profile",
            "-m",
            "tiny",
            "--nproc",
            "4",
            *quick,
            "--max-bytes",
            str(1 << 20),
            "--out",
            str(prof),
            "--workdir",
            str(work / "prof"),
            "--json",
        )
        profile_s = time.perf_counter() - t
        (out_dir / ("profile_full.json" if args.full else "profile_quick.json")).write_text(prof.read_text())
        rows = {}
        plans: dict[str, tuple[Path, dict[str, dict[str, int]]]] = {}
        for label, placement in PLANS.items():
            plan = work / f"{label}.yaml"
            plan_json = json.loads(
                _orch(
                    "plan",
                    "-m",
                    "tiny",
                    "-c",
                    "local-cpu",
                    "--profile",
                    str(prof),
                    "--placement",
                    placement,
                    "--out",
                    str(plan),
                    "--json",
                    "--top",
                    "0",
                )
            )
            layouts = {n: m["layout"] for n, m in plan_json["modules"].items()}
            if any(lay == layouts for _, lay in plans.values()):
                print(f"{label}: the planner chose the same layouts as an earlier plan; not run twice")
                continue
            plans[label] = (plan, layouts)
        metrics: dict[str, list[str]] = {label: [] for label in plans}
        for r in range(args.rounds):  # plans interleaved: the machine's drifting load hits each alike
            for label, (plan, _) in plans.items():
                run = work / f"run-{label}-{r}"
                _orch("launch", str(plan), "--steps", str(args.steps), "--workdir", str(run))
                metrics[label].append(str(run / "metrics.jsonl"))
        for label, (plan, layouts) in plans.items():
            files = [a for m in metrics[label] for a in ("--metrics", m)]
            v = json.loads(_orch("validate", "--plan", str(plan), *files, "--json"))
            short = {n: "".join(f"{a}{d}" for a, d in lay.items() if d > 1) or "1" for n, lay in layouts.items()}
            rows[label] = {**v, "layouts": short, "layouts_full": layouts}
    pred_rank = sorted(rows, key=lambda k: rows[k]["predicted_step_time_s"])
    meas_rank = sorted(rows, key=lambda k: rows[k]["measured_step_time_s"])
    print(
        f"profile (--quick={not args.full}) took {profile_s:.1f} s; "
        f"{args.rounds} interleaved runs x {args.steps} steps per plan"
    )
    print(f"{'plan':<12} {'layouts':<34} {'predicted s':>11} {'measured s':>11} {'error':>7} {'within 20%':>10}")
    for label, r in rows.items():
        lay = " ".join(f"{n}:{s}" for n, s in r["layouts"].items())
        ok = abs(r["relative_error"]) <= TARGET
        print(
            f"{label:<12} {lay:<34} {r['predicted_step_time_s']:>11.3f} {r['measured_step_time_s']:>11.3f} "
            f"{r['relative_error']:>+7.0%} {'yes' if ok else 'NO':>10}"
        )
    print(
        f"ranking: predicted {' < '.join(pred_rank)}; measured {' < '.join(meas_rank)}; "
        f"{'match' if pred_rank == meas_rank else 'MISMATCH'}"
    )
    result = {
        "profile_s": profile_s,
        "quick": not args.full,
        "steps": args.steps,
        "rounds": args.rounds,
        "plans": rows,
        "ranking_predicted": pred_rank,
        "ranking_measured": meas_rank,
        "ranking_match": pred_rank == meas_rank,
        "within_target": {k: abs(r["relative_error"]) <= TARGET for k, r in rows.items()},
    }
    path = out_dir / ("validate_full.json" if args.full else "validate.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
