"""Predicted against measured peak memory on shapes unlike bench_fsdp.py's (a 10-block, 512-wide LLM on 64-token
samples, where the training state is nearly all of the peak): a wide and shallow LLM on long samples, a narrow,
deep one with a large vocabulary, and a vision tower beside a small LLM on images and long videos with four
micro-batches a rank; each at DP 4 under fsdp keep and reshard, bf16 compute on fp32 masters with AdamW,
post-balanced (orch, the default), in one launch of 4 gloo processes on the CPU.

The measured peak is the runtime's (runtime/memory.py: on the CPU the shards, the gathered parameters and
gradients and the activations autograd held at most), the largest of any rank in any step; the prediction
is planner/costs.py's for the modules (`module_cost(...).memory_gb`, summed, without the device's reserve) at the
plan's micro-batch, split into its state and activation terms so that a wrong term shows. The CPU peak leaves out
transient buffers, and under reshard a unit's gradient buffers in its backward (fsdp.InFlight samples between
them) while it counts the gathered weights autograd saved, which FSDP2 frees after the forward: reshard's state
column is a lower bound and its activation column an upper one.

    python bench/bench_memory_shapes.py [--steps N]          (writes bench/out/memory_shapes.json)
    python bench/bench_memory_shapes.py --table bench/out/memory_shapes.json    (today's predictions, same peaks)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from orch.planner.balance.mode import Mode
from orch.planner.costs import GB, CostConfig, module_cost, module_params
from orch.planner.loading import load_cluster
from orch.planner.plan import DataParallel, Layout, Recompute, Sharding
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.launch.base import TaskSequence
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.trainer import TrainTask

DP = 4


def _llm(name: str, **shape: int) -> ModelSpec:
    return ModelSpec.model_validate({"name": name, "modules": {"llm": {"kind": "llm", **shape}}})


SHAPES: dict[str, tuple[ModelSpec, DataSpec]] = {
    # two wide blocks on long samples (1,024 tokens), a small vocabulary
    "wide-shallow long": (
        _llm("wide-shallow", layers=2, hidden=768, heads=12, ffn=3072, vocab=4096),
        DataSpec.model_validate({"global_batch": 4, "seq_len": 1024, "tasks": [{"weight": 1, "tokens": {"llm": 1024}}]}),
    ),
    # many narrow blocks (LLaMA's 8/3 FFN, grouped KV heads) and a 50k vocabulary: the logits outweigh a block
    "narrow-deep vocab": (
        _llm("narrow-deep", layers=16, hidden=256, heads=8, kv_heads=2, ffn=688, vocab=50000),
        DataSpec.model_validate({"global_batch": 4, "seq_len": 256, "tasks": [{"weight": 1, "tokens": {"llm": 256}}]}),
    ),
    # a vision tower beside a small LLM on a mix of images and long videos, four micro-batches a rank: the tower
    # holds every micro-batch's activations until the LLM's backward (three-phase schedule)
    "tower long video": (
        ModelSpec.model_validate({"name": "tower-video", "modules": {
            "vision": {"kind": "encoder", "modality": "vision", "layers": 4, "hidden": 384, "heads": 6, "ffn": 1536,
                       "input_dim": 588, "downsample": 4, "feeds": "llm"},
            "llm": {"kind": "llm", "layers": 4, "hidden": 384, "heads": 6, "ffn": 1024, "vocab": 4096}}}),
        DataSpec.model_validate({"global_batch": 16, "seq_len": 1024, "tasks": [
            {"weight": 3, "tokens": {"vision": 256, "llm": 128}},
            {"weight": 1, "tokens": {"vision": 2048, "llm": 576}}]}),
    ),
}  # fmt: skip
SHARDINGS = (Sharding.KEEP, Sharding.RESHARD)
# steps a shape runs where one batch is not its peak: the planner predicts a run's (a rank's share of the most
# tokens a step's samples hold, planner/data.py most_held); of seed 0's first 8 steps, one draws 9 videos of 16
STEPS = {"tower long video": 8}
MICRO_BATCHES = 4  # per rank, where a rank holds as many samples (else one)


def micro_batches(data: DataSpec) -> int:
    return min(MICRO_BATCHES, -(-data.global_batch // DP))


def predicted(model: ModelSpec, data: DataSpec, sharding: Sharding) -> tuple[float, float]:
    """(state GB, activations GB) the planner predicts for the modules together at DP 4: the LLM holds one
    micro-batch at a time, an encoder every micro-batch of the step."""
    per_rank = -(-data.global_batch // DP)
    num_mb = micro_batches(data)
    state = act = 0.0
    for name in model.modules:
        cost = module_cost(
            model,
            data,
            load_cluster("local-cpu"),
            name,
            Layout(dp=DP),
            per_rank // num_mb,
            Recompute.NONE,
            in_flight=1 if name == model.llm_name else num_mb,
            cfg=CostConfig(data_parallel=DataParallel.FSDP),
            sharding=sharding,
        )
        state, act = state + cost.params_gb, act + cost.activations_gb
    return state, act


def run(steps: int) -> dict[str, list]:
    names, tasks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, (model, data) in SHAPES.items():
            cfg = TrainConfig(
                steps=max(steps, STEPS.get(shape, 0)),
                seed=0,
                dtype="bfloat16",
                balance=Mode.ORCH,  # the default post-balancing, which the planner's peak assumes
                calibrate=False,
                optimizer="adamw",
                lr=1e-4,
                device="cpu",
            )
            for sh in SHARDINGS:
                plan = hand_plan(
                    model,
                    data,
                    {"llm": (Layout(dp=DP), list(range(DP)))},
                    micro_batches=micro_batches(data),
                    data_parallel=DataParallel.FSDP,
                    sharding=sh,
                )
                name = f"{shape} {sh.value}"
                names.append(name)
                folder = str(Path(tmp) / name.replace(" ", "_"))
                tasks.append(TrainTask(plan, data, cfg, folder, timeout_s=1200.0))
        results = LocalLauncher().submit(TaskSequence(tasks)).result()
    return dict(zip(names, results, strict=True))


def measured(records_of: dict[str, list]) -> dict[str, dict[str, float]]:
    """Per plan, the largest peak of any rank in any step (the step whose batch gave a rank the most tokens) and
    that rank's activation share, MB."""
    out = {}
    for name, records in records_of.items():
        rank = max((r for rec in records for r in rec.memory.values()), key=lambda r: r["peak_bytes"])
        out[name] = {"peak_mb": rank["peak_bytes"] / 1e6, "measured_activations_mb": rank["activation_bytes"] / 1e6}
    return out


