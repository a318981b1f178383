"""Post-balancing of a native-resolution tower (issue 29): a ~100M-parameter Qwen2.5-VL-shaped model from config
(random init) on 4 CPU processes (gloo, one torch thread each), three runs interleaved step by step in one
process group on the same global batches: orch `--balance none`, orch `--balance orch` (the same plan,
homogeneous DP4) and the same HF model under plain torch DDP.

Model (`WIDE`): the LLM a Qwen2 decoder of hidden 768, 6 layers, 12 heads, 4 KV heads, ffn 2048, vocab 32,000,
M-RoPE (87M: 38M in blocks, 49M embedding and head); the tower hidden 384, 8 blocks (2 full-attention, the rest
in windows of 112 px = 8x8 patches of 14 px), 6 heads, SwiGLU ffn 1024, merge 2x2, its merger into 768 (18M).
105M in all (printed).

Data (`data_spec`): a dynamic-resolution SFT mix as a DataSpec with tasks, lengths log-normal within each task:
text-only turns, single images in three size classes whose mixture spans ~16 to ~1,000 patches (4 to 256
merged tokens, 56 to ~450 px a side), and "video-like" samples of ~700 to ~1,500 patches; captions and
answers of tens to a couple of hundred text tokens. The patch counts are a real set's (~64 to ~4,096 patches,
videos of several thousand) scaled down 4x so that one step of 16 samples stays within seconds on this shared
2-core machine (a 4,096-patch image alone costs the tower ~9 s forward+backward on one core); the shape of the
mix (a ~64x spread of image sizes, a heavy tail of videos, text-only turns) is kept. Each task draws its
modules' lengths independently, so a sample's caption is its LLM length minus its merged tokens (at least 1).
Synthetic samples carry one item each (`runtime/data/batch.py` `grid_items`: one near-square image of the
sample's patches; a "video" is one large image, its frames' patches as one item, t = 1): the tower's windows
and full attention then span the whole video, and no temporal merge or per-frame attention is measured; a real
video's cost per patch is what an image of the same patches costs in the windowed blocks and less in the
full-attention blocks (per frame, not over all frames).

Balanced vs unbalanced (as bench_balance_runtime.py, whose functions this reuses): per mode the median step
time, the speed-up three ways, the vision and LLM phases' max/mean over ranks (measured: each rank's forward +
backward seconds) and the dispatcher's own predicted max/mean costs (StepRecord.balance: before and after its
placement, in its calibrated seconds), the gain the dispatcher predicts (sum over phases of its predicted slowest
rank, before / after) and its floor, next to the ceiling measured on the unbalanced steps. The losses of the
two modes must agree (1e-9 relative in float64, 1e-4 in float32; asserted).

The cost model the dispatcher balances by is the start-up calibration (TrainConfig.calibrate, as `orch launch`
does for a plan without `orch profile`'s costs), which times orch's reference encoder of the tower's width and
depth: attention over the whole sample in every block, where Qwen2.5-VL's windowed blocks attend over 64
patches. Its per-pair term therefore overstates what large images cost (a profiled plan, `orch plan --profile`,
carries the real tower's costs).

DDP baseline (what a user writes around the HF model): `Qwen2_5_VLForConditionalGeneration` under
DistributedDataParallel (find_unused_parameters: a rank may hold text only), each rank taking every 4th sample
of the global batch (i % 4 == rank, orch's unbalanced origin) as one right-padded micro-batch through a forward
of HF's own modules: the rank's images packed through `model.visual(pixel_values, grid_thw)` (as HF's forward
does with pixel_values), the merged tokens scattered into `inputs_embeds` before each sample's text, then the HF
model with the M-RoPE `position_ids` (HF's get_rope_index of the sample; orch's layout gives the same,
tests/unit/test_qwen_vl_model.py) and the attention mask, and the LM head only at label positions (HF's own
forward computes logits at every position, padding included: bench_hf.py measured that 1.17x slower for LLaVA,
and here it would hold 4 x 640 x 32,000 logits per rank, more than this machine's memory allows for three models
per rank; so this baseline is the faster of bench_hf.py's two); the loss summed over label tokens, divided by the global count and multiplied by the world
size (DDP averages), so its gradient is orch's; SGD lr 0.1. Its losses are checked against orch's too.

`--family qwen3_vl_moe`: the same mix on a Qwen3-VL-MoE of the same widths (`MOE`: Qwen3-VL's tower with
deepstack, a decoder of 8 experts of ffn 512, 2 a token, every block sparse) planned homogeneous DP4 with the
LLM's experts over EP 2, `--balance none` and `orch` interleaved, no DDP baseline (the rows orch vs none only);
writes bench/out/qwen3_vl_moe.json (`--small`: qwen3_vl_moe_small.json).

This machine is shared and noisy: ratios and medians are the result (docs/design.md, Measuring), not absolute times.

    .venv/bin/python bench/bench_qwen_vl.py [--steps 8] [--dtype float32|float64] [--small]
                                            [--family qwen2_5_vl|qwen3_vl_moe]
                                            (writes bench/out/qwen_vl.json; --small: bench/out/qwen_vl_small.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench_balance_runtime import WARMUP, _interleaved, balanced_floor, critical_and_ideal, speedups, summarise

from orch.planner.plan import Layout, Plan
from orch.planner.specs import DataSpec, ModelSpec, TaskSpec
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan

WORLD = 4
SPECIAL = {"image_token_id": 31999, "video_token_id": 31998, "vision_start_token_id": 31997,
           "vision_end_token_id": 31996}  # fmt: skip
WIDE = {  # ~105M: the LLM 87M (38M in blocks, 49M embedding and head), the tower 18M
    "text": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
                 num_key_value_heads=4, vocab_size=32000, mrope_section=[8, 12, 12]),
    "vision": dict(depth=8, hidden_size=384, intermediate_size=1024, num_heads=6, window_size=112,
                   fullatt_block_indexes=[3, 7], patch_size=14),
}  # fmt: skip
SMALL = {
    "text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=32000, mrope_section=[4, 6, 6]),
    "vision": dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4, window_size=112,
                   fullatt_block_indexes=[1, 3], patch_size=14),
}  # fmt: skip


MOE = {  # Qwen3-VL-MoE of WIDE's widths: 8 experts of 512 (2 a token) in every block, the tower with deepstack
    "text": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
                 num_key_value_heads=4, head_dim=64, vocab_size=32000, mrope_section=[8, 12, 12], num_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=512),
    "vision": dict(depth=8, hidden_size=384, intermediate_size=1024, num_heads=6, patch_size=14,
                   deepstack_visual_indexes=[1, 3], num_position_embeddings=256),
}  # fmt: skip
MOE_SMALL = {
    "text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=32000, mrope_section=[4, 6, 6], num_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=64),
    "vision": dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=14,
                   deepstack_visual_indexes=[1], num_position_embeddings=256),
}  # fmt: skip


def make_moe_model(directory: Path, shapes: dict[str, dict[str, Any]]) -> Path:
    """A Qwen3-VL-MoE directory (config.json + safetensors, random init) from transformers' config classes."""
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    text = dict(shapes["text"])
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": text.pop("mrope_section"),
            "mrope_interleaved": True}  # fmt: skip
    vision = transformers.Qwen3VLMoeVisionConfig(
        **shapes["vision"], out_hidden_size=text["hidden_size"], spatial_merge_size=2, temporal_patch_size=2
    )
    text_config = transformers.Qwen3VLMoeTextConfig(
        **text, rope_parameters=rope, attention_dropout=0.0, bos_token_id=None, eos_token_id=None,
        tie_word_embeddings=False,
    )  # fmt: skip
    config = transformers.Qwen3VLMoeConfig(vision_config=vision.to_dict(), text_config=text_config.to_dict(), **SPECIAL)
    torch.manual_seed(0)
    transformers.Qwen3VLMoeForConditionalGeneration(config).save_pretrained(directory)
    return directory


