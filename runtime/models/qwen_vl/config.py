"""The Qwen-VL family's config.json (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) read into its modules without torch
(docs/qwen_vl.md): module `vision`, the native-resolution tower with its patch merger, and module `llm`, the
Qwen decoder.

The tower takes images and videos of any size: a row per patch of `in_channels x temporal_patch_size x
patch_size²` values, `spatial_merge_size²` patches merged into one LLM token by the merger (LayerNorm or
RMSNorm, then a two-layer MLP from width x merge² to the LLM's width). Every block attends inside one image or
video frame only (HF's cu_seqlens); Qwen2.5-VL's blocks attend inside windows of `window_size` pixels a side
but for `fullatt_block_indexes`; Qwen3-VL adds the outputs of `deepstack_visual_indexes` blocks, each through a
merger of its own, into the LLM's first layers; Qwen3-VL-MoE's decoder has Mixture-of-Experts MLPs
(`planner/hf_config.py` `moe_module`). The tower takes TP at any degree that splits its heads and FFN
(its fused qkv projection is sharded by heads: runtime/models/hf/fused_qkv.py), and no CP (its attention stays
inside each image).

Two config layouts: transformers 5.24 writes `text_config` and `vision_config`; hub configs of Qwen2-VL and
Qwen2.5-VL often hold the text model's fields at the top level (transformers reads them there when there is no
text_config; Qwen3-VL's config does not). A field absent takes transformers 5.24's class default
(`_DEFAULTS`; tests/unit/test_qwen_vl_config.py checks them against it).
"""

from __future__ import annotations

from typing import Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, decoder_module, moe_module
from orch.planner.specs import HFPart, Modality, ModuleKind, ModuleSpec

FAMILY_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
DEEPSTACK = ("qwen3_vl", "qwen3_vl_moe")  # whose towers feed the LLM's first layers (deepstack_visual_indexes)
FLAT_TEXT = ("qwen2_vl", "qwen2_5_vl")  # whose config reads top-level text fields when it has no text_config

_QWEN2_TEXT = dict(
    vocab_size=152064,
    hidden_size=8192,
    intermediate_size=29568,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_vl_vision": dict(
        depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, in_channels=3, patch_size=14, spatial_merge_size=2,
        temporal_patch_size=2,
    ),
    "qwen2_5_vl_vision": dict(
        depth=32, hidden_size=3584, intermediate_size=3420, num_heads=16, in_channels=3, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
    ),
    "qwen3_vl_vision": dict(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[8, 16, 24],
    ),
    "qwen3_vl_moe_vision": dict(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[8, 16, 24],
    ),
    "qwen2_vl_text": _QWEN2_TEXT,
    "qwen2_5_vl_text": _QWEN2_TEXT,
    "qwen3_vl_text": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, head_dim=128,
    ),
    "qwen3_vl_moe_text": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, head_dim=128, num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
        decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001, output_router_logits=False,
    ),
}  # fmt: skip


def _sub(top: HFConfig, name: str, family: str, part: str) -> HFConfig:
    """The `name` sub-config (vision_config, text_config) of a `family` config, with its class defaults."""
    expected = f"{family}_{part}"
    raw = top.values.get(name)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError(top.source, name, f"expected a mapping, got {type(raw).__name__}")
    model_type = raw.get("model_type", expected)
    if model_type not in (expected, family):  # older checkpoints name the composite's type: transformers takes it
        raise SpecError(top.source, f"{name}.model_type", f"'{model_type}' is not supported; expected {expected}")
    return HFConfig(top.source, name, raw, defaults=_DEFAULTS[expected])


def text_config(top: HFConfig, family: str) -> HFConfig:
    """The text model's fields: `text_config`, or (Qwen2-VL, Qwen2.5-VL without one) the top level's."""
    if top.values.get("text_config") is None and family in FLAT_TEXT:
        flat = {k: v for k, v in top.values.items() if k not in ("model_type", "vision_config", "text_config")}
        return HFConfig(top.source, "", flat, defaults=_DEFAULTS[f"{family}_text"])
    return _sub(top, "text_config", family, "text")


def _ffn(cfg: HFConfig, family: str, hidden: int) -> int:
    if family != "qwen2_vl":
        return cfg.positive("intermediate_size")
    ratio = cfg.values.get("mlp_ratio")
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or int(hidden * ratio) <= 0:
        raise SpecError(cfg.source, cfg.field("mlp_ratio"), f"expected a positive number, got {ratio!r}")
    return int(hidden * ratio)  # Qwen2VLVisionBlock: int(embed_dim * mlp_ratio)


def vision_module(cfg: HFConfig, family: str, hf: HFPart) -> ModuleSpec:
    """The tower of a `family` vision_config: blocks, width, heads and MLP (Qwen2-VL: embed_dim x mlp_ratio, a
    GELU MLP; Qwen2.5-VL: intermediate_size, SwiGLU; Qwen3-VL: intermediate_size, GELU), its patch rows and merge,
    its windows (Qwen2.5-VL) and deepstack blocks (Qwen3-VL)."""
    layers = cfg.positive("depth")
    heads = cfg.positive("num_heads")
    hidden = cfg.positive("embed_dim" if family == "qwen2_vl" else "hidden_size")
    if hidden % heads:
        raise SpecError(cfg.source, cfg.field("num_heads"), f"{heads} heads do not divide the tower's width {hidden}")
    patch, merge = cfg.positive("patch_size"), cfg.positive("spatial_merge_size")
    window_tokens = full = deepstack = None
    if family == "qwen2_5_vl":
        window = cfg.positive("window_size")
        side = window // merge // patch  # merged tokens a window side (HF's vit_merger_window_size)
        if side == 0:
            too_small = f"{window} px is less than one merged token ({merge} x {patch} px)"
            raise SpecError(cfg.source, cfg.field("window_size"), too_small)
        window_tokens = (side * merge) ** 2
        full = cfg.indices("fullatt_block_indexes", layers)
    elif family in DEEPSTACK:
        deepstack = cfg.indices("deepstack_visual_indexes", layers)
    return ModuleSpec(
        kind=ModuleKind.ENCODER,
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn=_ffn(cfg, family, hidden),
        mlp="swiglu" if family == "qwen2_5_vl" else "gelu",
        feeds="llm",
        modality=Modality.VISION,
        input_dim=cfg.positive("in_channels") * cfg.positive("temporal_patch_size") * patch * patch,
        downsample=merge * merge,
        item_attention=True,
        window_tokens=window_tokens,
        full_attention_blocks=full,
        deepstack_blocks=deepstack,
        projector_hidden=hidden * merge * merge,
        hf=hf,
    )


def read_qwen_vl(top: HFConfig, path: str) -> dict[str, ModuleSpec]:
    """config.json of a Qwen-VL model -> its `vision` and `llm` modules (family.py `QwenVL.read`)."""
    family = top.expect_type(FAMILY_TYPES)
    vision = vision_module(_sub(top, "vision_config", family, "vision"), family, HFPart(path=path, part="vision"))
    text = text_config(top, family)
    llm = decoder_module(text, HFPart(path=path, part="text"))
    if family == "qwen3_vl_moe":
        llm = moe_module(text, llm)
    return {"vision": vision, "llm": llm}
