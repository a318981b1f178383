"""Planner scale: CP-SAT layout search on clusters up to 2,560 GPUs, three modules.

Prints a table and writes bench/out/plan.json. Target (issue 2): 2,560 GPUs with three
modules planned in under 10 s on one core. Times are wall-clock on this (shared, noisy)
machine; the search uses one CP-SAT worker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from orch.planner.candidates import SearchInput
from orch.planner.loading import load_cluster, load_data
from orch.planner.planner import make_plan
from orch.planner.search import SolverConfig, build_candidates
from orch.runtime.models.registry import load_model

# (model, cluster, nodes, data, global batch): the batch grows with the cluster, as it does in
# practice (OrchMLLM's 2,560-GPU runs), so every DP degree has samples to work on.
CASES = [
    ("omni-84b", "h100-80g", 8, "omni-mix", 1024),
    ("omni-84b", "h100-80g", 64, "omni-mix", 2048),
    ("omni-84b", "h100-80g", 320, "omni-mix", 5120),
    ("llava-1b-70b", "h100-80g", 320, "llava-mix", 5120),
    ("vit-12b-120b", "h100-80g", 320, "llava-mix", 5120),
]


def main() -> None:
    rows = []
    for model, cluster, nodes, data, batch in CASES:
        data_spec = load_data(data).model_copy(update={"global_batch": batch})
        inp = SearchInput(load_model(model), load_cluster(cluster, nodes), data_spec)
        t0 = time.perf_counter()
        cands = build_candidates(inp)
        t1 = time.perf_counter()
        plan = make_plan(inp, SolverConfig(time_limit_s=10.0, workers=1, alternatives=0))
        t2 = time.perf_counter()
        base = plan.baseline.predicted.step_time_s if plan.baseline else float("nan")
        rows.append(
            {
                "model": model,
                "gpus": inp.world,
                "global_batch": batch,
                "modules": len(inp.model.modules),
                "candidates": cands.size(),
                "enumerate_s": round(t1 - t0, 3),
                "plan_s": round(t2 - t1, 3),
                "placement": plan.placement.value,
                "layouts": {n: m.layout.short() for n, m in plan.modules.items()},
                "step_s": round(plan.predicted.step_time_s, 3),
                "baseline_step_s": round(base, 3),
                "gain": round(base / plan.predicted.step_time_s - 1, 3),
                "mfu": round(plan.predicted.mfu, 3),
            }
        )
    header = f"{'model':<14}{'GPUs':>6}{'batch':>6}{'mods':>5}{'cands':>7}{'plan s':>8}  {'placement':<14}{'step s':>8}"
    header += f"{'base s':>8}{'gain':>8}{'MFU':>6}  layouts"
    print(header)
    for r in rows:
        lay = "; ".join(f"{n} {v}" for n, v in r["layouts"].items())
        print(
            f"{r['model']:<14}{r['gpus']:>6}{r['global_batch']:>6}{r['modules']:>5}{r['candidates']:>7}{r['plan_s']:>8.2f}  "
            f"{r['placement']:<14}{r['step_s']:>8.2f}{r['baseline_step_s']:>8.2f}{r['gain']:>+8.1%}{r['mfu']:>6.1%}  {lay}"
        )
    out = Path(__file__).parent / "out" / "plan.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