def make_model(directory: Path, shapes: dict[str, dict[str, Any]]) -> Path:
    """A Qwen2.5-VL directory (config.json + safetensors, random init) from transformers' config classes."""
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    text = dict(shapes["text"])
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": text.pop("mrope_section")}
    vision = transformers.Qwen2_5_VLVisionConfig(
        **shapes["vision"], out_hidden_size=text["hidden_size"], spatial_merge_size=2, temporal_patch_size=2,
        tokens_per_second=2,
    )  # fmt: skip
    text_config = transformers.Qwen2_5_VLTextConfig(
        **text, rope_parameters=rope, attention_dropout=0.0, bos_token_id=None, eos_token_id=None
    )
    config = transformers.Qwen2_5_VLConfig(vision_config=vision.to_dict(), text_config=text_config.to_dict(), **SPECIAL)
    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(directory)
    return directory


def data_spec(small: bool = False) -> DataSpec:
    """The dynamic-resolution mix (module docstring). Vision counts are patches (4 per merged LLM token); an LLM
    count is the sample's whole sequence: merged tokens + text."""

    def image(name: str, weight: float, patches: int, cap: int, text: int, spread: float = 0.5) -> TaskSpec:
        llm = patches // 4 + text
        return TaskSpec(
            name=name,
            weight=weight,
            tokens={"vision": patches, "llm": llm},
            max={"vision": cap, "llm": cap // 4 + 3 * text},
            spread=spread,
        )

    if small:
        return DataSpec(
            name="qwen-vl-mix-small",
            global_batch=8,
            seq_len=256,
            tasks=[
                TaskSpec(name="text", weight=0.2, tokens={"llm": 24}, max={"llm": 64}),
                image("image", 0.6, 48, 128, 16, spread=0.8),
                image("video", 0.2, 256, 512, 16),
            ],
        )
    return DataSpec(
        name="qwen-vl-mix",
        global_batch=16,
        seq_len=640,
        tasks=[
            TaskSpec(name="text", weight=0.15, tokens={"llm": 90}, max={"llm": 320}, spread=0.6),
            image("image-small", 0.30, 40, 96, 40),  # ~16-96 patches: icons, crops, thumbnails
            image("image-medium", 0.30, 160, 384, 50),  # ~64-384: photos, charts
            image("image-large", 0.15, 520, 1024, 70),  # ~256-1024: documents, screenshots
            image("video", 0.10, 1100, 1536, 50, spread=0.3),  # ~700-1536: a clip's frames as one item
        ],
    )


def bench_plan(model: ModelSpec, data: DataSpec, world: int = WORLD) -> Plan:
    """Homogeneous DP over `world` ranks; a MoE LLM's experts over EP 2 (of its DP)."""
    llm = Layout(dp=world, ep=2 if model.llm.experts > 1 and world % 2 == 0 else 1)
    layouts = {"llm": (llm, list(range(world))), "vision": (Layout(dp=world), list(range(world)))}
    return hand_plan(model, data, layouts, micro_batches=1)


@dataclass
class DDPBaseline:
    """The extra run for `_interleaved`: the HF model under torch DDP (module docstring), its step(k)."""

    directory: str
    dtype: str

    def __call__(self, ctx: Any, plan: Plan, data: DataSpec) -> dict[str, Any]:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        import transformers
        from torch.nn.parallel import DistributedDataParallel

        from orch.runtime.data.synthetic import SyntheticBatch
        from orch.runtime.train.config import torch_dtype

        dtype = torch_dtype(self.dtype)
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(self.directory, dtype=dtype)
        hf.config.use_cache = False
        hf.train()

        class UserForward(torch.nn.Module):
            """What a user's training step calls: HF's tower, embeddings and language model on a padded batch."""

            def __init__(self) -> None:
                super().__init__()
                self.hf = hf

            def forward(self, pixels, grid, ids, is_image, positions, mask, target):
                embeds = self.hf.get_input_embeddings()(ids)
                if pixels is not None:
                    merged = self.hf.model.visual(pixels, grid_thw=grid).pooler_output
                    embeds = embeds.masked_scatter(is_image.unsqueeze(-1), merged.to(embeds.dtype))
                out = self.hf.model(inputs_embeds=embeds, position_ids=positions, attention_mask=mask, use_cache=False)
                scored = target != -100  # the head only where a label is (orch's math; HF's forward: everywhere)
                logits = self.hf.lm_head(out.last_hidden_state[scored])
                return F.cross_entropy(logits, target[scored], reduction="sum")

        model = DistributedDataParallel(UserForward(), find_unused_parameters=True, gradient_as_bucket_view=True)
        opt = torch.optim.SGD(hf.parameters(), lr=0.1, foreach=False)
        rank, world = ctx.env.rank, ctx.env.world
        spec = plan.model

        def step(k: int) -> SimpleNamespace:
            t0 = time.perf_counter()
            batch = SyntheticBatch.build(spec, data, 0, k)
            rows: list[dict[str, torch.Tensor]] = []
            pixels, grids = [], []
            for i in range(rank, batch.size, world):
                s, layout = batch.sample(i, dtype), batch.layout(i)
                n = layout.prefix
                if s.feats["vision"].shape[0]:
                    pixels.append(s.feats["vision"])
                    grids.extend(item.grid for item in s.items["vision"])
                pos = layout.positions if layout.positions is not None else torch.arange(layout.length).expand(3, -1)
                rows.append(
                    {
                        "ids": torch.cat([torch.zeros(n, dtype=torch.long), s.text]),
                        "target": torch.cat([torch.full((n,), -100), s.labels]),
                        "is_image": torch.arange(layout.length) < n,
                        "positions": pos,
                        "mask": torch.ones(layout.length, dtype=torch.long),
                    }
                )
            longest = max(r["ids"].shape[0] for r in rows)
            pad = {"ids": 0, "target": -100, "is_image": False, "positions": 0, "mask": 0}
            padded = {
                key: torch.stack([F.pad(r[key], (0, longest - r[key].shape[-1]), value=v) for r in rows], dim=-2)
                for key, v in pad.items()
            }
            loss = model(
                torch.cat(pixels) if pixels else None,
                torch.tensor(grids) if grids else None,
                padded["ids"],
                padded["is_image"],
                padded["positions"],  # [3, batch, longest]
                padded["mask"],
                padded["target"],
            )
            (loss * world / batch.label_tokens).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dist.barrier()
            seconds = time.perf_counter() - t0
            total = loss.detach().to(torch.float64)
            dist.all_reduce(total)
            real = sum(r["ids"].shape[0] for r in rows)
            return SimpleNamespace(
                loss=total.item() / batch.label_tokens,
                step_time_s=seconds,
                phases={"llm_tokens": float(real), "padded_tokens": float(longest * len(rows))},
                balance={},
            )

        return {"ddp": step}


def phase_ratio(records: list[dict], phase: str, ranks: list[int] | None = None) -> float:
    """Median over the kept steps of a phase's max/mean over ranks (each rank's measured seconds; an encoder's
    forward + backward, the LLM's forward/backward); over `ranks` alone where given (the module's, in a plan
    that places it on some ranks)."""
    keys = ("llm.fwd_bwd",) if phase == "llm" else (f"{phase}.fwd", f"{phase}.bwd")
    out = []
    for r in records[WARMUP:]:
        held = r["ranks"] if ranks is None else {k: p for k, p in r["ranks"].items() if int(k) in ranks}
        per = [sum(p.get(k, 0.0) for k in keys) for p in held.values()]
        out.append(max(per) / statistics.mean(per) if statistics.mean(per) > 0 else 1.0)
    return statistics.median(out)


def predicted_ratio(records: list[dict], phase: str, when: str) -> float:
    """Median of the dispatcher's predicted max/mean cost of a phase: `before` (where the samples start) or
    `after` (its placement; the same as before under --balance none)."""
    suffix = "_before" if when == "before" else ""
    bal = [r["balance"][phase] for r in records[WARMUP:]]
    return statistics.median(b[f"max_cost{suffix}"] / b[f"mean_cost{suffix}"] for b in bal if b["mean_cost"] > 0)


def predicted_critical(records: list[dict], phases: list[str], key: str) -> list[float]:
    """Per kept step, the sum over phases of the dispatcher's `key` cost (its calibrated seconds of forward +
    backward): max_cost_before (slowest rank unbalanced), max_cost (slowest rank placed), floor_cost."""
    return [sum(r["balance"][p][key] for p in phases) for r in records[WARMUP:]]


def main() -> None:
    from orch.runtime.launch.base import FunctionTask
    from orch.runtime.launch.local import LocalLauncher

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--small", action="store_true", help="a tiny model and batch (a quick check of the script)")
    parser.add_argument("--family", choices=("qwen2_5_vl", "qwen3_vl_moe"), default="qwen2_5_vl")
    parser.add_argument(
        "--ranks",
        type=int,
        default=WORLD,
        help="gloo processes (DP degree); more than the machine's cores share them, and then a balanced step's "
        "ranks all compute at once on fewer cores: set it to the cores to measure what balancing gains",
    )
    args = parser.parse_args()
    t_start = time.perf_counter()
    # Fewer malloc arenas in the ranks (spawned: they inherit it): three models per rank and varying shapes
    # otherwise grow the heaps past this machine's 23 GB.
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    with tempfile.TemporaryDirectory() as tmp:
        moe = args.family == "qwen3_vl_moe"
        if moe:
            directory = make_moe_model(Path(tmp) / "qwen3_vl_moe-bench", MOE_SMALL if args.small else MOE)
        else:
            directory = make_model(Path(tmp) / "qwen2_5_vl-bench", SMALL if args.small else WIDE)
        model = model_spec_from_dir(directory)
        data = data_spec(args.small)
        plan = bench_plan(model, data, args.ranks)
        params = _params(directory)
        path = Path(tmp) / "records.json"
        body = partial(
            _interleaved,
            plan.model_dump_json(),
            data.model_dump_json(),
            args.steps,
            args.dtype,
            str(path),
            extra=None if moe else DDPBaseline(str(directory), args.dtype),
        )
        LocalLauncher().submit(FunctionTask(body, plan.world_size, tmp, timeout_s=900)).wait()
        runs: dict[str, list[dict]] = json.loads(path.read_text())
    wall = time.perf_counter() - t_start
    if moe:
        _moe_report(args, model, data, plan, params, runs, wall)
        return
    ddp = runs.pop("ddp")
    modes = list(runs)  # none, orch

    def rel(a: list[dict], b: list[dict]) -> float:
        return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b, strict=True))

    worst = rel(runs["orch"], runs["none"])
    worst_ddp = rel(ddp, runs["none"])
    summary = {mode: summarise(records, model) for mode, records in runs.items()}
    steps = {mode: [r["step_time_s"] for r in records[WARMUP:]] for mode, records in runs.items()}
    ddp_steps = [r["step_time_s"] for r in ddp[WARMUP:]]
    achieved = speedups(steps["none"], steps["orch"])
    ceiling = speedups(steps["none"], balanced_floor(runs["none"], model))
    whole = speedups(steps["none"], balanced_floor(runs["none"], model, whole_samples=True))
    phases = ["vision", "llm"]
    # compute only: the sum over phases of the slowest rank (measured seconds, or the dispatcher's costs)
    crit = {m: [critical_and_ideal(r, model)[0] for r in rs[WARMUP:]] for m, rs in runs.items()}
    ideal_none = [critical_and_ideal(r, model)[1] for r in runs["none"][WARMUP:]]
    compute_rows = {
        "orch (measured)": speedups(crit["none"], crit["orch"]),
        "ceiling: every phase at its mean rank": speedups(crit["none"], ideal_none),
        "dispatcher's prediction (max before/after)": speedups(
            predicted_critical(runs["orch"], phases, "max_cost_before"),
            predicted_critical(runs["orch"], phases, "max_cost"),
        ),
        "dispatcher's floor (max before / floor)": speedups(
            predicted_critical(runs["orch"], phases, "max_cost_before"),
            predicted_critical(runs["orch"], phases, "floor_cost"),
        ),
    }
    imbalance = {
        mode: {
            "vision_max_over_mean": phase_ratio(rs, "vision"),
            "llm_max_over_mean": phase_ratio(rs, "llm"),
            "predicted_vision_max_over_mean": predicted_ratio(rs, "vision", "after"),
            "predicted_llm_max_over_mean": predicted_ratio(rs, "llm", "after"),
        }
        for mode, rs in runs.items()
    }
    padding = sum(r["ranks"][k]["padded_tokens"] for r in ddp for k in r["ranks"]) / sum(
        r["ranks"][k]["llm_tokens"] for r in ddp for k in r["ranks"]
    )
    ddp_med = statistics.median(ddp_steps)
    vs_ddp = {
        "DDP (HF modules, padded micro-batch)": {"step_s": ddp_med, "ratio": 1.0, "step_ratio": 1.0},
        **{
            f"orch homogeneous dp{args.ranks}, --balance {m}": {
                "step_s": statistics.median(steps[m]),
                "ratio": statistics.median(steps[m]) / ddp_med,
                "step_ratio": statistics.median(a / b for a, b in zip(steps[m], ddp_steps, strict=True)),
            }
            for m in modes
        },
    }

    vision_tokens = [n for r in runs["none"] for n in _vision_lengths(model, data, r["step"])]
    print(
        f"bench_qwen_vl{' --small' if args.small else ''}: Qwen2.5-VL-shaped, {params['total'] / 1e6:.0f}M parameters "
        f"(tower {params['vision'] / 1e6:.0f}M, LLM {params['llm'] / 1e6:.0f}M), {data.name}, global batch "
        f"{data.global_batch}, {args.ranks} gloo processes, {args.dtype}, {args.steps} steps ({WARMUP} warm-up left out), "
        f"none / orch / DDP interleaved; {wall:.0f} s in all"
    )
    print(
        f"patches per sample: median {statistics.median(vision_tokens):.0f}, max {max(vision_tokens)}, "
        f"text-only {sum(1 for n in vision_tokens if n == 0) / len(vision_tokens):.0%}; "
        f"plan: {', '.join(f'{m} {p.layout}' for m, p in plan.modules.items())}"
    )
    print(
        f"{'balance':<8} {'step s (med)':>12} {'critical s':>11} {'ideal s':>8} {'vision max/mean':>16} "
        f"{'llm max/mean':>13} {'pred. vision':>13} {'pred. llm':>10} {'dispatch s':>11} {'MB moved':>9}"
    )
    for mode in modes:
        s, im = summary[mode], imbalance[mode]
        print(
            f"{mode:<8} {s['median_step_s']:>12.3f} {s['median_compute_critical_s']:>11.3f} "
            f"{s['median_compute_ideal_s']:>8.3f} {im['vision_max_over_mean']:>16.2f} {im['llm_max_over_mean']:>13.2f} "
            f"{im['predicted_vision_max_over_mean']:>13.2f} {im['predicted_llm_max_over_mean']:>10.2f} "
            f"{s['dispatcher_s']:>11.3f} {s['intra_node_mb'] + s['inter_node_mb']:>9.1f}"
        )
    print(f"worst loss difference orch vs none: {worst:.1e} relative; DDP vs none: {worst_ddp:.1e}")
    head = f"{'ratio of medians':>16} {'median step ratio':>18} {'ratio of totals':>16}"
    print(f"{'speed-up vs none, step time':<46} {head}")
    for label, sp in (
        ("orch (measured)", achieved),
        ("ceiling: every phase at its mean rank", ceiling),
        ("ceiling: whole samples (none split)", whole),
    ):
        print(_row(label, sp))
    print(f"{'speed-up vs none, compute (sum of slowest ranks)':<46} {head}")
    for label, sp in compute_rows.items():
        print(_row(label, sp))
    print(f"{'run':<46} {'step s (med)':>12} {'vs DDP (medians)':>17} {'median step ratio':>18}")
    for label, row in vs_ddp.items():
        print(f"{label:<46} {row['step_s']:>12.3f} {row['ratio']:>16.2f}x {row['step_ratio']:>17.2f}x")
    print(f"DDP's padded micro-batches: {padding:.2f}x the LLM tokens of the samples")

    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / ("qwen_vl_small.json" if args.small else "qwen_vl.json")).write_text(
        json.dumps(
            {
                "steps": args.steps,
                "dtype": args.dtype,
                "params": params,
                "model": model.model_dump(mode="json"),
                "data": data.model_dump(mode="json"),
                "speedups": achieved,
                "ceiling": ceiling,
                "ceiling_whole_samples": whole,
                "compute_speedups": compute_rows,
                "imbalance": imbalance,
                "vs_ddp": vs_ddp,
                "ddp_padding": padding,
                "loss_rel_diff": worst,
                "ddp_loss_rel_diff": worst_ddp,
                "summary": summary,
                "losses": {m: [r["loss"] for r in rs] for m, rs in {**runs, "ddp": ddp}.items()},
                "records": {**runs, "ddp": ddp},
            },
            indent=2,
        )
    )
    tol = 1e-9 if args.dtype == "float64" else 1e-4
    assert worst <= tol, f"losses of orch and none differ: {worst:.2e}"