def table(measured_of: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    print(
        f"{'plan':26s} {'params M':>8s} {'peak MB':>8s} {'pred MB':>8s} {'pred/meas':>9s} "
        f"{'state MB':>8s} {'pred':>7s} {'act MB':>7s} {'pred':>7s}"
    )
    out: dict[str, dict[str, float]] = {}
    for shape, (model, data) in SHAPES.items():
        for sh in SHARDINGS:
            name = f"{shape} {sh.value}"
            peak, act = measured_of[name]["peak_mb"], measured_of[name]["measured_activations_mb"]
            state_gb, act_gb = predicted(model, data, sh)
            pred = (state_gb + act_gb) * GB / 1e6
            row = {
                "params_m": sum(module_params(m) for m in model.modules.values()) / 1e6,
                "peak_mb": peak,
                "measured_activations_mb": act,
                "measured_state_mb": peak - act,  # the shards, optimizer state and gathered parameters and gradients
                "predicted_mb": pred,
                "predicted_over_measured": pred / peak,
                "predicted_state_mb": state_gb * GB / 1e6,
                "predicted_activations_mb": act_gb * GB / 1e6,
            }
            out[name] = row
            print(
                f"{name:26s} {row['params_m']:8.1f} {peak:8.1f} {pred:8.1f} {pred / peak:9.3f} "
                f"{peak - act:8.1f} {row['predicted_state_mb']:7.1f} {act:7.1f} {row['predicted_activations_mb']:7.1f}"
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--table", help="a JSON this bench wrote: print its measured peaks against today's predictions, and exit"
    )
    args = parser.parse_args()
    if args.table:
        table(json.loads(Path(args.table).read_text()))
        return
    out = table(measured(run(args.steps)))
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    tmp = folder / "memory_shapes.json.tmp"
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(folder / "memory_shapes.json")


if __name__ == "__main__":
    main()
