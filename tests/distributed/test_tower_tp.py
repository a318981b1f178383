"""Tensor parallelism inside the towers, every family, in float64 on 2 gloo ranks (one launch).

The Qwen-VL towers (Qwen2-VL, Qwen2.5-VL with its windows, Qwen3-VL with its deepstack mergers) are sharded
over TP 2 as the runtime places them (built on meta, sharded, read from the safetensors: the fused qkv by heads,
runtime/models/hf/fused_qkv.py) and held against transformers' own tower: its output and every parameter's
gradient of a fixed linear function of it (1e-9). Then for every tower family (LLaVA with CLIP and with SigLIP,
Qwen2-Audio, the three Qwen-VL, InternVL with and without InternViT-6B's q/k norms) the whole step 0 with the tower at TP 2 (the LLM at DP 2 beside it) gives the
loss (1e-9 relative) and every gradient (1e-9) of the same step with the tower at DP 2, the plan the family
matrix holds against the HF model's own step 0. InternVL's tower with q/k norms over the whole width (sharded by
heads, their squared sums all-reduced) is held against `get_image_features` at TP 2 the same way.
"""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from equivalence import assert_close, merged
from families import data_for
from hf_models import make_llava, make_qwen2_audio
from internvl_models import hf_norms_in_float64, make_internvl
from launching import train_tasks
from qwen_vl_models import make_qwen_vl

from orch.planner.plan import DataParallel, Layout
from orch.planner.specs import DataSpec
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

SEED = 3
QK_NORM = {"use_qk_norm": True}  # InternViT-6B's attention (its layer norms, RMSNorms there, run as HF's own)
QWEN_VL = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
           "qwen3_vl": "Qwen3VLForConditionalGeneration"}  # fmt: skip
# Per sample its images and videos: Qwen2.5-VL's 16-patch windows cut the 8 x 12 image into six; a video of two
# temporal steps.
GRIDS = [[(1, 8, 12)], [(1, 4, 4), (2, 4, 8)]]


def tower_output_and_gradients(tower, feats, items, hf_keys=None):
    """The tower's output on the samples' items and, against fixed weights, {HF name: full gradient}."""
    from orch.runtime.models.contract import encoder_call
    from orch.runtime.parallel.tensor import local_part

    out = encoder_call(tower, feats, [sum(it.patches for it in per) for per in items], None, items)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    (out * weights).sum().backward()
    grads = {}
    for name, p in tower.named_parameters():
        if p.grad is not None:
            full = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else local_part(p.grad)
            grads[hf_keys[name] if hf_keys else name] = full.detach().clone()
    return out.detach(), grads


def check_tower_tp2(rank: int, directories: dict[str, str], out: Path, internvl: dict[str, str]) -> None:
    """On each rank: every Qwen-VL tower placed at TP 2 and run; rank 0 saves (orch's, HF's) output and grads."""
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    from orch.runtime.models.hf.build import build_hf_modules
    from orch.runtime.parallel.parallelize import place
    from orch.runtime.sample import MediaItem

    mesh = init_device_mesh("cpu", (2,))
    results = {}
    for family, directory in directories.items():
        model = model_spec_from_dir(directory)
        tower = build_hf_modules(model, ["vision"])["vision"]
        tower.to(torch.float64)
        place(tower, tp_mesh=mesh, device=torch.device("cpu"), seed=SEED, name="vision")
        assert {type(p).__name__ for p in tower.visual.blocks[0].attn.qkv.parameters()} == {"DTensor"}
        items = [[MediaItem(g) for g in per] for per in GRIDS]
        rows = sum(it.patches for per in items for it in per)
        feats = torch.randn(rows, model.modules["vision"].input_dim, generator=torch.Generator().manual_seed(1),
                            dtype=torch.float64)  # fmt: skip
        mine = tower_output_and_gradients(tower, feats, items, tower.hf_keys)
        hf = getattr(transformers, QWEN_VL[family]).from_pretrained(directory, dtype=torch.float64)
        theirs = tower_output_and_gradients(_HFTower(hf.model.visual), feats, items)
        results[family] = (mine, ({f"model.visual.{k}": v for k, v in theirs[1].items()}, theirs[0]))
    for name, directory in internvl.items():
        results[name] = internvl_tower_tp2(mesh, directory)
    if rank == 0:
        torch.save(results, out / "towers.pt")


