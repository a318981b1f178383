"""A composed spec: a bare SigLIP tower and a Qwen2 LLM from directories of their own, joined by orch's
LLaVA projector, held against the HF models in one process; `trainable: false` trains only the projector."""

import pytest
import torch
import torch.nn.functional as F
import yaml
from equivalence import assert_matches_hf, merged
from family_matrix import SEED, data_spec
from hf_models import make_parts
from launching import train_tasks

from orch.planner.plan import Layout
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

LAYOUT = {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "vision": (Layout(dp=4), [0, 1, 2, 3])}


def spec_file(tmp_path, trainable: bool):
    path = tmp_path / f"composed-{trainable}.yaml"
    frozen = {} if trainable else {"trainable": False}
    path.write_text(
        yaml.safe_dump(
            {
                "name": "siglip-qwen2",
                "modules": {
                    "vision": {"hf": "parts/siglip", "feeds": "llm", **frozen},
                    "llm": {"hf": {"path": "parts/qwen2"}, **frozen},
                },
            }
        )
    )
    return path


def reference(siglip, qwen2, projector, model, data, trainable):
    """(loss, gradients keyed module:name) of step 0 by the HF models and the projector's weights."""
    import transformers

    tower = transformers.SiglipVisionModel.from_pretrained(siglip, dtype=torch.float64)
    llm = transformers.Qwen2ForCausalLM.from_pretrained(qwen2, dtype=torch.float64)
    proj = {k: v.clone().requires_grad_() for k, v in projector.items()}
    for p in [*tower.parameters(), *llm.parameters()]:
        p.requires_grad_(trainable)
    vc = tower.config
    g, p = vc.image_size // vc.patch_size, vc.patch_size
    batch = SyntheticBatch.build(model, data, SEED, 0)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(batch.size):
        s = batch.sample(i, torch.float64)
        feats = s.feats["vision"]
        parts = []
        if feats.shape[0]:
            n = feats.shape[0] // (g * g)
            pixels = feats.reshape(n, g, g, 3, p, p).permute(0, 3, 1, 4, 2, 5).reshape(n, 3, g * p, g * p)
            hidden = tower(pixel_values=pixels, output_hidden_states=True).hidden_states[-1]  # SigLIP: the last layer
            x = F.linear(hidden, proj["vision.multi_modal_projector.linear_1.weight"],
                         proj["vision.multi_modal_projector.linear_1.bias"])  # fmt: skip
            x = F.linear(F.gelu(x), proj["vision.multi_modal_projector.linear_2.weight"],
                         proj["vision.multi_modal_projector.linear_2.bias"])  # fmt: skip
            parts.append(x.reshape(-1, x.shape[-1]))
        parts.append(llm.get_input_embeddings()(s.text))
        logits = llm(inputs_embeds=torch.cat(parts).unsqueeze(0)).logits[0, feats.shape[0] :]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    loss = total / batch.label_tokens
    loss.backward()
    grads = {f"vision:{k}": v.grad for k, v in tower.named_parameters() if v.grad is not None}
    grads |= {f"llm:{k}": v.grad for k, v in llm.named_parameters() if v.grad is not None}
    grads |= {k: v.grad for k, v in proj.items()}
    return loss.item(), grads


WHISPER_PLANS = {
    "audio_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "audio": (Layout(dp=4), [0, 1, 2, 3])},
    "audio_tp2_dp2_llm_pp2_dp2": {
        "llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]),
        "audio": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
    },
}


