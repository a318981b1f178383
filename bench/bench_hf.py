"""A ~100M-parameter LLaVA-style Hugging Face model (CLIP tower + Llama, from config, random init) on 4 CPU
processes: orch's plans against the same HF model under plain torch DDP, in one run.

The baseline is what a user writes without orch: `LlavaForConditionalGeneration` wrapped in
DistributedDataParallel, each rank taking every 4th sample of the global batch as one right-padded
micro-batch through the model's own forward (input_ids with image tokens, pixel_values, attention_mask),
the loss summed over label tokens and divided by the global count, SGD. orch runs the same samples
under each plan (packed micro-batches, post-balancing, its schedules). Every configuration runs STEPS
steps; the median of the steps after WARMUP is the step time; ratios to DDP are the result, as the
machine is shared (docs/design.md, Measuring).

    python bench/bench_hf.py [--steps N] [--small]       (writes bench/out/hf.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orch.planner.plan import Layout
from orch.planner.specs import DataSpec, TaskSpec
from orch.runtime.launch.base import TaskSequence
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.trainer import TrainTask

WARMUP = 2
IMAGE_TOKEN = 31999
WIDE = {  # ~100M parameters: the LLM 48M in blocks + 49M embedding and head, the tower 11M
    "text": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
                 num_key_value_heads=4, vocab_size=32000),
    "vision": dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=7, num_attention_heads=6,
                   image_size=112, patch_size=14),
}  # fmt: skip
SMALL = {
    "text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=32000),
    "vision": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                   image_size=56, patch_size=14),
}  # fmt: skip
PLANS: dict[str, dict[str, tuple[Layout, list[int]]]] = {
    "homogeneous dp4": {"llm": (Layout(dp=4), [0, 1, 2, 3])},
    "colocated vision dp4, llm tp2 dp2": {
        "llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "colocated vision dp4, llm pp2 dp2": {
        "llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "disaggregated vision dp1, llm dp3": {"llm": (Layout(dp=3), [1, 2, 3]), "vision": (Layout(dp=1), [0])},
}


def make_model(directory: Path, shapes: dict[str, dict[str, int]]) -> Path:
    import torch
    import transformers

    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**shapes["vision"]),
        text_config=transformers.LlamaConfig(**shapes["text"]),
        image_token_id=IMAGE_TOKEN,
    )
    torch.manual_seed(0)
    transformers.LlavaForConditionalGeneration(config).save_pretrained(directory)
    return directory


def data_spec(image_tokens: int) -> DataSpec:
    return DataSpec(
        name="bench-hf",
        global_batch=8,
        seq_len=640,
        tasks=[
            TaskSpec(name="text", weight=0.3, tokens={"llm": 200}, max={"llm": 600}),
            TaskSpec(
                name="image",
                weight=0.7,
                tokens={"vision": 2 * image_tokens, "llm": 300},
                max={"vision": 4 * image_tokens, "llm": 640},
            ),
        ],
    )


@dataclass
class DDPTask:
    """The baseline: the HF model under torch DDP, one padded micro-batch per rank and step (a launcher Task)."""

    directory: str
    data: DataSpec
    steps: int
    workdir: str
    head_on_labels: bool = False
    world_size: int = 4
    device: str = "cpu"
    timeout_s: float = 600.0

    def prepare(self) -> None:
        Path(self.workdir).mkdir(parents=True, exist_ok=True)

    def release(self) -> None:
        pass

    def run(self, ctx: Any) -> None:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        import transformers
        from torch.nn.parallel import DistributedDataParallel

        from orch.runtime.data.synthetic import SyntheticBatch

        spec = model_spec_from_dir(self.directory)
        hf = transformers.LlavaForConditionalGeneration.from_pretrained(self.directory, dtype=torch.float32)
        model = DistributedDataParallel(hf, find_unused_parameters=True)  # LLaVA never runs its last vision layer
        opt = torch.optim.SGD(hf.parameters(), lr=0.1, foreach=False)
        vc = hf.config.vision_config
        g, p = vc.image_size // vc.patch_size, vc.patch_size
        rank, world = ctx.env.rank, ctx.env.world
        times = []
        for k in range(self.steps):
            t0 = time.perf_counter()
            batch = SyntheticBatch.build(spec, self.data, 0, k)
            mine = [batch.sample(i, torch.float32) for i in range(batch.size) if i % world == rank]
            ids, labels, pixels = [], [], []
            for s in mine:
                n = s.feats["vision"].shape[0]
                text = s.text.masked_fill(s.text == IMAGE_TOKEN, 0)
                ids.append(torch.cat([torch.full((n,), IMAGE_TOKEN), text]))
                labels.append(torch.cat([torch.full((n,), -100), s.labels]))
                if n:
                    imgs = n // (g * g)
                    pixels.append(
                        s.feats["vision"]
                        .reshape(imgs, g, g, 3, p, p)
                        .permute(0, 3, 1, 4, 2, 5)
                        .reshape(imgs, 3, g * p, g * p)
                    )
            longest = max(t.shape[0] for t in ids)
            input_ids = torch.stack([F.pad(t, (0, longest - t.shape[0])) for t in ids])
            target = torch.stack([F.pad(t, (0, longest - t.shape[0]), value=-100) for t in labels])
            mask = torch.stack([F.pad(torch.ones_like(t), (0, longest - t.shape[0])) for t in ids])
            kwargs = {"pixel_values": torch.cat(pixels)} if pixels else {}
            # orch's convention: the logit at a text position is scored against that position's label
            if self.head_on_labels:  # the same math as orch: the head only where a label is
                hidden = model(input_ids=input_ids, attention_mask=mask, logits_to_keep=target != -100, **kwargs)
                logits, scored = hidden.logits, target[target != -100]
            else:  # the model's own forward: logits at every position, padding included
                logits = model(input_ids=input_ids, attention_mask=mask, **kwargs).logits.flatten(0, 1)
                scored = target.flatten()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), scored, ignore_index=-100, reduction="sum")
            (loss / batch.label_tokens).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        if rank == 0:
            (Path(self.workdir) / "times.json").write_text(json.dumps(times))

    def result(self) -> list[float]:
        return list(json.loads((Path(self.workdir) / "times.json").read_text()))


def median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--small", action="store_true", help="a tiny model (a quick check of the script)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = make_model(Path(tmp) / "llava-bench", SMALL if args.small else WIDE)
        model = model_spec_from_dir(directory)
        data = data_spec(model.modules["vision"].image_tokens or 1)
        params = sum(t.numel() for t in _load(directory).values())
        cfg = TrainConfig(optimizer="sgd", steps=args.steps, seed=0, dtype="float32", lr=0.1, device="cpu")
        tasks: list[Any] = [
            DDPTask(str(directory), data, args.steps, str(Path(tmp) / "ddp")),
            DDPTask(str(directory), data, args.steps, str(Path(tmp) / "ddp-labels"), head_on_labels=True),
        ]
        for name, layout in PLANS.items():
            plan = hand_plan(model, data, layout, micro_batches=1)
            tasks.append(TrainTask(plan, data, cfg, str(Path(tmp) / name.replace(" ", "_")), timeout_s=600.0))
        results = LocalLauncher().submit(TaskSequence(tasks)).result()
    ddp = median_after_warmup(results[0])
    rows = [{"run": "DDP, HF forward (head everywhere)", "step_s": ddp, "vs_ddp": 1.0}]
    labels = median_after_warmup(results[1])
    rows.append({"run": "DDP, head on label positions", "step_s": labels, "vs_ddp": labels / ddp})
    for name, records in zip(PLANS, results[2:], strict=True):
        step = median_after_warmup([r.step_time_s for r in records])
        rows.append({"run": f"orch {name}", "step_s": step, "vs_ddp": step / ddp})
    print(f"LLaVA-style HF model, {params / 1e6:.0f}M parameters, global batch {data.global_batch}, "
          f"4 gloo processes, median of steps {WARMUP}..{args.steps - 1}")  # fmt: skip
    print(f"{'run':40s} {'step s':>8s} {'vs DDP':>7s}")
    for r in rows:
        print(f"{r['run']:40s} {r['step_s']:8.3f} {r['vs_ddp']:6.2f}x")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "hf.json").write_text(json.dumps({"params": params, "steps": args.steps, "rows": rows}, indent=2))


def _load(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


if __name__ == "__main__":
    main()
