"""Step time on a data file (images and clips decoded by the loader, the next step's while this one runs)
against synthetic inputs drawn from the same index (the same lengths' distribution), in one launch of
gloo processes on the CPU: the tiny preset, DP 2, post-balanced, loading at the destination.

    python bench/bench_real_data.py [--steps N] [--samples N]     (writes bench/out/real_data.json)

Also the input bytes a step moves when loading at the origin against none at the destination.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from orch.cli.data_cmd import conversation_data
from orch.planner.plan import Layout
from orch.runtime.data.demo_data import make_dataset, make_tokenizer
from orch.runtime.launch.base import TaskSequence
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.trainer import TrainTask


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3, help="launches of each run, interleaved with the others'")
    args = parser.parse_args()
    model = load_model("tiny")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data_file = make_dataset(root, images=args.samples // 2, tones=args.samples // 3)
        tok = make_tokenizer(root / "tok" / "tokenizer.json")
        real, _ = conversation_data(model, str(data_file), 16, None, str(tok))
        synthetic = real.model_copy(update={"source": None, "tokenizer": None})  # the index's lengths, drawn
        plan = hand_plan(model, real, {"llm": (Layout(dp=2), [0, 1])})
        cfg = TrainConfig(steps=args.steps, seed=0, optimizer="adamw", lr=1e-3, device="cpu")
        origin = TrainConfig(steps=args.steps, seed=0, optimizer="adamw", lr=1e-3, device="cpu", load="origin")
        procs = TrainConfig(steps=args.steps, seed=0, optimizer="adamw", lr=1e-3, device="cpu", loader_workers=2)
        runs = {
            "data file (destination)": (real, cfg),
            "data file (origin)": (real, origin),
            "synthetic": (synthetic, cfg),
            "data file (2 loader procs)": (real, procs),
        }
        # every run once per round, the rounds one after another: the shared machine's drift falls on all alike
        order = [(r, name) for r in range(args.rounds) for name in runs]
        tasks = [
            TrainTask(plan, runs[name][0], runs[name][1], str(root / f"run{r}-{i}"), timeout_s=600.0)
            for i, (r, name) in enumerate(order)
        ]
        done = LocalLauncher().submit(TaskSequence(tasks)).result()
    per_run: dict[str, list[list]] = {name: [] for name in runs}
    for (_, name), records in zip(order, done, strict=True):
        per_run[name].append(records[1:])  # each launch's first step warms up
    results = [[r for launch in per_run[name] for r in launch] for name in runs]
    print(f"tiny preset, DP2, global batch 16, {args.rounds} rounds of {args.steps} steps, medians over steps 1..")
    print(f"{'run':26s} {'step s':>8s} {'load wait s':>12s} {'input bytes':>12s} {'avoided':>10s}")
    out: dict[str, dict[str, float]] = {}
    for name, steps in zip(runs, results, strict=True):
        step = statistics.median(r.step_time_s for r in steps)
        wait = statistics.median(max(v.get("load", 0.0) for v in r.ranks.values()) for r in steps)
        moved = statistics.median(
            sum(r.balance[p]["intra_node_bytes"] + r.balance[p]["inter_node_bytes"] for p in ("vision", "audio"))
            for r in steps
        )
        avoided = statistics.median(r.balance.get("input_bytes_avoided", 0) for r in steps)
        out[name] = {"step_s": step, "load_wait_s": wait, "encoder_input_bytes": moved, "input_bytes_avoided": avoided}
        print(f"{name:26s} {step:8.4f} {wait:12.4f} {moved:12.0f} {avoided:10.0f}")
    phases = sorted({k for r in results[0] for v in r.ranks.values() for k in v})
    print(f"{'phase (rank max, median)':26s} " + " ".join(f"{n[:10]:>10s}" for n in ("destination", "synthetic")))
    for ph in phases:
        a, b = (
            statistics.median(max(v.get(ph, 0.0) for v in r.ranks.values()) for r in res)
            for res in (results[0], results[2])
        )
        print(f"{ph:26s} {a:10.4f} {b:10.4f}")
    ratio = out["data file (destination)"]["step_s"] / out["synthetic"]["step_s"]
    paired = [
        statistics.median(r.step_time_s for r in a) / statistics.median(r.step_time_s for r in b)
        for a, b in zip(per_run["data file (destination)"], per_run["synthetic"], strict=True)
    ]
    print(f"step time, data file / synthetic: {ratio:.3f} (per round: {', '.join(f'{x:.3f}' for x in paired)})")
    out["ratio"] = {"data_over_synthetic": ratio, "per_round": paired}  # type: ignore[dict-item]
    folder = Path(__file__).parent / "out"
    folder.mkdir(exist_ok=True)
    (folder / "real_data.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
