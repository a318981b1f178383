"""FSDP2 keep and reshard (ZeRO-3) against replicated data parallelism on a model whose training state dominates
(~50M parameters, a text-only LLM: 10 blocks of width 512, a vocabulary of 8,192), bf16 compute on fp32 masters
with AdamW, in one launch of gloo processes per world size on the CPU:

* per-rank state bytes (between steps) and measured peak at DP 1, 2 and 4 for keep and reshard, and the state's
  ratio to DP 1 (1/DP wanted); reshard's peak at DP 4 against its DP 1 peak;
* the planner's predicted peak memory per GPU for the module (planner/costs.py: `state_bytes_per_param`, the
  gathered blocks in flight under reshard, plus activations, without the CUDA reserve) beside the measured
  peak (runtime/memory.py: on the CPU the shards, the gathered parameters and gradients and the activations'
  peak), per plan;
* step time of keep, reshard and replicate at DP 4 in the same launch (median over the steps after the first),
  and what empty micro-batches cost: a DP 4 reshard run on 3 samples, where one rank only makes the gathers;
* the planner's choice for a Qwen2.5-VL-7B-shaped model on one node of 8 x 80 GB, keep only (before) and with
  reshard priced (after): layouts, predicted memory and step time.

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
from orch.planner.loading import load_cluster, load_data
from orch.planner.plan import DataParallel, Layout, Plan, Recompute, Sharding
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
            "llm": {"kind": "llm", "layers": 10, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 8192},
        },
    }
)
DATA = DataSpec.model_validate({"global_batch": 4, "seq_len": 64, "tasks": [{"weight": 1, "tokens": {"llm": 64}}]})
FSDP, KEEP, RESHARD = DataParallel.FSDP, Sharding.KEEP, Sharding.RESHARD
PLANS = {  # name -> (dp, mode, sharding, global batch)
    "keep dp1": (1, FSDP, KEEP, 4),
    "keep dp2": (2, FSDP, KEEP, 4),
    "keep dp4": (4, FSDP, KEEP, 4),
    "reshard dp1": (1, FSDP, RESHARD, 4),
    "reshard dp2": (2, FSDP, RESHARD, 4),
    "reshard dp4": (4, FSDP, RESHARD, 4),
    "replicate dp4": (4, DataParallel.REPLICATE, KEEP, 4),
    "reshard dp4 3 samples": (4, FSDP, RESHARD, 3),  # rank 3 runs one empty micro-batch: gathers, no compute
}
QWEN25_VL_7B = ModelSpec.model_validate(
    {
        "name": "qwen2.5-vl-7b-shaped",
        "modules": {
            "vision": {"kind": "encoder", "modality": "vision", "layers": 32, "hidden": 1280, "heads": 16,
                       "ffn": 3420, "mlp": "swiglu", "input_dim": 1176, "downsample": 4, "projector_hidden": 5120,
                       "feeds": "llm"},
            "llm": {"kind": "llm", "layers": 28, "hidden": 3584, "heads": 28, "kv_heads": 4, "ffn": 18944,
                    "vocab": 152064},
        },
    }
)  # fmt: skip


def predicted_gb(dp: int, mode: DataParallel, sharding: Sharding) -> float:
    cost = module_cost(
        MODEL,
        DATA,
        load_cluster("local-cpu"),
        "llm",
        Layout(dp=dp),
        DATA.global_batch // dp,
        Recompute.NONE,
        in_flight=1,
        cfg=CostConfig(data_parallel=mode),
        sharding=sharding,
    )
    return cost.memory_gb


def _data(global_batch: int) -> DataSpec:
    return DATA.model_copy(update={"global_batch": global_batch})


def run_plans(steps: int) -> dict[str, list]:
    cfg = TrainConfig(
        steps=steps, seed=0, dtype="bfloat16", balance=Mode.NONE, optimizer="adamw", lr=1e-4, device="cpu"
    )
    plans = {
        name: hand_plan(
            MODEL, _data(gb), {"llm": (Layout(dp=dp), list(range(dp)))}, micro_batches=1, data_parallel=mode,
            sharding=sharding,
        )
        for name, (dp, mode, sharding, gb) in PLANS.items()
    }  # fmt: skip
    records_of: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in sorted({p.world_size for p in plans.values()}):  # one launch per world size
            names = [n for n, p in plans.items() if p.world_size == world]
            tasks = [
                TrainTask(plans[n], _data(PLANS[n][3]), cfg, str(Path(tmp) / n.replace(" ", "_")), timeout_s=600.0)
                for n in names
            ]
            records_of |= dict(zip(names, LocalLauncher().submit(TaskSequence(tasks)).result(), strict=True))
    return records_of


def memory_table(records_of: dict[str, list], steps: int) -> dict[str, dict[str, float]]:
    params = module_params(MODEL.modules["llm"])
    print(f"{MODEL.name}: {params / 1e6:.1f}M parameters, bf16 compute, fp32 masters, AdamW, {steps} steps")
    print(
        f"{'plan':22s} {'state MB':>9s} {'x dp1':>6s} {'peak MB':>8s} {'pred MB':>8s} {'pred/meas':>9s} {'step s':>7s}"
    )
    out: dict[str, dict[str, float]] = {}
    for name, (dp, mode, sharding, _) in PLANS.items():
        records = records_of[name]
        last = records[-1].memory
        state = statistics.median(r["state_bytes"] for r in last.values()) / 1e6
        peak = max(r["peak_bytes"] for r in last.values()) / 1e6
        pred = predicted_gb(dp, mode, sharding) * GB / 1e6
        step = statistics.median(r.step_time_s for r in records[1:]) if len(records) > 1 else records[0].step_time_s
        base_name = f"{sharding.value} dp1" if mode == FSDP else "keep dp1"
        base = out[base_name]["state_mb"] if base_name in out else state
        out[name] = {"dp": dp, "state_mb": state, "state_ratio_to_dp1": state / base, "peak_mb": peak,
                     "predicted_mb": pred, "predicted_over_measured": pred / peak, "step_s": step}  # fmt: skip
        print(f"{name:22s} {state:9.1f} {state / base:6.3f} {peak:8.1f} {pred:8.1f} {pred / peak:9.3f} {step:7.3f}")
    return out


def empty_call_cost(records: list) -> dict[str, float]:
    """The LLM's forward+backward seconds of the rank that held no sample against the others' (median over the
    steps after the first): what an empty micro-batch's gathers and reduce-scatters cost."""
    later = records[1:] or records
    per_rank = {
        r: statistics.median(rec.ranks[r].get("llm.fwd_bwd", 0.0) for rec in later) for r in sorted(later[0].ranks)
    }
    empty = per_rank.pop("3")
    return {"empty_rank_s": empty, "busy_ranks_s": statistics.median(per_rank.values())}


