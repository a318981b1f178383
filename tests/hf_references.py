"""The Hugging Face model's own step-0 loss and gradients on orch's synthetic batch, in one process, float64: the
reference every family's plans are held against (tests/family_matrix.py). One function per runtime folder
(by the family's class in runtime/models/registry.py), each `(directory, transformers class, model spec, data, seed) ->
(loss, {HF parameter name: gradient})`: the loss is the global mean over label tokens, as orch's."""

import torch
import torch.nn.functional as F

from orch.runtime.data.synthetic import SyntheticBatch


def _from_pretrained(directory, class_name: str):
    import transformers

    # a MoE model's experts as the eager loop (the grouped_mm kernel takes no float64)
    experts = {"experts_implementation": "eager"} if "Moe" in class_name else {}
    return getattr(transformers, class_name).from_pretrained(directory, dtype=torch.float64, **experts)


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
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, sample by sample: the HF vision tower on the sample's patches
    and grid, the merged tokens before the text, the language model at the M-RoPE positions orch's layout gives
    (tests/unit/test_qwen_vl_model.py holds those against HF's `get_rope_index`; Qwen3-VL's deepstack features
    added at the vision rows of its first layers)."""
    hf = _from_pretrained(directory, class_name)
    batch = SyntheticBatch.build(model, data, seed, 0)
    total, _ = _qwen_vl_samples(hf, batch, router_logits=False)
    return _finish(hf, total, batch.label_tokens)


def qwen_vl_moe_aux(directory, class_name, model, data, seed, per_sample: bool):
    """Qwen3-VL-MoE with the router's auxiliary loss as its config asks: (LM loss, aux, {HF name: gradient of
    LM loss + coef x aux}). The aux by HF's own `load_balancing_loss_func`: over the whole batch (every sample's
    router logits of a layer together, as HF's batch forward with its padding masked), or, `per_sample`, of each
    sample alone weighted by its share of the batch's rows (orch's micro-batches of one sample each)."""
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

    hf = _from_pretrained(directory, class_name)
    text = hf.config.text_config
    batch = SyntheticBatch.build(model, data, seed, 0)
    total, logits = _qwen_vl_samples(hf, batch, router_logits=True)

    def aux_of(samples):
        layers = tuple(torch.cat(per) for per in zip(*samples, strict=True))
        return load_balancing_loss_func(layers, text.num_experts, text.num_experts_per_tok)

    if per_sample:
        rows = [batch.layout(i).length for i in range(batch.size)]
        # HF's aux of each sample is float32; the weighted sum is float64, as orch's
        aux = sum(n / sum(rows) * aux_of([lg]).double() for n, lg in zip(rows, logits, strict=True))
    else:
        aux = aux_of(logits).double()
    lm = total / batch.label_tokens
    (lm + text.router_aux_loss_coef * aux).backward()
    grads = {k: v.grad for k, v in hf.named_parameters() if v.grad is not None}
    return lm.item(), aux.item(), grads


def _qwen_vl_samples(hf, batch, router_logits: bool):
    """The summed cross-entropy of a Qwen-VL batch, sample by sample, and (router_logits) each sample's router
    logits per MoE layer."""
    total = torch.zeros((), dtype=torch.float64)
    logits_per_sample = []
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
        if router_logits:
            extra["output_router_logits"] = True
        parts.append(hf.get_input_embeddings()(s.text))
        positions = layout.positions if layout.positions is not None else torch.arange(layout.length).expand(3, -1)
        out = hf.model.language_model(
            inputs_embeds=torch.cat(parts).unsqueeze(0), position_ids=positions.unsqueeze(1), **extra
        )
        if router_logits:
            logits_per_sample.append(out.router_logits)
        logits = hf.lm_head(out.last_hidden_state)[0, layout.prefix :]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    return total, logits_per_sample


def qwen_omni(directory, class_name, model, data, seed):
    """Qwen2.5-Omni's thinker, sample by sample: its clip through HF's `get_audio_features` (the features as the
    processor lays them out, [1, mel bins, frames], every frame real in its `feature_attention_mask`), its image
    through the vision tower, the clip's then the image's tokens before the text, the language model at the
    TMRoPE positions orch's layout gives (tests/unit/test_qwen_omni.py holds those against HF's
    `get_rope_index`)."""
    full = _from_pretrained(directory, class_name)
    hf = full.thinker
    batch = SyntheticBatch.build(model, data, seed, 0)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(batch.size):
        s = batch.sample(i, torch.float64)
        layout = batch.layout(i)
        parts = []
        frames = s.feats["audio"]
        if frames.shape[0]:
            mask = torch.ones(1, frames.shape[0], dtype=torch.long)
            parts.append(hf.get_audio_features(frames.t()[None], feature_attention_mask=mask).pooler_output)
        if s.feats["vision"].shape[0]:
            grid = torch.tensor([it.grid for it in s.items["vision"]])
            parts.append(hf.model.visual(s.feats["vision"], grid_thw=grid).pooler_output)
        parts.append(hf.get_input_embeddings()(s.text))
        hidden = hf.model.language_model(
            inputs_embeds=torch.cat(parts).unsqueeze(0), position_ids=layout.positions.unsqueeze(1)
        ).last_hidden_state
        logits = hf.lm_head(hidden)[0, layout.prefix :]
        total = total + F.cross_entropy(logits, s.labels, reduction="sum")
    return _finish(full, total, batch.label_tokens)  # names as the full model's, thinker.*


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
REFERENCES = {"Llava": llava, "Qwen2Audio": qwen2_audio, "QwenVL": qwen_vl, "QwenOmni": qwen_omni, "InternVL": internvl}
