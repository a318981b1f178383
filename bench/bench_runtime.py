"""Runtime on this machine: the tiny preset, 20 steps on 4 gloo processes, homogeneous vs heterogeneous.

The planner's homogeneous baseline and its best colocated and best disaggregated plans (each
search restricted to that placement; one whose layouts equal the baseline's is left out), with
predicted step times; each is executed and its measured speed-up over the baseline is printed
beside the predicted one. Gain = baseline step time / plan step time.
Writes bench/out/runtime.json. Ratios, not absolute times, are the result (docs/design.md, Measuring).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from orch.planner.candidates import SearchInput
from orch.planner.errors import OrchError
from orch.planner.loading import load_cluster, load_data
from orch.planner.plan import Placement, Plan
from orch.planner.planner import make_plan
from orch.planner.search import SolverConfig
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.support import check_supported
from orch.runtime.train.trainer import TrainTask

STEPS = 20
WARMUP = 2  # steps left out of the median (first-touch allocation, gloo connection set-up)


def _plans() -> dict[str, tuple[Plan, float | None]]:
    """The homogeneous baseline and the planner's best plan of each other placement (if different)."""
    model, data = load_model("tiny"), load_data("tiny-mix")
    out: dict[str, tuple[Plan, float | None]] = {}
    for placement in (Placement.COLOCATED, Placement.DISAGGREGATED):
        inp = SearchInput(model, load_cluster("local-cpu"), data, placements=(placement,))
        plan = make_plan(inp, SolverConfig(time_limit_s=10.0, workers=1, alternatives=0))
        assert plan.baseline is not None
        if "homogeneous" not in out:
            base = hand_plan(model, data, {n: (m.layout, m.ranks) for n, m in plan.baseline.modules.items()})
            out["homogeneous"] = (base, plan.baseline.predicted.step_time_s)
        same = all(m.layout == plan.baseline.modules[n].layout for n, m in plan.modules.items())
        if same:
            continue  # the search kept the baseline's layouts: nothing new to measure
        try:
            check_supported(plan)
        except OrchError as exc:
            print(f"{placement}: the chosen plan is not executable here ({exc}); skipped")
            continue
        out[str(placement)] = (plan, plan.predicted.step_time_s)
    return out


def main() -> None:
    rows = []
    for name, (plan, predicted) in _plans().items():
        with tempfile.TemporaryDirectory() as tmp:
            cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=0, balance="none")
            records = LocalLauncher().submit(TrainTask(plan, plan.data, cfg, tmp)).result()
        times = [r.step_time_s for r in records[WARMUP:]]
        rows.append(
            {
                "plan": name,
                "layouts": {n: m.layout.short() for n, m in plan.modules.items()},
                "measured_step_s": statistics.median(times),
                "predicted_step_s": predicted,
                "final_loss": records[-1]["loss"],
            }
        )
    homo = rows[0]
    print(f"{'plan':<15}{'median step s':>14}{'predicted s':>13}{'measured gain':>15}{'predicted gain':>16}  layouts")
    for r in rows:
        r["measured_ratio"] = homo["measured_step_s"] / r["measured_step_s"]
        r["predicted_ratio"] = homo["predicted_step_s"] / r["predicted_step_s"]
        print(
            f"{r['plan']:<15}{r['measured_step_s']:>14.4f}{r['predicted_step_s']:>13.4f}"
            f"{r['measured_ratio']:>14.2f}x{r['predicted_ratio']:>15.2f}x  {r['layouts']}"
        )
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "runtime.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
