"""A Hugging Face model directory read into a ModelSpec from its config.json alone (no torch, no transformers).

The readers of each module kind the families share: a Llama-style decoder (`decoder_module`, `text_module`), a
CLIP or SigLIP tower (`tower_module`, `vision_module`), a Whisper-style audio encoder (`audio_module`). Each
family's own reader (its folder's, runtime/models/<family>/; docs/model_families.md) puts them together; the
planner reads a directory through the family its caller hands it (planner/model_dir.py).
A config.json written by hand (or by an older transformers) may leave fields at their class defaults;
`_DEFAULTS` holds those of transformers 5.24 (tests/unit/test_hf_config.py checks them against it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.planner.io import read_spec_text
from orch.planner.specs import HFPart, Modality, ModelSpec, ModuleKind, ModuleSpec

TEXT_TYPES = ("llama", "qwen2", "mistral")
VISION_TYPES = ("clip_vision_model", "siglip_vision_model")
AUDIO_TYPES = ("qwen2_audio_encoder",)

_TEXT = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32
    ),
    "qwen2": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32, num_attention_heads=32
    ),
    "mistral": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
    "clip_vision_model": dict(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224,
        patch_size=32, num_channels=3,
    ),
    "siglip_vision_model": dict(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224,
        patch_size=16, num_channels=3,
    ),
    "whisper": dict(
        d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80,
        max_source_positions=1500,
    ),
    "qwen2_audio_encoder": dict(
        d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, num_mel_bins=128,
        max_source_positions=1500,
    ),
}  # fmt: skip


class HFConfig:
    """One config dict (a composite's sub-config included) with its family's defaults behind it."""

    def __init__(
        self,
        source: str,
        where: str,
        raw: dict[str, Any],
        built: dict[str, Any] | None = None,
        default_type: Any = None,
        *,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        """`defaults`: the class defaults behind `raw`, where a family's reader keeps its own table (else
        `_DEFAULTS` by model_type, then `built`: what a composite builds for a sub-config it names none of)."""
        self.source, self.where = source, where
        model_type = raw.get("model_type") or default_type
        self.model_type = str(model_type) if model_type is not None else None
        if defaults is None:
            defaults = {**_DEFAULTS.get(self.model_type or "", {}), **(built or {})}
        self.values = {**defaults, **raw}

    def with_defaults(self, defaults: dict[str, Any]) -> HFConfig:
        """This config with class defaults of a composite's own behind it (LLaVA's vision_feature_layer)."""
        return HFConfig(self.source, self.where, self.values, defaults=defaults)

    def field(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str, default: Any = None) -> Any:
        value = self.values.get(name, default)
        return default if value is None else value

    def positive(self, name: str) -> int:
        value = self.values.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SpecError(self.source, self.field(name), f"expected a positive integer, got {value!r}")
        return value

    def indices(self, name: str, below: int) -> tuple[int, ...]:
        """A list of block indices 0..below-1 (Qwen-VL's fullatt_block_indexes, deepstack_visual_indexes)."""
        value = self.values.get(name)
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < below for i in value
        ):
            raise SpecError(
                self.source, self.field(name), f"expected a list of block indices 0..{below - 1}, got {value!r}"
            )
        if len(set(value)) != len(value):
            raise SpecError(self.source, self.field(name), f"a block is named twice in {list(value)}")
        return tuple(value)

    def sub(self, name: str, built: dict[str, Any]) -> HFConfig:
        """Sub-config `name`; `built`: the one the composite's class builds when config.json names none (its
        model_type and fields, transformers 5.24's: the family's reader keeps them)."""
        raw = self.values.get(name) or {}
        if not isinstance(raw, dict):
            raise SpecError(self.source, name, f"expected a mapping, got {type(raw).__name__}")
        # A composite builds its own default sub-config only when config.json names none; a sub-config
        # without a model_type is of the composite's default type, with that type's defaults (as transformers does).
        return HFConfig(self.source, name, raw, None if raw else built, built.get("model_type"))

    def expect_type(self, allowed: tuple[str, ...]) -> str:
        if self.model_type not in allowed:
            raise SpecError(
                self.source,
                self.field("model_type"),
                f"'{self.model_type}' is not supported; expected one of {', '.join(allowed)}",
            )
        return self.model_type


