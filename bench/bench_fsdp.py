"""FSDP2 against replicated data parallelism on a model whose training state dominates (~50M parameters, a
text-only LLM), bf16 compute on fp32 masters with AdamW, in one launch of gloo processes on the CPU:

* per-rank state bytes (between steps) at DP 1, 2 and 4 under fsdp, and their ratio to DP 1 (1/DP wanted);
* the planner's predicted peak memory per GPU for the module (planner/costs.py: parameters by
  `state_bytes_per_param` plus activations, without the CUDA reserve) against the measured peak
  (runtime/memory.py), per plan;
* step time of fsdp against replicate at DP 4 (median over the steps after the first).

    python bench/bench_fsdp.py [--steps N]          (writes bench/out/fsdp.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from orch.planner.balance.mode import Mode
from orch.planner.costs import GB, CostConfig, module_cost, module_params
from orch.planner.loading import load_cluster
from orch.planner.plan import DataParallel, Layout, Recompute
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.launch.base import TaskSequence
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.trainer import TrainTask

MODEL = ModelSpec.model_validate(
    {
        "name": "text-50m",
        "modules": {
            "llm": {"kind": "llm", "layers": 8, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 16384},
        },
    }
)
DATA = DataSpec.model_validate({"global_batch": 4, "seq_len": 64, "tasks": [{"weight": 1, "tokens": {"llm": 64}}]})
PLANS = {  # name -> (dp, mode)
    "fsdp dp1": (1, DataParallel.FSDP),
    "fsdp dp2": (2, DataParallel.FSDP),
    "fsdp dp4": (4, DataParallel.FSDP),
    "replicate dp4": (4, DataParallel.REPLICATE),
}


def predicted_gb(dp: int, mode: DataParallel) -> float:
    layout = Layout(dp=dp)
    cost = module_cost(
        MODEL,
        DATA,
        load_cluster("local-cpu"),
        "llm",
        layout,
        DATA.global_batch // dp,
        Recompute.NONE,
        in_flight=1,
        cfg=CostConfig(data_parallel=mode),
    )
    return cost.memory_gb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    cfg = TrainConfig(
        steps=args.steps, seed=0, dtype="bfloat16", balance=Mode.NONE, optimizer="adamw", lr=1e-4, device="cpu"
    )
    plans = {
        name: hand_plan(MODEL, DATA, {"llm": (Layout(dp=dp), list(range(dp)))}, micro_batches=1, data_parallel=mode)
        for name, (dp, mode) in PLANS.items()
    }
    records_of: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in sorted({p.world_size for p in plans.values()}):  # one launch per world size
            names = [n for n, p in plans.items() if p.world_size == world]
            tasks = [
                TrainTask(plans[n], DATA, cfg, str(Path(tmp) / n.replace(" ", "_")), timeout_s=600.0) for n in names
            ]
            records_of |= dict(zip(names, LocalLauncher().submit(TaskSequence(tasks)).result(), strict=True))
    results = [records_of[n] for n in PLANS]
    params = module_params(MODEL.modules["llm"])
    print(f"{MODEL.name}: {params / 1e6:.1f}M parameters, bf16 compute, fp32 masters, AdamW, {args.steps} steps")
    head = (
        f"{'plan':14s} {'state MB':>9s} {'x dp1':>6s} {'peak MB':>8s} {'pred MB':>8s} {'pred/meas':>9s} {'step s':>7s}"
    )
    print(head)
    out: dict[str, dict[str, float]] = {}
    base = None
    for (name, (dp, mode)), records in zip(PLANS.items(), results, strict=True):
        last = records[-1].memory
        state = statistics.median(r["state_bytes"] for r in last.values()) / 1e6
        peak = max(r["peak_bytes"] for r in last.values()) / 1e6
        pred = predicted_gb(dp, mode) * GB / 1e6
        step = statistics.median(r.step_time_s for r in records[1:]) if len(records) > 1 else records[0].step_time_s
        base = base or state
        out[name] = {"dp": dp, "state_mb": state, "state_ratio_to_dp1": state / base, "peak_mb": peak,
                     "predicted_mb": pred, "predicted_over_measured": pred / peak, "step_s": step}  # fmt: skip
        print(f"{name:14s} {state:9.1f} {state / base:6.3f} {peak:8.1f} {pred:8.1f} {pred / peak:9.3f} {step:7.3f}")
    ratio = out["fsdp dp4"]["step_s"] / out["replicate dp4"]["step_s"]
    print(f"step time fsdp / replicate at dp4: {ratio:.3f}")
    out["fsdp_over_replicate_step"] = {"ratio": ratio}
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    (folder / "fsdp.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
