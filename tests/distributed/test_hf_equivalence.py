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
from equivalence import assert_matches_hf
from hf_models import make_llava, make_qwen2_audio
from launching import train_tasks

from orch.planner.plan import DataParallel, Layout, Recompute
from orch.planner.specs import DataSpec, TaskSpec
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.models.registry import model_spec_from_dir
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
    """Text, image and speech samples: a model without one of the encoders sees those samples as text."""
    return DataSpec(
        global_batch=6,
        seq_len=80,
        tasks=[
            TaskSpec(name="text", weight=0.2, tokens={"llm": 30}, max={"llm": 60}),
            TaskSpec(name="image", weight=0.5, tokens={"vision": 24, "llm": 56}, max={"vision": 40, "llm": 80}),
            TaskSpec(name="asr", weight=0.3, tokens={"audio": 30, "llm": 50}, max={"audio": 56, "llm": 80}),
        ],
    )


def hf_reference(directory, model, data, seed):
    """(loss, {hf parameter name: gradient}) of step 0 by the HF model in one process."""
    import transformers

    hf = transformers.LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    batch = SyntheticBatch.build(model, data, seed, 0)
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


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Every 4-rank plan of every family in ONE launch (process start-up dominates otherwise): the records,
    where they ran, and per family (orch -> HF names, HF loss, HF gradients)."""
    root = tmp_path_factory.mktemp("hf-four")
    data = data_spec()
    sources = {"clip_llama": make_llava(root / "clip_llama", "clip", "llama")}
    sources |= {f: make_llava(root / f, *kinds, **extra) for f, (kinds, extra) in FAMILIES.items()}
    sources["qwen2_audio"] = make_qwen2_audio(root / "qwen2_audio")
    groups = {"clip_llama": PLANS_4, **dict.fromkeys(FAMILIES, FAMILY_PLANS), "qwen2_audio": AUDIO_PLANS}
    built, wants = {}, {}
    for family, directory in sources.items():
        model = model_spec_from_dir(directory)
        ref = hf_audio_reference if family == "qwen2_audio" else hf_reference
        wants[family] = (orch_keys(model), *ref(directory, model, data, SEED))
        # the other families' and the audio model's plans shard their state with FSDP2 (the audio's with
        # recompute too): the HF modules under fully_shard, composed with TP, CP and PP
        dp = DataParallel.REPLICATE if family == "clip_llama" else DataParallel.FSDP
        rc = Recompute.SELECTIVE if family == "qwen2_audio" else Recompute.NONE
        for plan_name, layout in groups[family].items():
            built[f"{family}-{plan_name}"] = hand_plan(model, data, layout, data_parallel=dp, recompute=rc)
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    out = root / "runs"
    return train_tasks(built, data, cfg, out), out, wants, sources


def check_family(four_ranks, family):
    records, out, wants, _ = four_ranks
    names = [n for n in records if n.split("-")[0] == family]
    assert names
    for name in names:
        assert_matches_hf(records, name, out, *wants[family])


@pytest.mark.slow
def test_llava_plans_match_hf(four_ranks):
    check_family(four_ranks, "clip_llama")


@pytest.mark.slow
def test_llava_disaggregated_2_to_3_matches_hf(four_ranks, tmp_path):
    """The CLIP+Llama LLaVA of the 4-rank launch, and its HF reference (computed there), on 5 ranks."""
    _, _, wants, sources = four_ranks
    model = model_spec_from_dir(sources["clip_llama"])
    data = data_spec()
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    built = {name: hand_plan(model, data, layout) for name, layout in PLANS_5.items()}
    records = train_tasks(built, data, cfg, tmp_path)
    for name in PLANS_5:
        assert_matches_hf(records, name, tmp_path, *wants["clip_llama"])


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_families_match_hf(four_ranks, family):
    check_family(four_ranks, family)


def hf_audio_reference(directory, model, data, seed):
    """(loss, gradients) of step 0 by Qwen2AudioForConditionalGeneration in one process: each sample's clips
    through the audio tower with the padding mask Qwen2AudioModel builds, its projector, then the LLM."""
    import transformers
    from transformers.masking_utils import create_bidirectional_mask

    hf = transformers.Qwen2AudioForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    # The encoder's __init__ freezes its sinusoidal positions; from_pretrained (5.24) loses the flag. orch keeps
    # the class's intent, and so does the reference.
    hf.model.audio_tower.embed_positions.requires_grad_(False)
    clip = 2 * hf.config.audio_config.max_source_positions
    batch = SyntheticBatch.build(model, data, seed, 0)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(batch.size):
        s = batch.sample(i, torch.float64)
        frames = s.feats["audio"]
        parts = []
        for c in frames.split(clip) if frames.shape[0] else []:
            feats = F.pad(c.t(), (0, clip - c.shape[0])).unsqueeze(0)
            lengths, out_lengths = hf.model.audio_tower._get_feat_extract_output_lengths(torch.tensor([c.shape[0]]))
            mask_2d = (torch.arange(clip // 2)[None, :] < lengths[:, None]).long()
            mask = create_bidirectional_mask(
                config=hf.model.audio_tower.config, inputs_embeds=torch.zeros(1, clip // 2, 1), attention_mask=mask_2d
            )
            hidden = hf.model.audio_tower(feats, attention_mask=mask).last_hidden_state
            parts.append(hf.model.multi_modal_projector(hidden)[0, : int(out_lengths[0])])
        prefix = sum(p.shape[0] for p in parts)
        parts.append(hf.get_input_embeddings()(s.text))
        logits = hf(inputs_embeds=torch.cat(parts).unsqueeze(0)).logits[0, prefix:]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    loss = total / batch.label_tokens
    loss.backward()
    return loss.item(), {k: v.grad for k, v in hf.named_parameters() if v.grad is not None}


AUDIO_PLANS = {
    "audio_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "audio": (Layout(dp=4), [0, 1, 2, 3])},
    "audio_tp2_dp2_llm_pp2_dp2": {
        "llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]),
        "audio": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
    },
    "disaggregated_audio_dp1_llm_cp3": {"llm": (Layout(cp=3), [1, 2, 3]), "audio": (Layout(dp=1), [0])},
}


@pytest.mark.slow
def test_qwen2_audio_plans_match_hf(four_ranks):
    check_family(four_ranks, "qwen2_audio")