def read_config(directory: str | Path) -> tuple[str, dict[str, Any]]:
    """(the config file's path, its JSON) of a model directory; SpecError naming what is wrong."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise SpecError(str(directory), "", "a model directory needs config.json (a Hugging Face model directory)")
    try:
        raw = json.loads(read_spec_text(path))
    except json.JSONDecodeError as exc:
        raise SpecError(str(path), "", f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(str(path), "", f"expected a JSON object, got {type(raw).__name__}")
    return str(path), raw


def text_module(cfg: HFConfig, hf: HFPart) -> ModuleSpec:
    cfg.expect_type(TEXT_TYPES)
    return decoder_module(cfg, hf)


def decoder_module(cfg: HFConfig, hf: HFPart) -> ModuleSpec:
    """A Llama-style decoder (SwiGLU MLP, GQA); its heads may be of a width other than hidden / heads
    (head_dim: Qwen3's 128 at any width)."""
    heads = cfg.positive("num_attention_heads")
    hidden = cfg.positive("hidden_size")
    head_dim = cfg.get("head_dim", None if hidden % heads else hidden // heads)
    if head_dim is None:
        raise SpecError(
            cfg.source, cfg.field("num_attention_heads"), f"{heads} heads do not divide hidden_size {hidden}"
        )
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        raise SpecError(cfg.source, cfg.field("head_dim"), f"expected a positive integer, got {head_dim!r}")
    kv_heads = cfg.get("num_key_value_heads", heads)
    if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads <= 0 or heads % kv_heads:
        raise SpecError(
            cfg.source, cfg.field("num_key_value_heads"), f"expected a divisor of {heads} heads, got {kv_heads!r}"
        )
    return ModuleSpec(
        kind=ModuleKind.LLM,
        layers=cfg.positive("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=None if head_dim * heads == hidden else head_dim,
        ffn=cfg.positive("intermediate_size"),
        mlp="swiglu",
        vocab=cfg.positive("vocab_size"),
        hf=hf,
    )


def moe_module(cfg: HFConfig, dense: ModuleSpec) -> ModuleSpec:
    """A decoder read by `decoder_module` with the Mixture-of-Experts MLPs its config names (Qwen3-MoE's and
    Qwen3-VL-MoE's text config): `num_experts` experts of `moe_intermediate_size` each, `num_experts_per_tok` of
    them per token, in every block but `mlp_only_layers` and those `decoder_sparse_step` skips (block i has experts
    when (i + 1) % step == 0), which keep one MLP of `intermediate_size`; the router's auxiliary loss weighs
    `router_aux_loss_coef` where the config asks for it (`output_router_logits`), as the HF model's forward adds it."""
    # config.json holds `num_local_experts` where transformers wrote it (its attribute_map), else num_experts
    key = "num_local_experts" if "num_local_experts" in cfg.values else "num_experts"
    experts = cfg.get(key, 0)
    if not isinstance(experts, int) or isinstance(experts, bool) or experts < 0:
        raise SpecError(cfg.source, cfg.field(key), f"expected a non-negative integer, got {experts!r}")
    step = cfg.positive("decoder_sparse_step")
    only = set(cfg.indices("mlp_only_layers", dense.layers)) if cfg.get("mlp_only_layers") else set()
    dense_blocks = tuple(i for i in range(dense.layers) if i in only or (i + 1) % step)
    if experts == 0 or len(dense_blocks) == dense.layers:  # HF builds no sparse block
        return dense
    top_k = cfg.positive("num_experts_per_tok")
    if top_k > experts:
        raise SpecError(cfg.source, cfg.field("num_experts_per_tok"), f"{top_k} is more than the {experts} experts")
    coef = cfg.get("router_aux_loss_coef", 0.0) if cfg.get("output_router_logits", False) is True else 0.0
    if not isinstance(coef, (int, float)) or isinstance(coef, bool) or coef < 0:
        raise SpecError(cfg.source, cfg.field("router_aux_loss_coef"), f"expected a number >= 0, got {coef!r}")
    update = dict(
        experts=experts,
        top_k=top_k,
        expert_ffn=cfg.positive("moe_intermediate_size"),
        dense_blocks=dense_blocks or None,
        aux_loss_coef=float(coef),
    )
    return ModuleSpec.model_validate({**dense.model_dump(exclude_unset=True), **update})


def feature_layers(layers: int, feature_layer: Any, source: str) -> int:
    """Vision layers a LLaVA model runs: hidden_states[k] is the output of k layers (negative k from the end,
    hidden_states holding layers + 1 entries); a list of k takes the deepest."""
    picks = feature_layer if isinstance(feature_layer, list) else [feature_layer]
    need = 0
    for k in picks:
        if not isinstance(k, int) or not -(layers + 1) <= k <= layers:
            raise SpecError(source, "vision_feature_layer", f"expected layer indices within {layers} layers, got {k!r}")
        need = max(need, k if k >= 0 else layers + 1 + k)
    if need == 0:
        raise SpecError(source, "vision_feature_layer", "selects the embeddings only: at least one layer must run")
    return need


def select_strategy(vision_type: str) -> str:
    """orch moves one LLM token per patch: CLIP's class token is dropped ("default"), SigLIP has none ("full")."""
    return "default" if vision_type == "clip_vision_model" else "full"


def default_feature_layer(vision_type: str) -> int:
    """A bare tower's features when a composed spec names none: LLaVA's penultimate CLIP layer, SigLIP's last."""
    return -2 if vision_type == "clip_vision_model" else -1


def vision_module(cfg: HFConfig, top: HFConfig, hf: HFPart) -> ModuleSpec:
    kind = cfg.expect_type(VISION_TYPES)
    strategy = top.get("vision_feature_select_strategy")
    wanted = select_strategy(kind)
    if strategy != wanted:
        raise SpecError(
            top.source,
            "vision_feature_select_strategy",
            f"'{strategy}' with {kind}: orch supports '{wanted}' (one LLM token per patch)",
        )
    return tower_module(cfg, top.get("vision_feature_layer"), top.source, hf)


def tower_module(cfg: HFConfig, feature_layer: Any, source: str, hf: HFPart) -> ModuleSpec:
    """A CLIP or SigLIP tower running up to `feature_layer` (LLaVA's vision_feature_layer)."""
    cfg.expect_type(VISION_TYPES)
    image, patch = cfg.positive("image_size"), cfg.positive("patch_size")
    if image % patch:
        raise SpecError(cfg.source, cfg.field("patch_size"), f"{patch} does not divide image_size {image}")
    return ModuleSpec(
        kind=ModuleKind.ENCODER,
        layers=feature_layers(cfg.positive("num_hidden_layers"), feature_layer, source),
        hidden=cfg.positive("hidden_size"),
        heads=cfg.positive("num_attention_heads"),
        ffn=cfg.positive("intermediate_size"),
        mlp="gelu",
        feeds="llm",
        modality=Modality.VISION,
        input_dim=cfg.positive("num_channels") * patch * patch,
        image_tokens=(image // patch) ** 2,
        hf=hf,
    )


def audio_module(cfg: HFConfig, hf: HFPart, downsample: int = 2) -> ModuleSpec:
    """A Whisper-style encoder: Qwen2-Audio's (its average pool merges 2 tokens) or a bare Whisper encoder
    (orch's projector merges `downsample`)."""
    cfg.expect_type((*AUDIO_TYPES, "whisper"))
    clip = cfg.positive("max_source_positions")
    if clip % downsample:
        raise SpecError(cfg.source, "downsample", f"{downsample} does not divide a clip's {clip} encoder tokens")
    return ModuleSpec(
        kind=ModuleKind.ENCODER,
        layers=cfg.positive("encoder_layers"),
        hidden=cfg.positive("d_model"),
        heads=cfg.positive("encoder_attention_heads"),
        ffn=cfg.positive("encoder_ffn_dim"),
        mlp="gelu",
        feeds="llm",
        modality=Modality.AUDIO,
        input_dim=cfg.positive("num_mel_bins"),
        downsample=downsample,
        clip_tokens=clip,
        hf=hf,
    )


def ties_embeddings(raw: dict[str, Any]) -> bool:
    """Whether the language model's head is its input embedding: `tie_word_embeddings` at the top or in
    text_config (transformers reads one or the other by family; either true keeps the LLM on one stage)."""
    text = raw.get("text_config")
    return bool(raw.get("tie_word_embeddings")) or (isinstance(text, dict) and bool(text.get("tie_word_embeddings")))


def describe(model: ModelSpec) -> list[str]:
    """One line per module of what was derived from config.json (printed by `orch plan`)."""
    lines = []
    for name, m in model.modules.items():
        if m.item_attention:
            lines.append(f"{name}: {describe_item_tower(m)}")
            continue
        what = f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads"
        if m.num_kv_heads != m.heads:
            what += f" ({m.num_kv_heads} KV)"
        if m.head_dim is not None:
            what += f" of width {m.head_dim}"
        what += f", ffn {m.ffn}"
        if m.experts > 1:
            dense = f", blocks {list(m.dense_blocks)} dense" if m.dense_blocks else ""
            aux = f", router aux loss x {m.aux_loss_coef:g}" if m.aux_loss_coef else ""
            what += f", {m.experts} experts of ffn {m.expert_width} ({m.top_k} a token{dense}{aux})"
        if m.vocab:
            what += f", vocab {m.vocab}"
        if m.tied_embeddings:
            what += ", tied embedding and head (one pipeline stage)"
        if m.image_tokens:
            what += f", {m.image_tokens} tokens per image ({m.input_dim} values per patch)"
        elif m.kind == ModuleKind.ENCODER:
            what += f", {m.input_dim} mel bins, {m.downsample} tokens per LLM token"
            if m.clip_tokens:
                what += f", clips of {m.clip_tokens} tokens"
        lines.append(f"{name}: {what}")
    return lines


def describe_item_tower(m: ModuleSpec) -> str:
    """A native-resolution tower (item_attention): its blocks' attention, width, merge and patch rows."""
    if m.window_tokens is None:
        what = f"{m.layers} blocks (full attention within each image or frame)"
    else:
        full = m.full_attention_layers
        what = f"{m.layers} blocks ({full} full-attention, the rest in {m.window_tokens}-patch windows)"
    what += f", width {m.hidden}, {m.heads} heads, ffn {m.ffn} {m.mlp_kind}"
    side = math.isqrt(m.downsample)
    merge = f"{side}x{side}" if side * side == m.downsample else str(m.downsample)
    what += f", merge {merge} → {m.downsample} patches per LLM token, {m.input_dim} values per patch"
    if m.deepstack_blocks:
        blocks = ", ".join(str(b) for b in m.deepstack_blocks)
        n = len(m.deepstack_blocks)
        what += f", deepstack: blocks {blocks} also feed the LLM's first {n} layers (a merger each)"
    if m.max_tp is not None:
        what += f", TP at most {m.max_tp}"
    return what
