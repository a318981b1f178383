"""Two towers balanced (issue 39): a Qwen2.5-Omni-shaped thinker from config (random init) trained on an omni SFT
file of generated media, 4 CPU processes (gloo, one torch thread each), in one process group step by step on the
same global batches: orch's homogeneous plan under `--balance none` and `--balance orch`, and orch's best plan
(`orch plan` on the local-cpu cluster spec: 2 nodes x 2) under `--balance orch` where it is not the homogeneous
one.

Model (`AUDIO`, `VISION`, `TEXT`): Qwen2.5-Omni's thinker at tiny widths (this 2-core machine is shared): the audio
tower 2 layers of width 64 attending within chunks of Qwen2.5-Omni's own `n_window` (100 tokens: 2 s), 16 mel bins
(the tests' feature extractor; the real model has 128); the vision tower Qwen2.5-VL's, width 64, 4 blocks (2 of
full attention per frame, the rest in 112 px windows); a Qwen2 decoder of width 128, 2 layers, vocab 32,000, TMRoPE.
The talker and token2wav are tiny and not trained (tests/qwen_omni_models.py builds the directory).

Data (`write_omni_set`): a JSONL file as LLaMA-Factory users have one, of media written here (small): text-only
turns; images of 56 to 280 px a side (16 to 256 patches: the tests' image processor caps them at 64 merged tokens);
ASR clips of 2 to 30 s (log-uniform; 50 to 750 LLM tokens) with a transcript of ~2.5 words a second; videos with
their sound (`use_audio_in_video: true` per record, the track decoded from the video) of 2 to 8 s at 2 fps, 112
px. Noise for pixels and samples: only lengths matter to the step. The training path is the user's: orch's index
of the file (`orch plan --data`), the media decoded and featurised by the ranks' prefetchers.

Per run: the median step time, each tower's and the LLM's max/mean over the ranks that hold it (measured forward +
backward seconds; a rank without audio or video runs the tower's placeholder), the dispatcher's predicted
max/mean; against the unbalanced run's ceilings measured in the same steps (bench_balance_runtime.py: every phase at
its mean rank, and with whole samples: no rank holds half a clip). The losses of the homogeneous plan's two modes
must agree (1e-9 relative in float64, 1e-4 in float32; asserted). Ratios, not absolute times, are the result on
this noisy machine (docs/design.md, Measuring).

    .venv/bin/python bench/bench_omni.py [--steps 8] [--dtype float32|float64]     (writes bench/out/omni.json)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from bench_balance_runtime import WARMUP, _interleaved, balanced_floor, bench_config, speedups, summarise  # noqa: E402
from bench_qwen_vl import phase_ratio, predicted_ratio  # noqa: E402
from orch_cli import run_orch  # noqa: E402

from orch.planner.plan import Plan  # noqa: E402

WORLD = 4
GLOBAL_BATCH = 32  # 8 samples a rank
AUDIO = {"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128,
         "max_source_positions": 1500, "n_window": 100}  # fmt: skip
VISION = {"depth": 4, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "window_size": 112,
          "fullatt_block_indexes": [1, 3], "patch_size": 14}  # fmt: skip
TEXT = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 32000,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}}  # fmt: skip
MIX = {"text": 15, "image": 27, "asr": 30, "video": 24}  # records of each kind in the file
WORDS = ("the", "a", "what", "is", "in", "picture", "sound", "say", "and", "of", "tone")


def write_omni_set(folder: Path, seed: int = 0) -> Path:
    """The omni SFT file and its media (module docstring); returns the JSONL file."""
    import numpy as np
    from PIL import Image
    from sounding_media import pcm, write_sounding_video, write_wav

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def words(n: float) -> str:
        return " ".join(rng.choice(WORDS, max(1, round(n))))

    def turn(user: str, answer: str, **media: Any) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}], **media}

    records = []
    for _ in range(MIX["text"]):
        records.append(turn(words(rng.uniform(5, 40)), words(rng.lognormal(math.log(60), 0.6))))
    for i in range(MIX["image"]):
        w, h = (int(rng.choice([56, 84, 112, 168, 224, 280])) for _ in range(2))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"image{i}.png")
        records.append(turn("<image>" + words(6), words(rng.uniform(5, 60)), images=[f"image{i}.png"]))
    for i in range(MIX["asr"]):
        seconds = math.exp(rng.uniform(math.log(2), math.log(30)))
        write_wav(folder / f"clip{i}.wav", pcm(seconds, channels=1, seed=i))
        records.append(turn("<audio>transcribe", words(2.5 * seconds), audios=[f"clip{i}.wav"]))
    for i in range(MIX["video"]):
        seconds = int(rng.integers(2, 9))
        write_sounding_video(folder / f"video{i}.mkv", frames=2 * seconds, fps=2, sound=pcm(seconds, seed=100 + i),
                             size=(112, 112))  # fmt: skip
        records.append(turn("<video>" + words(6), words(rng.uniform(10, 50)), videos=[f"video{i}.mkv"],
                            use_audio_in_video=True))  # fmt: skip
    order = rng.permutation(len(records))
    path = folder / "omni.jsonl"
    path.write_text("".join(json.dumps(records[i]) + "\n" for i in order))
    return path


def planned(model: Path, data: Path, out: Path, *extra: str) -> Plan:
    """`orch plan` of the model on the data file on the local-cpu cluster spec (2 nodes x 2 CPU ranks)."""
    import yaml

    run_orch("plan", "--model", str(model), "--cluster", "local-cpu", "--data", str(data), "--global-batch",
             str(GLOBAL_BATCH), "--index-dir", str(data.parent / "index"), "-o", str(out), *extra)  # fmt: skip
    return Plan.model_validate(yaml.safe_load(out.read_text()))


def layouts(plan: Plan) -> str:
    return ", ".join(f"{m} {p.layout} on {len(p.ranks)}" for m, p in plan.modules.items())


@dataclass
class PlannedRun:
    """The extra run for `_interleaved`: orch's best plan under --balance orch, in the same process group."""

    plan_json: str
    steps: int
    dtype: str
    run: Any = field(default=None, repr=False)

    def __call__(self, ctx: Any, plan: Plan, data: Any) -> dict[str, Any]:
        from orch.runtime.train.step import TrainStep

        best = Plan.model_validate_json(self.plan_json)
        self.run = TrainStep(
            best, best.data, bench_config(self.steps, self.dtype, balance="orch"), ctx.env.rank, ctx.env.world
        )
        return {"best": self.run.step}

    def finish(self) -> None:
        self.run.finish()


