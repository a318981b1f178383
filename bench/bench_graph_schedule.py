"""Disaggregated plans on this machine: the graph-aware 1F1B against running the islands in turn.

The tiny preset, widened, with its encoders on one rank and the LLM on the other (2 gloo processes, one
per core, `torch.set_num_threads(1)`), the LLM's step cut into 4 micro-batches. `three_phase`
runs all encoder forwards, then the LLM, then the encoder backwards, so each island idles while
the other computes; `graph_1f1b` pipelines encoder micro-batch m + 1 with the LLM's m. Both
runs train the same batches (equal losses are checked). Medians over 20 steps after 2 warm-up
steps, and the ratio, are the result (docs/design.md, Measuring). Writes bench/out/graph_schedule.json.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.trainer import TrainTask

STEPS = 20
WARMUP = 2
MICRO_BATCHES = 4


def main() -> None:
    tiny = load_model("tiny")
    # Encoders about as heavy as the LLM (the case disaggregation is for), a step of ~1 s on this machine.
    wide = {n: m.model_copy(update={"hidden": 128, "ffn": 256, "layers": 4}) for n, m in tiny.modules.items()}
    model = tiny.model_copy(update={"modules": wide})
    data = load_data("tiny-mix").model_copy(update={"global_batch": 32})
    layouts = {"llm": (Layout(dp=1), [1]), "vision": (Layout(dp=1), [0]), "audio": (Layout(dp=1), [0])}
    plan = hand_plan(model, data, layouts, micro_batches=MICRO_BATCHES)
    rows = []
    losses = {}
    for schedule in ("three_phase", "graph_1f1b"):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=0, schedule=schedule, balance="none")
            records = LocalLauncher().submit(TrainTask(plan, data, cfg, tmp)).result()
        times = [r.step_time_s for r in records[WARMUP:]]
        losses[schedule] = [r.loss for r in records]
        rows.append({"schedule": schedule, "median_step_s": statistics.median(times), "min_step_s": min(times)})
    same = all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(*losses.values(), strict=True))
    ratio = rows[0]["median_step_s"] / rows[1]["median_step_s"]
    print(f"plan: vision+audio dp1 on rank 0 | llm dp1 on rank 1, {MICRO_BATCHES} micro-batches, {STEPS} steps")
    print(f"{'schedule':<14}{'median step s':>15}{'min step s':>12}")
    for r in rows:
        print(f"{r['schedule']:<14}{r['median_step_s']:>15.4f}{r['min_step_s']:>12.4f}")
    print(f"speed-up graph_1f1b over three_phase: {ratio:.2f}x (median); losses equal: {same}")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    doc = {"rows": rows, "ratio": ratio, "losses_equal": same, "micro_batches": MICRO_BATCHES, "steps": STEPS}
    (out / "graph_schedule.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
