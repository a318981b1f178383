"""The Hugging Face model's own step-0 loss and gradients on orch's synthetic batch, in one process, float64: the
reference every family's plans are held against (tests/family_matrix.py). One function per runtime folder
(by the family's class in runtime/models/registry.py), each `(directory, transformers class, model spec, data, seed) ->
(loss, {HF parameter name: gradient})`: the loss is the global mean over label tokens, as orch's."""

import torch
import torch.nn.functional as F

from orch.runtime.data.synthetic import SyntheticBatch


def _from_pretrained(directory, class_name: str):
    import transformers

    return getattr(transformers, class_name).from_pretrained(directory, dtype=torch.float64)


def _finish(hf, total: torch.Tensor, label_tokens: int) -> tuple[float, dict[str, torch.Tensor]]:
    loss = total / label_tokens
    loss.backward()
    return loss.item(), {k: v.grad for k, v in hf.named_parameters() if v.grad is not None}


def llava(directory, class_name, model, data, seed):
    """LLaVA, sample by sample: its images through `get_image_features`, their features in the image tokens'
    places before the text, then the language model and its head."""
    hf = _from_pretrained(directory, class_name)
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
    return _finish(hf, total, batch.label_tokens)


def qwen2_audio(directory, class_name, model, data, seed):
    """Qwen2-Audio, sample by sample: each clip through the audio tower with the padding mask Qwen2AudioModel
    builds, its projector, then the LLM."""
    from transformers.masking_utils import create_bidirectional_mask

    hf = _from_pretrained(directory, class_name)
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
    return _finish(hf, total, batch.label_tokens)


def qwen_vl(directory, class_name, model, data, seed):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL, sample by sample: the HF vision tower on the sample's patches and grid,
    the merged tokens before the text, the language model at the M-RoPE positions orch's layout gives
    (tests/unit/test_qwen_vl_model.py holds those against HF's `get_rope_index`; Qwen3-VL's deepstack features
    added at the vision rows of its first layers)."""
    hf = _from_pretrained(directory, class_name)
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
    return _finish(hf, total, batch.label_tokens)


def internvl(directory, class_name, model, data, seed):
    """InternVL, sample by sample: its tiles through `get_image_features` (tower, pixel shuffle, projector), their
    tokens before the text, then the language model and its head."""
    hf = _from_pretrained(directory, class_name)
    batch = SyntheticBatch.build(model, data, seed, 0)
    vc = hf.config.vision_config
    p = vc.patch_size[0]
    g = vc.image_size[0] // p
    total = torch.zeros((), dtype=torch.float64)
    for i in range(batch.size):
        s = batch.sample(i, torch.float64)
        feats = s.feats["vision"]
        tiles = feats.shape[0] // (g * g)
        parts = []
        if tiles:
            pixels = feats.reshape(tiles, g, g, 3, p, p).permute(0, 3, 1, 4, 2, 5).reshape(tiles, 3, g * p, g * p)
            image = hf.model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output
            parts.append(image.flatten(0, 1))
        parts.append(hf.get_input_embeddings()(s.text))
        prefix = sum(x.shape[0] for x in parts[:-1])
        logits = hf(inputs_embeds=torch.cat(parts).unsqueeze(0)).logits[0, prefix:]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    return _finish(hf, total, batch.label_tokens)


# A family's class (runtime/models/*/family.py) -> its reference: a family registered with a new class has none
# until one is written here (the family matrix fails for it, naming this table).
REFERENCES = {"Llava": llava, "Qwen2Audio": qwen2_audio, "QwenVL": qwen_vl, "InternVL": internvl}