def main() -> None:
    from qwen_omni_models import make_qwen_omni

    from orch.runtime.launch.base import FunctionTask
    from orch.runtime.launch.local import LocalLauncher

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = parser.parse_args()
    t_start = time.perf_counter()
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    with tempfile.TemporaryDirectory() as tmp:
        directory = make_qwen_omni(Path(tmp) / "qwen2_5_omni-bench", audio=AUDIO, vision=VISION, **TEXT)
        data = write_omni_set(Path(tmp) / "data")
        best = planned(directory, data, Path(tmp) / "best.yaml")
        homogeneous = planned(directory, data, Path(tmp) / "homogeneous.yaml", "--placement", "homogeneous")
        same = best.modules == homogeneous.modules
        path = Path(tmp) / "records.json"
        extra = None if same else PlannedRun(best.model_dump_json(), args.steps, args.dtype)
        body = partial(_interleaved, homogeneous.model_dump_json(), homogeneous.data.model_dump_json(), args.steps,
                       args.dtype, str(path), extra=extra)  # fmt: skip
        LocalLauncher().submit(FunctionTask(body, WORLD, tmp, timeout_s=1800)).wait()
        runs: dict[str, list[dict]] = json.loads(path.read_text())
        manifest = [json.loads(line)["lengths"] for line in Path(best.data.manifest or "").read_text().splitlines()]
    wall = time.perf_counter() - t_start
    report(args, best, homogeneous, runs, manifest, wall)


