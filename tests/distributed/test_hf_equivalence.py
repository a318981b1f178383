"""A Hugging Face LLaVA model under orch's plans, held against transformers' own forward and backward.

The reference is the HF model itself (`LlavaForConditionalGeneration.from_pretrained`, float64, one
sample at a time: its images through `get_image_features`, their features in the image tokens' places
before the text, then the language model and its head). On the same samples, every plan
gives the same loss (the global mean over label tokens, 1e-9 relative) and the same gradient of every
parameter after one step (1e-9 of the tensor's largest entry).
"""

import pytest
import torch
import torch.nn.functional as F
from equivalence import merged
from hf_models import make_llava
from launching import train_tasks

from orch.planner.hf_config import model_spec_from_dir
from orch.planner.plan import Layout
from orch.planner.specs import DataSpec, TaskSpec
from orch.runtime.data.synthetic import GlobalBatch
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

SEED = 5
PLANS_4 = {
    "homogeneous_dp4": {"llm": (Layout(dp=4), [0, 1, 2, 3])},
    "colocated_vision_dp4_llm_tp2_dp2": {
        "llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "colocated_vision_tp2_dp2_llm_cp2_dp2": {
        "llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
    },
    "colocated_vision_dp4_llm_pp2_dp2": {
        "llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
    },
}
PLANS_5 = {"disaggregated_vision_dp2_llm_dp3": {"llm": (Layout(dp=3), [2, 3, 4]), "vision": (Layout(dp=2), [0, 1])}}


def data_spec() -> DataSpec:
    return DataSpec(
        global_batch=6,
        seq_len=80,
        tasks=[
            TaskSpec(name="text", weight=0.3, tokens={"llm": 30}, max={"llm": 60}),
            TaskSpec(name="image", weight=0.7, tokens={"vision": 24, "llm": 56}, max={"vision": 40, "llm": 80}),
        ],
    )


def hf_reference(directory, model, data, seed):
    """(loss, {hf parameter name: gradient}) of step 0 by the HF model in one process."""
    import transformers

    hf = transformers.LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    batch = GlobalBatch.build(model, data, seed, 0)
    vc = hf.config.vision_config
    g, p = vc.image_size // vc.patch_size, vc.patch_size
    total = torch.zeros((), dtype=torch.float64)
    for i in range(batch.size):
        s = batch.sample(i, torch.float64)
        feats = s.feats["vision"]
        n_img = feats.shape[0] // (g * g)
        parts = []
        if n_img:  # HF's own image path; the features take the image tokens' places, before the text
            pixels = feats.reshape(n_img, g, g, 3, p, p).permute(0, 3, 1, 4, 2, 5).reshape(n_img, 3, g * p, g * p)
            image = hf.model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output
            parts.append(torch.cat(tuple(image), dim=0))
        parts.append(hf.get_input_embeddings()(s.text))
        logits = hf(inputs_embeds=torch.cat(parts).unsqueeze(0)).logits[0, feats.shape[0] :]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    loss = total / batch.label_tokens
    loss.backward()
    return loss.item(), {k: v.grad for k, v in hf.named_parameters() if v.grad is not None}


def orch_keys(model):
    from orch.runtime.models.hf.build import build_hf_modules

    return {f"{n}.{local}": key for n, m in build_hf_modules(model).items() for local, key in m.hf_keys.items()}


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return make_llava(tmp_path_factory.mktemp("llava") / "llava-clip-llama", "clip", "llama")


# Other families, one launch: SigLIP (no class token) with Qwen2 (q/k/v biases) and tied embeddings, and
# Mistral with a sliding window shorter than the samples (the window holds under CP too).
FAMILIES = {
    "siglip_qwen2_tied": (("siglip", "qwen2"), {"tie_word_embeddings": True}),
    "clip_mistral_window": (("clip", "mistral"), {"sliding_window": 12}),
}
FAMILY_PLANS = {
    "vision_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "vision": (Layout(dp=4), [0, 1, 2, 3])},
    "llm_cp2_dp2": {"llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]), "vision": (Layout(tp=2, dp=2), [0, 1, 2, 3])},
}


def check(records, name, out, keys, want_loss, want_grads):
    assert records[name][0].loss == pytest.approx(want_loss, rel=1e-9), name
    got = {keys[k]: v for k, v in merged(out / name, "grads").items()}
    assert set(got) == set(want_grads), name
    # A key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by all keys): its
    # reference is rounding noise, so errors are measured against a millionth of the largest gradient too.
    floor = 1e-6 * max(g.abs().max().item() for g in want_grads.values())
    for k, ref in want_grads.items():
        err = (got[k] - ref).abs().max().item()
        assert err <= 1e-9 * max(ref.abs().max().item(), floor), f"{name}: {k}: max error {err:.3e}"


@pytest.mark.slow
@pytest.mark.parametrize("plans", [PLANS_4, PLANS_5], ids=["ranks4", "ranks5"])
def test_llava_plans_match_hf(llava, plans, tmp_path):
    model = model_spec_from_dir(llava)
    data = data_spec()
    want_loss, want_grads = hf_reference(llava, model, data, SEED)
    keys = orch_keys(model)
    cfg = TrainConfig(steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    built = {name: hand_plan(model, data, layout) for name, layout in plans.items()}
    records = train_tasks(built, data, cfg, tmp_path)
    for name in plans:
        check(records, name, tmp_path, keys, want_loss, want_grads)


@pytest.mark.slow
def test_other_families_match_hf(tmp_path_factory, tmp_path):
    data = data_spec()
    built, wants = {}, {}
    for family, ((vision, text), extra) in FAMILIES.items():
        directory = make_llava(tmp_path_factory.mktemp(family) / family, vision, text, **extra)
        model = model_spec_from_dir(directory)
        wants[family] = (orch_keys(model), *hf_reference(directory, model, data, SEED))
        for plan_name, layout in FAMILY_PLANS.items():
            built[f"{family}-{plan_name}"] = hand_plan(model, data, layout)
    cfg = TrainConfig(steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    records = train_tasks(built, data, cfg, tmp_path)
    for name in built:
        keys, want_loss, want_grads = wants[name.split("-")[0]]
        check(records, name, tmp_path, keys, want_loss, want_grads)
