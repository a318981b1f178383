"""Qwen2.5-VL on one GPU: step time and MFU per plan (issue 29's family; run it when a GPU is lent).

    scripts/gpu-smoke.sh && .venv/bin/python scripts/gpu_qwen_vl.py            # about 4-6 minutes on one H200
    .venv/bin/python scripts/gpu_qwen_vl.py --device cpu --size tiny --steps 3  # the script itself, on CPU

A Qwen2.5-VL-shaped model written from transformers' config classes (random init; bench/bench_qwen_vl.py's
`make_model`): `--size 2b` (default) a Qwen2-1.5B-shaped LLM (hidden 1536, 28 layers, 12 heads, 2 KV heads,
ffn 8960, vocab 151,936) under Qwen2.5-VL's own 32-block tower (hidden 1280, ffn 3420, 16 heads, windows of
112 px, full attention in blocks 7, 15, 23, 31): about 2.2B parameters; `--size tiny` for a CPU check. Data:
bench_qwen_vl.py's dynamic-resolution mix at a real set's patch counts (`--size 2b`: its mix x4, ~64 to ~4,096
patches, video-like items of ~2,800-6,100; global batch 32, seq_len 2,560).

Plans: orch's planner for one GPU of the h200-141g preset (no profile: datasheet costs), and the same plan with
full recompute on every module. Each runs `--steps` steps through the local launcher in bfloat16 (AdamW). Per
plan it prints the predicted and measured step time (median over the steps after the first two), label tokens
per second, MFU predicted and measured (the plan's model FLOPs, no recompute, over the measured step time and the
GPU's bf16 peak: predicted MFU x predicted step / measured step) and the peak memory the rank measured. Writes
bench/out/gpu_qwen_vl.json. Exit 2 without CUDA (unless --device cpu).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

SIZES = {
    "2b": {
        "text": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                     num_key_value_heads=2, vocab_size=151936, mrope_section=[16, 24, 24]),
        "vision": dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, window_size=112,
                       fullatt_block_indexes=[7, 15, 23, 31], patch_size=14),
    },
    "tiny": {
        "text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=32000, mrope_section=[4, 6, 6]),
        "vision": dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4, window_size=112,
                       fullatt_block_indexes=[1, 3], patch_size=14),
    },
}  # fmt: skip


def gpu_mix(scale: int) -> object:
    """bench_qwen_vl's mix with every patch count and length `scale` times its (scaled-down) one."""
    from bench_qwen_vl import data_spec

    base = data_spec(small=False)
    if scale == 1:
        return base
    tasks = [
        t.model_copy(
            update={
                "tokens": {k: v * scale for k, v in t.tokens.items()},
                "max": {k: v * scale for k, v in t.max.items()},
            }
        )
        for t in base.tasks
    ]
    return base.model_copy(update={"tasks": tasks, "global_batch": 2 * base.global_batch, "seq_len": 4 * base.seq_len})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=tuple(SIZES), default="2b")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a machine with a GPU (or --device cpu to check the script)")
        return 2
    from bench_qwen_vl import make_model

    from orch.planner.candidates import SearchInput
    from orch.planner.loading import load_cluster
    from orch.planner.plan import Recompute
    from orch.planner.planner import make_plan
    from orch.planner.search import SolverConfig
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.models.registry import model_spec_from_dir
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.trainer import TrainTask

    tiny = args.size == "tiny"
    data = gpu_mix(1 if tiny else 4)
    if tiny:
        data = data.model_copy(update={"global_batch": 8})
    cluster = load_cluster("h200-141g", 1).model_copy(update={"gpus_per_node": 1})
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-gpu-qwen-vl-") as tmp:
        directory = make_model(Path(tmp) / "model", SIZES[args.size])
        model = model_spec_from_dir(str(directory))
        best = make_plan(SearchInput(model, cluster, data), SolverConfig(alternatives=0))
        full = best.model_copy(
            update={"modules": {n: m.model_copy(update={"recompute": Recompute.FULL}) for n, m in best.modules.items()}}
        )
        # the model's training FLOPs per step (no recompute) are the same under every plan: the best one's,
        # in peak-seconds (FLOPs over the GPU's bf16 peak)
        peak_seconds = best.predicted.mfu * best.predicted.step_time_s
        for label, plan in (("planner", best), ("full recompute", full)):
            cfg = TrainConfig(steps=args.steps, dtype="bfloat16", device=args.device, lr=1e-5, seed=0)
            task = TrainTask(plan, data, cfg, str(Path(tmp) / label.replace(" ", "-")))
            records = LocalLauncher(1).submit(task).result()
            kept = records[2:] if len(records) > 2 else records[-1:]
            measured = statistics.median(r.step_time_s for r in kept)
            priced = plan is best  # the variant is not priced on its own: no prediction printed for it
            layouts = "; ".join(
                f"{n} {m.layout.short()} {m.recompute.value} {m.micro_batch}x{m.num_micro_batches}"
                for n, m in plan.modules.items()
            )
            rows.append({
                "plan": label, "layouts": layouts, "measured_step_s": measured,
                "tokens_per_s": statistics.median(r.tokens / r.step_time_s for r in kept),
                "predicted_step_s": plan.predicted.step_time_s if priced else None,
                "mfu_predicted": plan.predicted.mfu if priced else None,
                "mfu_measured": peak_seconds / measured,
                "peak_gb": max((m.get("peak_bytes", 0) for r in kept for m in r.memory.values()), default=0) / 1e9,
            })  # fmt: skip
    print(f"Qwen2.5-VL {args.size} on one {args.device} ({model.modules['llm'].hidden} LLM hidden), bfloat16, "
          f"{args.steps} steps, global batch {data.global_batch}, seq_len {data.seq_len}")  # fmt: skip
    head = f"{'plan':<16} {'pred s':>8} {'meas s':>8} {'tok/s':>9} {'MFU pred':>9} {'MFU meas':>9} {'peak GB':>8}"
    print(head + "  layouts")
    for r in rows:
        pred = "-" if r["predicted_step_s"] is None else f"{r['predicted_step_s']:.4f}"
        mfu = "-" if r["mfu_predicted"] is None else f"{r['mfu_predicted']:.1%}"
        print(f"{r['plan']:<16} {pred:>8} {r['measured_step_s']:>8.4f} {r['tokens_per_s']:>9.0f} {mfu:>9} "
              f"{r['mfu_measured']:>9.1%} {r['peak_gb']:>8.1f}  {r['layouts']}")  # fmt: skip
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    record = {"size": args.size, "device": args.device, "steps": args.steps, "rows": rows}
    (out / "gpu_qwen_vl.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
