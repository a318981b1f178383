"""Runtime on this machine: the tiny preset, 20 steps on 4 gloo processes, homogeneous vs heterogeneous.

The planner chooses the heterogeneous plan (placement restricted to colocated) and its
homogeneous baseline, with predicted step times; both are executed and the measured ratio
is printed beside the predicted one. A plan the executor cannot run yet (PP/CP/EP) is
replaced by a hand-built one of the same placement, and its prediction shown as n/a.
Writes bench/out/runtime.json. Ratios, not absolute times, are the result (DESIGN.md, Measuring).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from orch.planner.candidates import SearchInput
from orch.planner.errors import OrchError
from orch.planner.loading import load_cluster, load_data, load_model
from orch.planner.plan import Layout, Placement, Plan
from orch.planner.planner import make_plan
from orch.planner.search import SolverConfig
from orch.runtime.executor import RunConfig, check_supported
from orch.runtime.local import run_local
from orch.runtime.plans import hand_plan

STEPS = 20
WARMUP = 2  # steps left out of the median (first-touch allocation, gloo connection set-up)


def _plans() -> dict[str, tuple[Plan, float | None]]:
    model, data = load_model("tiny"), load_data("tiny-mix")
    inp = SearchInput(model, load_cluster("local-cpu"), data, placements=(Placement.COLOCATED,))
    het = make_plan(inp, SolverConfig(time_limit_s=10.0, workers=1, alternatives=0))
    assert het.baseline is not None
    base = hand_plan(model, data, {n: (m.layout, m.ranks) for n, m in het.baseline.modules.items()})
    out: dict[str, tuple[Plan, float | None]] = {}
    fallbacks = {
        "homogeneous": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3])},
        "heterogeneous": {
            "llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
            "vision": (Layout(dp=4), [0, 1, 2, 3]),
            "audio": (Layout(dp=4), [0, 1, 2, 3]),
        },
    }
    for name, plan, predicted in (
        ("homogeneous", base, het.baseline.predicted.step_time_s),
        ("heterogeneous", het, het.predicted.step_time_s),
    ):
        try:
            check_supported(plan)
            out[name] = (plan, predicted)
        except OrchError:
            out[name] = (hand_plan(model, data, fallbacks[name]), None)
    return out


def main() -> None:
    rows = []
    for name, (plan, predicted) in _plans().items():
        with tempfile.TemporaryDirectory() as tmp:
            records = run_local(plan, plan.data, RunConfig(steps=STEPS, seed=0), nproc=plan.world_size, workdir=tmp)
        times = [float(r["step_time_s"]) for r in records[WARMUP:]]
        rows.append(
            {
                "plan": name,
                "layouts": {n: m.layout.short() for n, m in plan.modules.items()},
                "measured_step_s": statistics.median(times),
                "predicted_step_s": predicted,
                "final_loss": records[-1]["loss"],
            }
        )
    homo, het = rows
    measured = homo["measured_step_s"] / het["measured_step_s"]
    if homo["predicted_step_s"] and het["predicted_step_s"]:
        predicted = f"{homo['predicted_step_s'] / het['predicted_step_s']:.2f}"
    else:
        predicted = "n/a"
    print(f"{'plan':<15}{'median step s':>14}{'predicted s':>13}  layouts")
    for r in rows:
        pred = f"{r['predicted_step_s']:.4f}" if r["predicted_step_s"] else "n/a"
        print(f"{r['plan']:<15}{r['measured_step_s']:>14.4f}{pred:>13}  {r['layouts']}")
    print(f"speed-up homogeneous/heterogeneous: measured {measured:.2f}, predicted {predicted}")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "runtime.json").write_text(json.dumps({"rows": rows, "measured_ratio": measured}, indent=2) + "\n")


if __name__ == "__main__":
    main()
