"""Qwen2-VL and Qwen2.5-VL under orch's plans, held against transformers' own model in float64.

Synthetic batches of native-resolution images (each sample's patches one image of a near-square grid,
`runtime/data/batch.py` `grid_items`; some samples text only). The reference is the HF model in one process,
sample by sample: its own vision tower on the sample's patches and grid, the merged tokens before the text, the
language model at the M-RoPE positions orch's layout gives (tests/unit/test_qwen_vl_model.py holds those
against HF's `get_rope_index`; Qwen3-VL's deepstack features added at the vision rows of its first layers).
Every plan gives the same loss (1e-9 relative) and the same gradient of every
parameter (1e-9 of the tensor's largest entry): the tower balanced over DP4 while the LLM runs TP2, CP2 or PP2,
homogeneous, and disaggregated on 5 ranks; and Qwen2.5-VL resharded (ZeRO-3).
"""

import pytest
import torch
import torch.nn.functional as F
from equivalence import assert_matches_hf
from launching import train_tasks
from qwen_vl_models import make_qwen_vl

from orch.planner.plan import DataParallel, Layout, Sharding
from orch.planner.specs import DataSpec, TaskSpec
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

SEED = 4
CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
           "qwen3_vl": "Qwen3VLForConditionalGeneration"}  # fmt: skip
ALL = [0, 1, 2, 3]
PLANS = {
    "qwen2_5_vl": {
        "homogeneous_dp4": {"llm": (Layout(dp=4), ALL)},
        "vision_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
        "vision_dp4_llm_cp2_dp2": {"llm": (Layout(cp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
        "vision_dp4_llm_pp2_dp2": {"llm": (Layout(pp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
        # ZeRO-3 (runtime/parallel/fsdp.py): 6 samples over the tower's DP4, some text only, so ranks pad with
        # empty chunks that run the tower on zero patches
        "reshard_vision_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
        "reshard_homogeneous_dp4": {"llm": (Layout(dp=4), ALL)},
    },
    "qwen2_vl": {
        "vision_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
        "vision_dp4_llm_cp2_dp2": {"llm": (Layout(cp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
    },
    "qwen3_vl": {  # deepstack: the features ride along each row, added on the LLM's first stage
        "vision_dp4_llm_pp2_dp2": {"llm": (Layout(pp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
        "vision_dp4_llm_cp2_tp2": {"llm": (Layout(cp=2, tp=2), ALL), "vision": (Layout(dp=4), ALL)},
    },
}
DISAGGREGATED = {"vision_dp2_llm_dp3": {"llm": (Layout(dp=3), [2, 3, 4]), "vision": (Layout(dp=2), [0, 1])}}


def data_spec() -> DataSpec:
    """Text-only samples and images of 4 to 64 merged tokens (16 to 256 patches)."""
    return DataSpec(
        global_batch=6,
        seq_len=120,
        tasks=[
            TaskSpec(name="text", weight=0.25, tokens={"llm": 30}, max={"llm": 60}),
            TaskSpec(name="image", weight=0.75, tokens={"vision": 80, "llm": 70}, max={"vision": 256, "llm": 120}),
        ],
    )


def hf_reference(directory, family, model, data, seed):
    """(loss, {hf parameter name: gradient}) of step 0 by the HF model in one process (module docstring)."""
    import transformers

    hf = getattr(transformers, CLASSES[family]).from_pretrained(directory, dtype=torch.float64)
    batch = SyntheticBatch.build(model, data, seed, 0)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(batch.size):
        s = batch.sample(i, torch.float64)
        layout = batch.layout(i)
        parts, extra = [], {}
        if s.feats["vision"].shape[0]:
            grid = torch.tensor([it.grid for it in s.items["vision"]])
            out = hf.model.visual(s.feats["vision"], grid_thw=grid)
            parts.append(out.pooler_output)
            if getattr(out, "deepstack_features", None):  # Qwen3-VL: added at the vision rows of the first layers
                mask = torch.zeros(1, layout.length, dtype=torch.bool)
                mask[0, : layout.prefix] = True
                extra = {"visual_pos_masks": mask, "deepstack_visual_embeds": out.deepstack_features}
        parts.append(hf.get_input_embeddings()(s.text))
        positions = layout.positions if layout.positions is not None else torch.arange(layout.length).expand(3, -1)
        hidden = hf.model.language_model(
            inputs_embeds=torch.cat(parts).unsqueeze(0), position_ids=positions.unsqueeze(1), **extra
        ).last_hidden_state
        logits = hf.lm_head(hidden)[0, layout.prefix :]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    loss = total / batch.label_tokens
    loss.backward()
    return loss.item(), {k: v.grad for k, v in hf.named_parameters() if v.grad is not None}


def orch_keys(model):
    from orch.runtime.models.hf.build import build_hf_modules

    return {f"{n}.{local}": key for n, m in build_hf_modules(model).items() for local, key in m.hf_keys.items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-vl")
    data = data_spec()
    out = {}
    for family in CLASSES:
        directory = make_qwen_vl(root / family, family, seed=7)
        model = model_spec_from_dir(directory)
        out[family] = (directory, model, (orch_keys(model), *hf_reference(directory, family, model, data, SEED)))
    return out, data


@pytest.mark.slow
def test_qwen_vl_plans_match_hf(setup, tmp_path):
    families, data = setup
    built = {}
    for family, plans in PLANS.items():
        model = families[family][1]
        for name, layout in plans.items():
            sharding = Sharding.RESHARD if name.startswith("reshard") else Sharding.KEEP
            built[f"{family}-{name}"] = hand_plan(
                model, data, layout, data_parallel=DataParallel.FSDP, sharding=sharding
            )
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    records = train_tasks(built, data, cfg, tmp_path)
    batch = SyntheticBatch.build(families["qwen2_5_vl"][1], data, SEED, 0)
    assert {len(batch.items("vision", i)) for i in range(batch.size)} == {0, 1}  # text-only samples and images
    for name in built:
        assert_matches_hf(records, name, tmp_path, *families[name.split("-")[0]][2])


@pytest.mark.slow
def test_qwen2_5_vl_disaggregated_matches_hf(setup, tmp_path):
    families, data = setup
    model = families["qwen2_5_vl"][1]
    built = {name: hand_plan(model, data, layout) for name, layout in DISAGGREGATED.items()}
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    records = train_tasks(built, data, cfg, tmp_path)
    for name in built:
        assert_matches_hf(records, name, tmp_path, *families["qwen2_5_vl"][2])