def planner_choice() -> dict[str, dict[str, object]]:
    from orch.planner.candidates import SearchInput
    from orch.planner.planner import make_plan
    from orch.planner.search import SolverConfig

    data = load_data("llava-mix").model_copy(update={"global_batch": 64})
    cluster = load_cluster("h100-80g", 1)
    params = sum(module_params(m) for m in QWEN25_VL_7B.modules.values())
    print(f"\n{QWEN25_VL_7B.name} ({params / 1e9:.1f}B parameters) on one node of 8 x 80 GB, llava-mix, batch 64:")
    print(
        f"{'planner':18s} {'placement':13s} {'module':7s} {'layout':10s} {'DP':8s} {'micro':6s} {'rc':5s} {'GB/GPU':>7s} {'step s':>7s}"
    )
    out: dict[str, dict[str, object]] = {}
    for label, sharding in (("before (keep)", KEEP), ("after (auto)", None)):
        plan: Plan = make_plan(
            SearchInput(QWEN25_VL_7B, cluster, data, cfg=CostConfig(sharding=sharding)), SolverConfig(time_limit_s=10)
        )
        step = plan.predicted.step_time_s
        for name, mp in plan.modules.items():
            dp = "repl" if mp.data_parallel != FSDP else ("fsdp/rs" if mp.sharding == RESHARD else "fsdp")
            micro = f"{mp.micro_batch}x{mp.num_micro_batches}"
            print(f"{label:18s} {plan.placement.value:13s} {name:7s} {mp.layout.short():10s} {dp:8s} {micro:6s} "
                  f"{mp.recompute.value:5s} {mp.memory_gb:7.1f} {step:7.3f}")  # fmt: skip
        out[label] = {
            "placement": plan.placement.value,
            "step_time_s": step,
            "modules": {n: {"layout": mp.layout.short(), "data_parallel": mp.data_parallel.value,
                            "sharding": mp.sharding.value, "memory_gb": mp.memory_gb} for n, mp in plan.modules.items()},
        }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    records_of = run_plans(args.steps)
    out: dict[str, object] = {"plans": memory_table(records_of, args.steps)}
    table = out["plans"]
    assert isinstance(table, dict)
    ratio = table["reshard dp4"]["peak_mb"] / table["reshard dp1"]["peak_mb"]
    keep_ratio = table["keep dp4"]["peak_mb"] / table["keep dp1"]["peak_mb"]
    print(f"peak at dp4 / dp1: reshard {ratio:.3f}, keep {keep_ratio:.3f}")
    steps = {k: table[f"{k} dp4"]["step_s"] for k in ("keep", "reshard", "replicate")}
    print(
        f"step time at dp4 (one launch): keep {steps['keep']:.3f} s, reshard {steps['reshard']:.3f} s "
        f"({steps['reshard'] / steps['keep']:.2f}x keep), replicate {steps['replicate']:.3f} s"
    )
    empty = empty_call_cost(records_of["reshard dp4 3 samples"])
    print(
        f"empty micro-batch (reshard dp4, 3 samples): the empty rank's llm fwd+bwd {empty['empty_rank_s'] * 1e3:.1f} ms, "
        f"a busy rank's {empty['busy_ranks_s'] * 1e3:.1f} ms"
    )
    out |= {"reshard_peak_dp4_over_dp1": ratio, "keep_peak_dp4_over_dp1": keep_ratio, "step_s_dp4": steps,
            "empty_micro_batch": empty, "planner_qwen2_5_vl_7b": planner_choice()}  # fmt: skip
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    tmp = folder / "fsdp.json.tmp"
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(folder / "fsdp.json")


if __name__ == "__main__":
    main()