def _moe_report(args: Any, model: ModelSpec, data: DataSpec, plan: Plan, params: dict, runs: dict, wall: float) -> None:
    """bench_qwen_vl --family qwen3_vl_moe: vision and LLM max/mean over ranks before (none) and after (orch)
    post-balancing, and the step time balanced vs not."""
    worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(runs["orch"], runs["none"], strict=True))
    steps = {mode: [r["step_time_s"] for r in records[WARMUP:]] for mode, records in runs.items()}
    achieved = speedups(steps["none"], steps["orch"])
    summary = {mode: summarise(records, model) for mode, records in runs.items()}
    print(
        f"bench_qwen_vl --family qwen3_vl_moe{' --small' if args.small else ''}: Qwen3-VL-MoE-shaped, "
        f"{params['total'] / 1e6:.0f}M parameters (tower {params['vision'] / 1e6:.0f}M, LLM {params['llm'] / 1e6:.0f}M: "
        f"{model.llm.experts} experts of ffn {model.llm.expert_width}, {model.llm.top_k} a token), {data.name}, "
        f"global batch {data.global_batch}, {args.ranks} gloo processes, {args.dtype}, {args.steps} steps "
        f"({WARMUP} warm-up left out), none / orch interleaved; {wall:.0f} s in all"
    )
    print(f"plan: {', '.join(f'{m} {p.layout}' for m, p in plan.modules.items())}")
    print(f"{'balance':<8} {'step s (med)':>12} {'vision max/mean':>16} {'llm max/mean':>13} {'pred. vision':>13}")
    for mode, rs in runs.items():
        print(
            f"{mode:<8} {summary[mode]['median_step_s']:>12.3f} {phase_ratio(rs, 'vision'):>16.2f} "
            f"{phase_ratio(rs, 'llm'):>13.2f} {predicted_ratio(rs, 'vision', 'after'):>13.2f}"
        )
    print(f"worst loss difference orch vs none: {worst:.1e} relative")
    print(
        f"{'speed-up vs none, step time':<46} {'ratio of medians':>16} {'median step ratio':>18} {'ratio of totals':>16}"
    )
    print(_row("orch (measured)", achieved))
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / ("qwen3_vl_moe_small.json" if args.small else "qwen3_vl_moe.json")).write_text(
        json.dumps(
            {
                "steps": args.steps,
                "dtype": args.dtype,
                "params": params,
                "speedups": achieved,
                "summary": summary,
                "loss_rel_diff": worst,
                "records": runs,
            },
            indent=2,
        )
    )
    tol = 1e-9 if args.dtype == "float64" else 1e-4
    assert worst <= tol, f"losses of orch and none differ: {worst:.2e}"


def _row(label: str, sp: dict[str, float]) -> str:
    return (
        f"{label:<46} {sp['ratio_of_medians']:>15.2f}x {sp['median_of_step_ratios']:>17.2f}x "
        f"{sp['ratio_of_totals']:>15.2f}x"
    )


def _vision_lengths(model: ModelSpec, data: DataSpec, step: int) -> list[int]:
    from orch.runtime.data.synthetic import SyntheticBatch

    batch = SyntheticBatch.build(model, data, 0, step)
    return [batch.enc_tokens[i]["vision"] for i in range(batch.size)]


def _params(directory: Path) -> dict[str, int]:
    from safetensors import safe_open

    out = {"total": 0, "vision": 0, "llm": 0}
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            n = f.get_slice(key).get_shape()
            count = 1
            for d in n:
                count *= d
            out["total"] += count
            out["vision" if ".visual." in key or key.startswith("visual.") else "llm"] += count
    return out


if __name__ == "__main__":
    main()
