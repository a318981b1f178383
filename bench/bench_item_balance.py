"""Encoder phases balanced by item in the running system: `--balance none`, orch by whole sample and orch by item
(`encoder_balance: sample | item`) on a long-video mix, measured here.

4 gloo processes (one torch thread each), homogeneous DP4, a tiny Qwen2.5-VL (tests/qwen_vl_models.py: 4 vision
blocks, 2 of them full attention, the rest in windows; its video processor set to sample up to 768 frames) on a
data file: 16 samples, 2 of them videos (12.5%) of 64 and 768 frames at 2 fps (each frame resized to the tiny
processor's minimum, 4 x 4 patches; a temporal patch group of 2 frames), the rest images of
56 to 168 px a side and text turns; every step the whole file (global batch 16: 4 samples per rank), so one
long video is several times a rank's mean vision work. The three runs share one process group, step k of
each back to back (bench_balance_runtime._interleaved), float64, the dispatcher's costs calibrated at start-up.

Per run: the median step time, the measured vision phase's max/mean over ranks (each rank's vision forward +
backward seconds) and the LLM's, and the dispatcher's predicted vision max/mean; beside them the two
ceilings, from the dispatcher's own statistics on the unbalanced steps: whole samples (the mean rank, or
the costliest sample where that alone outweighs it: no whole-sample placement does better) and items (the
same with the costliest item: an image, or one run of a video's temporal patch groups). The three runs'
losses must agree (1e-9 relative, asserted). Ratios are the result, not absolute times (a shared machine).

    .venv/bin/python bench/bench_item_balance.py [--steps 8]     (writes bench/out/item_balance.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

from bench_balance_runtime import WARMUP, _interleaved

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

RUNS = {
    "none": {"balance": "none"},
    "sample": {"balance": "orch", "encoder_balance": "sample"},
    "item": {"balance": "orch", "encoder_balance": "item"},
}
WORLD = 4


def write_data(root: Path) -> Path:
    """The long-video mix (module docstring) as a LLaMA-Factory data file."""
    from qwen_vl_data import turn, write_conversations, write_image, write_video

    sizes = [(56, 56), (84, 56), (112, 84), (56, 140), (168, 112), (112, 112), (84, 84), (140, 56)]
    for i, (w, h) in enumerate(sizes):
        write_image(root / f"i{i}.png", w, h, seed=i)
    write_video(root / "long.mp4", frames=768, width=28, height=28, rate=2)
    write_video(root / "short.mp4", frames=64, width=28, height=28, rate=2)
    records = [turn("what happens <video>", "it moves on", videos=["long.mp4"]),
               turn("and here <video>", "it turns", videos=["short.mp4"])]  # fmt: skip
    for i in range(9):
        records.append(turn(f"<image> what is in picture {i}", "a pattern of dots", images=[f"i{i % len(sizes)}.png"]))
    records += [turn("two <image> and <image>", "both noise", images=["i1.png", "i4.png"])]
    records += [turn(f"tell me a fact number {i}", "the sky is wide and blue today") for i in range(4)]
    return write_conversations(root / "data.jsonl", records)


def vision_ratio(records: list[dict], phase: str) -> float:
    """Median over steps of the phase's slowest rank over its mean rank (measured seconds)."""
    keys = [f"{phase}.fwd", f"{phase}.bwd"] if phase != "llm" else ["llm.fwd_bwd"]
    ratios = []
    for r in records[WARMUP:]:
        per = [sum(p.get(k, 0.0) for k in keys) for p in r["ranks"].values()]
        ratios.append(max(per) / statistics.mean(per) if statistics.mean(per) > 0 else 1.0)
    return statistics.median(ratios)


def predicted(records: list[dict], key: str) -> float:
    """Median over steps of the dispatcher's vision `key` over its mean rank."""
    return statistics.median(r["balance"]["vision"][key] / r["balance"]["vision"]["mean_cost"] for r in records)


def main() -> None:
    from qwen_vl_models import make_qwen_vl

    from orch.cli.data_cmd import conversation_data
    from orch.planner.plan import Layout
    from orch.runtime.launch.base import FunctionTask
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.models.registry import model_spec_from_dir
    from orch.runtime.plans import hand_plan

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        directory = make_qwen_vl(root / "model", "qwen2_5_vl", seed=1)
        video = json.loads((directory / "video_preprocessor_config.json").read_text())
        video["max_frames"] = 768  # the tests' tiny model samples at most 16 frames: every frame here
        (directory / "video_preprocessor_config.json").write_text(json.dumps(video))
        model = model_spec_from_dir(directory)
        data, _ = conversation_data(model, str(write_data(root / "data")), 16, None, None)
        plan = hand_plan(model, data, {"llm": (Layout(dp=WORLD), list(range(WORLD)))}, micro_batches=1)
        plan = plan.model_copy(update={"ranks_per_node": 2})
        path = root / "records.json"
        body = partial(_interleaved, plan.model_dump_json(), data.model_dump_json(), args.steps, "float64",
                       str(path), configs=RUNS)  # fmt: skip
        LocalLauncher().submit(FunctionTask(body, WORLD, tmp, timeout_s=1200)).wait()
        runs: dict[str, list[dict]] = json.loads(path.read_text())
    base = runs["none"]
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for m in RUNS for a, b in zip(runs[m], base, strict=True))
    print(f"bench_item_balance: {args.steps} steps ({WARMUP} warm-up left out), {WORLD} processes, float64")
    head = (
        f"{'run':<7} {'step s (med)':>12} {'speed-up':>9} {'vision max/mean':>16} {'llm max/mean':>13} "
        f"{'predicted vision':>17} {'pieces':>7}"
    )
    print(head)
    rows = {}
    none_step = statistics.median(r["step_time_s"] for r in base[WARMUP:])
    for name, records in runs.items():
        step = statistics.median(r["step_time_s"] for r in records[WARMUP:])
        rows[name] = {
            "median_step_s": step,
            "speedup": none_step / step,
            "vision_max_over_mean": vision_ratio(records, "vision"),
            "llm_max_over_mean": vision_ratio(records, "llm"),
            "predicted_vision_max_over_mean": predicted(records, "max_cost"),
            "pieces": statistics.median(r["balance"]["vision"]["pieces"] for r in records),
        }
        s = rows[name]
        print(
            f"{name:<7} {step:>12.3f} {s['speedup']:>8.2f}x {s['vision_max_over_mean']:>16.2f} "
            f"{s['llm_max_over_mean']:>13.2f} {s['predicted_vision_max_over_mean']:>17.2f} {s['pieces']:>7.0f}"
        )
    ceilings = {
        "whole samples": predicted(runs["sample"], "floor_cost"),
        "items": predicted(runs["item"], "floor_cost"),
        "unbalanced": predicted(base, "max_cost_before"),
    }
    print(
        "vision max/mean the dispatcher predicts: unbalanced {unbalanced:.2f}, ceiling of whole samples "
        "{whole samples:.2f}, ceiling of items {items:.2f}".format(**ceilings)
    )
    print(f"worst loss difference against none: {worst:.1e} relative")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    doc = {"steps": args.steps, "rows": rows, "ceilings": ceilings, "loss_rel_diff": worst, "records": runs}
    (out / "item_balance.json").write_text(json.dumps(doc, indent=1))
    assert worst <= 1e-9, f"losses differ: {worst:.2e}"


if __name__ == "__main__":
    main()