def whisper_reference(whisper, qwen2, projector, model, data, ds):
    """Every clip padded to 30 s through the HF Whisper encoder, `ds` tokens concatenated into the projector."""
    import transformers

    encoder = transformers.WhisperForConditionalGeneration.from_pretrained(whisper, dtype=torch.float64).model.encoder
    encoder.embed_positions.requires_grad_(False)  # as WhisperEncoder's __init__ has it (from_pretrained loses it)
    llm = transformers.Qwen2ForCausalLM.from_pretrained(qwen2, dtype=torch.float64)
    proj = {k: v.clone().requires_grad_() for k, v in projector.items()}
    clip = 2 * encoder.config.max_source_positions
    batch = SyntheticBatch.build(model, data, SEED, 0)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(batch.size):
        s = batch.sample(i, torch.float64)
        parts = []
        for c in s.feats["audio"].split(clip) if s.feats["audio"].shape[0] else []:
            hidden = encoder(F.pad(c.t(), (0, clip - c.shape[0])).unsqueeze(0)).last_hidden_state[0]
            x = hidden.reshape(-1, ds * hidden.shape[-1])[: c.shape[0] // (2 * ds)]
            x = F.linear(
                x,
                proj["audio.multi_modal_projector.linear_1.weight"],
                proj["audio.multi_modal_projector.linear_1.bias"],
            )
            parts.append(F.linear(F.gelu(x), proj["audio.multi_modal_projector.linear_2.weight"],
                                  proj["audio.multi_modal_projector.linear_2.bias"]))  # fmt: skip
        prefix = sum(p.shape[0] for p in parts)
        parts.append(llm.get_input_embeddings()(s.text))
        logits = llm(inputs_embeds=torch.cat(parts).unsqueeze(0)).logits[0, prefix:]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    loss = total / batch.label_tokens
    loss.backward()
    grads = {f"audio:model.encoder.{k}": v.grad for k, v in encoder.named_parameters() if v.grad is not None}
    grads |= {f"llm:{k}": v.grad for k, v in llm.named_parameters() if v.grad is not None}
    return loss.item(), grads | {k: v.grad for k, v in proj.items()}


def whisper_spec(tmp_path):
    path = tmp_path / "whisper-qwen2.yaml"
    path.write_text(yaml.safe_dump({"name": "whisper-qwen2", "modules": {
        "audio": {"hf": {"path": "parts/whisper", "part": "encoder"}, "feeds": "llm", "downsample": 2},
        "llm": {"hf": "parts/qwen2"}}}))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """Both composed models' plans in ONE launch: (records, where they ran, sources, models, orch->HF names)."""
    from hf_models import make_whisper

    from orch.runtime.models.hf.build import build_hf_modules

    root = tmp_path_factory.mktemp("composed")
    siglip, qwen2 = make_parts(root / "parts")
    whisper = make_whisper(root / "parts" / "whisper")
    models = {f"trainable_{t}": load_model(str(spec_file(root, t))) for t in (True, False)}
    models["whisper"] = load_model(str(whisper_spec(root)))
    data = data_spec()
    built = {f"{m}-plan": hand_plan(models[m], data, LAYOUT) for m in ("trainable_True", "trainable_False")}
    built |= {f"whisper-{n}": hand_plan(models["whisper"], data, layout) for n, layout in WHISPER_PLANS.items()}
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    out = root / "runs"
    records = train_tasks(built, data, cfg, out)
    keys = {
        f"{n}.{local}": f"{n}:{key}"
        for model in (models["trainable_True"], models["whisper"])
        for n, m in build_hf_modules(model).items()
        for local, key in m.hf_keys.items()
    }
    return records, out, {"siglip": siglip, "qwen2": qwen2, "whisper": whisper}, models, keys


def initial_projector(out, name):
    """lr 0: the run's parameters are its initial ones, the projector's drawn from the seed."""
    params = {k: v for k, v in merged(out / name, "params").items() if ".multi_modal_projector." in k}
    assert len(params) == 4
    return params


@pytest.mark.slow
@pytest.mark.parametrize("trainable", [True, False])
def test_composed_spec_matches_hf_and_stage_one_trains_only_the_projector(composed, trainable):
    records, out, src, models, keys = composed
    name = f"trainable_{trainable}-plan"
    projector = initial_projector(out, name)
    want_loss, want = reference(src["siglip"], src["qwen2"], projector, models[f"trainable_{trainable}"],
                                data_spec(), trainable)  # fmt: skip
    got = assert_matches_hf(records, name, out, keys, want_loss, want)
    if not trainable:
        assert set(got) == set(projector)  # stage 1: the projector alone has gradients


@pytest.mark.slow
def test_composed_whisper_encoder_matches_hf(composed):
    records, out, src, models, keys = composed
    model = models["whisper"]
    assert (model.modules["audio"].downsample, model.modules["audio"].clip_tokens) == (2, 20)
    projector = initial_projector(out, f"whisper-{next(iter(WHISPER_PLANS))}")
    want_loss, want = whisper_reference(src["whisper"], src["qwen2"], projector, model, data_spec(), 2)
    for name in WHISPER_PLANS:
        assert_matches_hf(records, f"whisper-{name}", out, keys, want_loss, want)