def internvl_tower_tp2(mesh, directory: str):
    """InternVL's tower, pixel shuffle and projector at TP 2 on three tiles, and HF's `get_image_features` on them:
    ((orch's output, grads), (HF's grads, output))."""
    import transformers

    from orch.runtime.models.hf.build import build_hf_modules
    from orch.runtime.parallel.parallelize import place

    model = model_spec_from_dir(directory)
    tower = build_hf_modules(model, ["vision"])["vision"]
    tower.to(torch.float64)
    place(tower, tp_mesh=mesh, device=torch.device("cpu"), seed=SEED, name="vision")
    attention = tower.vision_tower.encoder.layer[0].attention
    assert {type(p).__name__ for p in attention.parameters()} == {"DTensor"}
    feats = torch.randn(3 * 16, 147, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mine = tower_output_and_gradients(tower, feats, [()], tower.hf_keys)
    hf = transformers.InternVLForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    with hf_norms_in_float64():
        theirs = tower_output_and_gradients(_HFTiles(hf.model, tower.tiles), feats, [()])
    return mine, (theirs[1], theirs[0])


class _HFTiles(torch.nn.Module):
    """transformers' own `get_image_features` on packed tiles (orch's rows put back into tiles by `tiles`)."""

    def __init__(self, model, tiles):
        super().__init__()
        self.model, self.tiles = model, tiles

    def forward(self, feats, seqlens, cp=None):
        out = self.model.get_image_features(pixel_values=self.tiles(feats), return_dict=True).pooler_output
        return out.flatten(0, 1)

    def named_parameters(self, *args, **kwargs):
        return (("model." + k, v) for k, v in self.model.named_parameters(*args, **kwargs))


class _HFTower(torch.nn.Module):
    """transformers' own tower called as HF's `get_image_features` calls it (its deepstack features beside)."""

    takes_items = True

    def __init__(self, visual):
        super().__init__()
        self.visual = visual

    def forward(self, feats, seqlens, cp=None, items=None):
        grid = torch.tensor([it.grid for per in items for it in per])
        out = self.visual(feats, grid_thw=grid)
        return torch.cat([out.pooler_output, *(getattr(out, "deepstack_features", None) or [])], dim=-1)

    def named_parameters(self, *args, **kwargs):
        return self.visual.named_parameters(*args, **kwargs)


@dataclass
class TowerCheck:
    """`check_tower_tp2` as a task of the same launch as the training runs."""

    directories: dict[str, str]
    workdir: str
    internvl: dict[str, str]
    world_size: int = 2
    device: str = "auto"
    timeout_s: float = 120.0

    def prepare(self) -> None:
        pass

    def run(self, ctx) -> None:
        check_tower_tp2(ctx.env.rank, self.directories, Path(self.workdir), self.internvl)

    def result(self) -> None:
        return None

    def release(self) -> None:
        pass


def assert_same_gradients(got: dict, want: dict) -> None:
    """Same names, each gradient within 1e-9 of its largest entry, or of a millionth of the largest gradient (a
    key bias's is zero in exact arithmetic: rounding noise on both sides, as tests/equivalence.py measures it)."""
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    floor = 1e-6 * max(g.abs().max().item() for g in want.values())
    for k, ref in want.items():
        err = (got[k].reshape(ref.shape) - ref).abs().max().item()
        assert err <= 1e-9 * max(ref.abs().max().item(), floor), f"{k}: max error {err:.3e}"


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """Every family's tiny model, its step 0 with the tower at TP 2 and at DP 2, and the Qwen-VL tower check, in
    ONE 2-rank launch: (records, where they ran, the families' modules)."""
    root = tmp_path_factory.mktemp("tower-tp")
    sources = {
        "llava_clip": make_llava(root / "llava_clip", "clip", "llama"),
        "llava_siglip": make_llava(root / "llava_siglip", "siglip", "qwen2"),
        "qwen2_audio": make_qwen2_audio(root / "qwen2_audio"),
        **{family: make_qwen_vl(root / family, family, seed=7) for family in QWEN_VL},
        "internvl": make_internvl(root / "internvl"),
        "internvl_qk_norm": make_internvl(root / "internvl_qk_norm", vision_extra=QK_NORM),
    }
    plans, datas = {}, {}
    for family, directory in sources.items():
        model = model_spec_from_dir(directory)
        data = DataSpec.model_validate(data_for(model.modules))
        (tower,) = model.encoder_names
        assert model.modules[tower].refuses("tp", 2) is None, family
        for name, layout in (("tower_tp2", Layout(tp=2)), ("tower_dp2", Layout(dp=2))):
            layouts = {"llm": (Layout(dp=2), [0, 1]), tower: (layout, [0, 1])}
            plans[f"{family}-{name}"] = hand_plan(model, data, layouts, data_parallel=DataParallel.FSDP)
            datas[f"{family}-{name}"] = data
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    out = root / "runs"
    check = TowerCheck(
        {f: str(sources[f]) for f in QWEN_VL}, str(root), {"internvl_qk_norm": str(sources["internvl_qk_norm"])}
    )
    records = train_tasks(plans, datas, cfg, out, extra=[check])
    return records, out, torch.load(root / "towers.pt", weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(QWEN_VL))
def test_qwen_vl_tower_at_tp2_gives_hf_output_and_gradients(launch, family):
    (out, grads), (want_grads, want_out) = launch[2][family]
    assert out.shape == want_out.shape
    assert_close({"out": out}, {"out": want_out}, 1e-9)
    assert_same_gradients(grads, want_grads)


@pytest.mark.slow
def test_internvl_qk_norm_tower_at_tp2_gives_hf_output_and_gradients(launch):
    """InternViT's q/k norms over the whole width, sharded by heads: the squared sum all-reduced over TP 2."""
    (out, grads), (want_grads, want_out) = launch[2]["internvl_qk_norm"]
    assert out.shape == want_out.shape == (12, 48)
    assert_close({"out": out}, {"out": want_out}, 1e-9)
    assert any("q_norm" in k for k in grads)
    assert_same_gradients(grads, want_grads)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family", ["llava_clip", "llava_siglip", "qwen2_audio", *QWEN_VL, "internvl", "internvl_qk_norm"]
)
def test_step0_with_the_tower_at_tp2_equals_dp2(launch, family):
    records, out, _ = launch
    tp, dp = records[f"{family}-tower_tp2"], records[f"{family}-tower_dp2"]
    assert tp[0].loss == pytest.approx(dp[0].loss, rel=1e-9)
    assert_same_gradients(merged(out / f"{family}-tower_tp2", "grads"), merged(out / f"{family}-tower_dp2", "grads"))
