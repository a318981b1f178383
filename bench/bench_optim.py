"""A learnable task, two optimizers, one run: AdamW with warmup, cosine decay and clipping against SGD at the
old default (lr 0.1), on the tiny preset with a fixed dataset (`repeat_every`: the same few global batches
seen again and again, which a model can fit), 2 gloo processes, homogeneous DP2.

    python bench/bench_optim.py [--steps N]          (writes bench/out/optim.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from orch.planner.balance.mode import Mode
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.launch.base import TaskSequence
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.trainer import TrainTask

DATASET = 4  # global batches in the fixed dataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 128})
    plan = hand_plan(model, data, {"llm": (Layout(dp=2), [0, 1])})
    common = dict(steps=args.steps, seed=0, balance=Mode.NONE, repeat_every=DATASET, device="cpu")
    runs = {
        "sgd lr 0.1 (old default)": TrainConfig(optimizer="sgd", lr=0.1, **common),
        "adamw 3e-3, warmup 20, cosine, clip 1": TrainConfig(
            optimizer="adamw", lr=3e-3, warmup_steps=20, lr_schedule="cosine", min_lr=3e-4, clip_norm=1.0, **common
        ),
    }
    with tempfile.TemporaryDirectory() as tmp:
        tasks = [
            TrainTask(plan, data, cfg, str(Path(tmp) / str(i)), timeout_s=300.0) for i, cfg in enumerate(runs.values())
        ]
        results = LocalLauncher().submit(TaskSequence(tasks)).result()
    marks = sorted({0, args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps - 1})
    print(f"tiny preset, fixed dataset of {DATASET} global batches of {data.global_batch}, DP2, {args.steps} steps")
    print(f"{'run':40s} " + " ".join(f"{'step ' + str(m):>9s}" for m in marks) + f" {'last 20':>9s}")
    out = {}
    for name, records in zip(runs, results, strict=True):
        losses = [r.loss for r in records]
        tail = statistics.mean(losses[-20:])
        print(f"{name:40s} " + " ".join(f"{losses[m]:9.4f}" for m in marks) + f" {tail:9.4f}")
        out[name] = {"losses": losses, "last20_mean": tail}
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    (folder / "optim.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