def report(args: Any, best: Plan, homogeneous: Plan, runs: dict[str, list[dict]], manifest: list[dict], wall: float):
    model = homogeneous.model
    plans = {"none": homogeneous, "orch": homogeneous, "best": best}
    steps = {mode: [r["step_time_s"] for r in records[WARMUP:]] for mode, records in runs.items()}

    def rel(a: list[dict], b: list[dict]) -> float:
        return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b, strict=True))

    worst = {mode: rel(rs, runs["none"]) for mode, rs in runs.items() if mode != "none"}
    towers = ["audio", "vision", "llm"]
    rows = {}
    for mode, rs in runs.items():
        plan = plans[mode]
        rows[mode] = {
            "step_s": statistics.median(steps[mode]),
            "speedup_vs_none": speedups(steps["none"], steps[mode]),
            "max_over_mean": {t: phase_ratio(rs, t, plan.modules[t].ranks) for t in towers},
            "predicted_max_over_mean": {t: predicted_ratio(rs, t, "after") for t in towers},
            "summary": summarise(rs, model),
        }
    ceilings = {
        "every phase at its mean rank": speedups(steps["none"], balanced_floor(runs["none"], model)),
        "whole samples (none split)": speedups(steps["none"], balanced_floor(runs["none"], model, whole_samples=True)),
    }
    seconds = {"audio": [n["audio"] / 50 for n in manifest if n["audio"]]}
    kinds = {
        "text": sum(1 for n in manifest if not n["audio"] and not n["vision"]),
        "image": sum(1 for n in manifest if n["vision"] and not n["audio"]),
        "asr": sum(1 for n in manifest if n["audio"] and not n["vision"]),
        "video+sound": sum(1 for n in manifest if n["audio"] and n["vision"]),
    }
    from orch.planner.costs import module_params

    params = {name: module_params(m) for name, m in model.modules.items()}
    print(
        f"bench_omni: Qwen2.5-Omni-shaped thinker (audio {AUDIO['encoder_layers']}x{AUDIO['d_model']}, n_window "
        f"{AUDIO['n_window']}; vision {VISION['depth']}x{VISION['hidden_size']}; LLM {TEXT['num_hidden_layers']}x"
        f"{TEXT['hidden_size']}, vocab {TEXT['vocab_size']}), {len(manifest)} samples "
        f"({', '.join(f'{k} {v}' for k, v in kinds.items())}; sound of {min(seconds['audio']):.1f}-"
        f"{max(seconds['audio']):.1f} s), global batch {GLOBAL_BATCH}, {WORLD} gloo processes, {args.dtype}, "
        f"{args.steps} steps ({WARMUP} warm-up left out); {wall:.0f} s in all; parameters (planner's count): "
        + ", ".join(f"{name} {n / 1e6:.2f}M" for name, n in params.items())
    )
    spread = {t: [n[t] for n in manifest if n[t]] for t in towers}
    print(
        "tokens per sample that has them: "
        + "; ".join(f"{t} {min(v)}-{max(v)} (median {statistics.median(v):.0f})" for t, v in spread.items())
    )
    print(f"homogeneous plan (orch plan --placement homogeneous): {layouts(homogeneous)}; predicted "
          f"{homogeneous.predicted.step_time_s:.3f} s")  # fmt: skip
    print(f"best plan (orch plan): {best.placement}: {layouts(best)}; predicted {best.predicted.step_time_s:.3f} s"
          + (" (the homogeneous plan: not run twice)" if "best" not in runs else ""))  # fmt: skip
    label = {
        "none": "homogeneous, --balance none",
        "orch": "homogeneous, --balance orch",
        "best": "best plan, --balance orch",
    }
    print(
        f"{'run':<30} {'step s (med)':>12} {'speed-up':>9} {'audio max/mean':>15} {'vision max/mean':>16} "
        f"{'llm max/mean':>13} {'pred. audio':>12} {'pred. vision':>13}"
    )
    for mode, row in rows.items():
        mm, pm = row["max_over_mean"], row["predicted_max_over_mean"]
        print(
            f"{label[mode]:<30} {row['step_s']:>12.3f} {row['speedup_vs_none']['ratio_of_medians']:>8.2f}x "
            f"{mm['audio']:>15.2f} {mm['vision']:>16.2f} {mm['llm']:>13.2f} {pm['audio']:>12.2f} {pm['vision']:>13.2f}"
        )
    for name, sp in ceilings.items():
        print(f"{'ceiling: ' + name:<43} {sp['ratio_of_medians']:>8.2f}x  (speed-up over --balance none, same steps)")
    print("speed-ups: ratio of median step times (median of per-step ratios, ratio of totals in the JSON)")
    print("; ".join(f"worst loss difference {m} vs none: {w:.1e} relative" for m, w in worst.items()))

    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "omni.json").write_text(
        json.dumps(
            {
                "steps": args.steps,
                "dtype": args.dtype,
                "model": model.model_dump(mode="json"),
                "plans": {"best": best.model_dump(mode="json"), "homogeneous": homogeneous.model_dump(mode="json")},
                "samples": kinds,
                "rows": rows,
                "ceilings": ceilings,
                "loss_rel_diff": worst,
                "losses": {m: [r["loss"] for r in rs] for m, rs in runs.items()},
                "records": runs,
            },
            indent=2,
        )
    )
    tol = 1e-9 if args.dtype == "float64" else 1e-4
    assert worst["orch"] <= tol, f"losses of orch and none differ: {worst['orch']:.2e}"


if __name__ == "__main__":
    main()
