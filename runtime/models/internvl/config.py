"""InternVL's config.json (`model_type: internvl`, transformers' InternVLConfig) read into its modules without
torch: module `vision`, the InternViT tower up to `vision_feature_layer` with pixel shuffle and the projector,
and module `llm`, its Qwen2 or Llama decoder (planner/hf_config.py's reader).

The tower runs fixed tiles of `image_size` pixels a side: one row per patch of `num_channels x patch²` values,
`(image_size / patch)²` rows a tile (`image_tokens`: attention stays inside a tile, the tower adds its class token
per tile), and pixel shuffle merges `(1 / downsample_ratio)²` patches into one LLM token (`downsample`). An image
is one or more tiles (media.py); the LLM sees `<img>` + its tiles' tokens + `</img>`.

A field absent takes transformers 5.24's class default (`VISION_DEFAULTS`, `INTERNVL_DEFAULTS`;
tests/unit/test_internvl.py checks them against it).
"""

from __future__ import annotations

from typing import Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, decoder_module
from orch.planner.specs import HFPart, Modality, ModuleKind, ModuleSpec

TEXT_TYPES = ("qwen2", "llama")
VISION_DEFAULTS = dict(
    model_type="internvl_vision", hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
    intermediate_size=4096, image_size=448, patch_size=14, num_channels=3, use_qk_norm=False,
    use_mean_pooling=True,
)  # fmt: skip
TEXT_DEFAULTS = dict(model_type="qwen2")  # a named text_config takes its own type's defaults
INTERNVL_DEFAULTS = dict(
    downsample_ratio=0.5, vision_feature_layer=-1, vision_feature_select_strategy="default",
    tie_word_embeddings=True,
)  # fmt: skip


def _side(cfg: HFConfig, name: str) -> int:
    """A square size (image_size, patch_size): an int, or [h, w] with h == w as transformers writes it."""
    value = cfg.values.get(name)
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(cfg.source, cfg.field(name), f"expected a positive integer (a square side), got {value!r}")
    return value


def merge_of(top: HFConfig) -> int:
    """Patches a side that pixel shuffle merges into one token: 1 / downsample_ratio (0.5 -> 2)."""
    ratio = top.get("downsample_ratio")
    merge = round(1 / ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0 else 0
    if merge < 1 or abs(merge * ratio - 1) > 1e-9:
        raise SpecError(top.source, "downsample_ratio", f"expected 1 / n (0.5, 0.25), got {ratio!r}")
    return merge


def tile_patches(vision: HFConfig) -> tuple[int, int]:
    """(patches a tile's side, the patch's side) of the tower."""
    image, patch = _side(vision, "image_size"), _side(vision, "patch_size")
    if image % patch:
        raise SpecError(vision.source, vision.field("patch_size"), f"{patch} does not divide image_size {image}")
    return image // patch, patch


def feature_blocks(layers: int, feature_layer: Any, source: str) -> int:
    """Blocks the tower runs for `vision_feature_layer` (HF's hidden_states[k]: k blocks, negative from the end)."""
    if not isinstance(feature_layer, int) or isinstance(feature_layer, bool):
        raise SpecError(source, "vision_feature_layer", f"expected one layer index, got {feature_layer!r}")
    if not -(layers + 1) <= feature_layer <= layers:
        raise SpecError(source, "vision_feature_layer", f"expected a layer within {layers} layers, got {feature_layer}")
    run = feature_layer if feature_layer >= 0 else layers + 1 + feature_layer
    if run == 0:
        raise SpecError(source, "vision_feature_layer", "selects the embeddings only: at least one layer must run")
    return run


def vision_module(vision: HFConfig, top: HFConfig, hf: HFPart) -> ModuleSpec:
    """The tower up to its feature layer, over tiles, with pixel shuffle and the projector."""
    vision.expect_type(("internvl_vision",))
    strategy = top.get("vision_feature_select_strategy")
    if strategy != "default":
        why = f"'{strategy}' keeps the class token, which pixel shuffle cannot take; expected 'default'"
        raise SpecError(top.source, "vision_feature_select_strategy", why)
    side, patch = tile_patches(vision)
    merge = merge_of(top)
    if side % merge:
        raise SpecError(top.source, "downsample_ratio", f"1/{merge} does not divide a tile's {side} patches a side")
    hidden, heads = vision.positive("hidden_size"), vision.positive("num_attention_heads")
    if hidden % heads:
        raise SpecError(vision.source, vision.field("num_attention_heads"), f"{heads} heads do not divide {hidden}")
    return ModuleSpec(
        kind=ModuleKind.ENCODER,
        layers=feature_blocks(vision.positive("num_hidden_layers"), top.get("vision_feature_layer"), top.source),
        hidden=hidden,
        heads=heads,
        ffn=vision.positive("intermediate_size"),
        mlp="gelu",
        feeds="llm",
        modality=Modality.VISION,
        input_dim=vision.positive("num_channels") * patch * patch,
        image_tokens=side * side,
        downsample=merge * merge,
        hf=hf,
    )


def read_internvl(top: HFConfig, path: str) -> dict[str, ModuleSpec]:
    """config.json of an InternVL model -> its `vision` and `llm` modules (family.py `InternVL.read`)."""
    top = top.with_defaults(INTERNVL_DEFAULTS)
    raw = top.values.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise SpecError(top.source, "vision_config", f"expected a mapping, got {type(raw).__name__}")
    vision_cfg = HFConfig(top.source, "vision_config", raw, None, "internvl_vision", defaults=VISION_DEFAULTS)
    vision = vision_module(vision_cfg, top, HFPart(path=path, part="vision"))
    text = top.sub("text_config", TEXT_DEFAULTS)
    text.expect_type(TEXT_TYPES)
    llm = decoder_module(text, HFPart(path=path, part="text"))
    tied = top.get("tie_word_embeddings") is True  # InternVLConfig's own, True by default: it ties the head
    return {
        # the projector: LayerNorm, Linear(hidden x downsample -> LLM width), GELU, Linear(LLM width -> LLM width)
        "vision": vision.model_copy(update={"projector_hidden": llm.hidden}),
        "llm": llm.model_copy(update={"tied_embeddings": tied}),
    }
