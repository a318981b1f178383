"""The Qwen-VL family's config.json read by the planner (runtime/models/qwen_vl/config.py): fields against transformers
5.24's own config classes (both layouts, tiny and default sizes), the tower's attention in the spec and the cost
model, the planner never giving the tower TP or CP, and bad fields named."""

import json

import pytest

from orch.planner.errors import SpecError
from orch.planner.hf_config import describe
from orch.planner.specs import HFPart, Modality, ModelSpec, ModuleKind, ModuleSpec
from orch.runtime.models.registry import model_spec_from_dir

transformers = pytest.importorskip("transformers")

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TEXT = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=300, bos_token_id=None, eos_token_id=None)  # fmt: skip


def write(tmp_path, config, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def full_dict(config):
    """What save_pretrained writes for a transformers config: every field, sub-configs included."""
    return json.loads(config.to_json_string(use_diff=False))


def tiny_config(family, **text_extra):
    """A tiny `family` config from transformers' classes (the sizes of tests/qwen_vl_models.py)."""
    text = {**TEXT, **text_extra}
    if family == "qwen2_vl":
        vision = transformers.Qwen2VLVisionConfig(depth=4, embed_dim=32, num_heads=4, mlp_ratio=2, hidden_size=48)
        return transformers.Qwen2VLConfig(vision_config=vision.to_dict(), text_config=text)
    if family == "qwen2_5_vl":
        vision = transformers.Qwen2_5_VLVisionConfig(depth=4, hidden_size=32, intermediate_size=64, num_heads=4,
                                                     out_hidden_size=48, window_size=56, fullatt_block_indexes=[1, 3])  # fmt: skip
        return transformers.Qwen2_5_VLConfig(vision_config=vision.to_dict(), text_config=text)
    vision = transformers.Qwen3VLVisionConfig(depth=4, hidden_size=32, intermediate_size=64, num_heads=4,
                                              out_hidden_size=48, num_position_embeddings=64,
                                              deepstack_visual_indexes=[1, 2])  # fmt: skip
    return transformers.Qwen3VLConfig(vision_config=vision.to_dict(), text_config={"head_dim": 12, **text})


def default_config(family):
    return {"qwen2_vl": transformers.Qwen2VLConfig, "qwen2_5_vl": transformers.Qwen2_5_VLConfig,
            "qwen3_vl": transformers.Qwen3VLConfig}[family]()  # fmt: skip


def check_against(spec: ModelSpec, config, family: str, directory) -> None:
    """Every derived field of both modules against the transformers config object's own values."""
    v, t = config.vision_config, config.text_config
    vision, llm = spec.modules["vision"], spec.modules["llm"]
    hidden = v.embed_dim if family == "qwen2_vl" else v.hidden_size
    ffn = int(v.embed_dim * v.mlp_ratio) if family == "qwen2_vl" else v.intermediate_size
    assert (vision.kind, vision.feeds, spec.modality("vision")) == (ModuleKind.ENCODER, "llm", Modality.VISION)
    assert (vision.layers, vision.hidden, vision.heads, vision.ffn) == (v.depth, hidden, v.num_heads, ffn)
    assert vision.input_dim == v.in_channels * v.temporal_patch_size * v.patch_size**2
    assert vision.downsample == v.spatial_merge_size**2
    assert vision.mlp_kind == ("swiglu" if family == "qwen2_5_vl" else "gelu")
    assert vision.item_attention and vision.windowed and vision.image_tokens is None
    assert vision.max_tp is None and vision.refuses("tp", 2) is None and vision.refuses("cp", 2) is not None
    assert vision.projector_hidden == hidden * v.spatial_merge_size**2
    if family == "qwen2_5_vl":
        side = v.window_size // v.spatial_merge_size // v.patch_size  # HF's vit_merger_window_size
        assert vision.window_tokens == (side * v.spatial_merge_size) ** 2
        assert vision.full_attention_blocks == tuple(v.fullatt_block_indexes)
        assert vision.full_attention_layers == len(v.fullatt_block_indexes)
    else:
        assert vision.window_tokens is None and vision.full_attention_layers == v.depth
    deepstack = tuple(v.deepstack_visual_indexes) if family == "qwen3_vl" else None
    assert vision.deepstack_blocks == deepstack
    assert (llm.kind, llm.layers, llm.hidden, llm.heads, llm.num_kv_heads, llm.ffn, llm.vocab) == (
        ModuleKind.LLM, t.num_hidden_layers, t.hidden_size, t.num_attention_heads, t.num_key_value_heads,
        t.intermediate_size, t.vocab_size,
    )  # fmt: skip
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    assert llm.head_width == head_dim and llm.mlp_kind == "swiglu"
    assert vision.hf == HFPart(path=str(directory.resolve()), part="vision")
    assert llm.hf == HFPart(path=str(directory.resolve()), part="text")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("size", ["tiny", "default"])
def test_saved_config_gives_the_modules_of_the_config_object(tmp_path, family, size):
    config = tiny_config(family) if size == "tiny" else default_config(family)
    directory = tmp_path / family
    config.save_pretrained(directory)
    check_against(model_spec_from_dir(directory), config, family, directory)


def test_qwen2_5_vl_7b_tower_windows_of_64_patches(tmp_path):
    """The real tower's shape (Qwen2.5-VL-7B): 112 px windows of 14 px patches merged 2x2 -> 8 x 8 patches."""
    vision = transformers.Qwen2_5_VLVisionConfig(hidden_size=1280, intermediate_size=3420, out_hidden_size=3584)
    config = transformers.Qwen2_5_VLConfig(vision_config=vision.to_dict(), text_config={"hidden_size": 3584,
                                           "intermediate_size": 18944, "num_hidden_layers": 28,
                                           "num_attention_heads": 28, "num_key_value_heads": 4})  # fmt: skip
    config.save_pretrained(tmp_path / "m")
    spec = model_spec_from_dir(tmp_path / "m")
    check_against(spec, config, "qwen2_5_vl", tmp_path / "m")
    v = spec.modules["vision"]
    assert (v.window_tokens, v.full_attention_blocks, v.input_dim, v.downsample) == (64, (7, 15, 23, 31), 1176, 4)
    assert describe(spec)[0] == (
        "vision: 32 blocks (4 full-attention, the rest in 64-patch windows), width 1280, 16 heads, ffn 3420 swiglu, "
        "merge 2x2 → 4 patches per LLM token, 1176 values per patch"
    )


def test_qwen3_vl_patch_16_and_deepstack_are_described(tmp_path):
    config = default_config("qwen3_vl")
    config.save_pretrained(tmp_path / "m")
    lines = describe(model_spec_from_dir(tmp_path / "m"))
    assert lines[0] == (
        "vision: 27 blocks (full attention within each image or frame), width 1152, 16 heads, ffn 4304 gelu, "
        "merge 2x2 → 4 patches per LLM token, 1536 values per patch, deepstack: blocks 8, 16, 24 also feed the "
        "LLM's first 3 layers (a merger each)"
    )
    assert lines[1] == "llm: 32 layers, hidden 4096, 32 heads, ffn 22016, vocab 151936"


def test_qwen3_vl_heads_wider_than_hidden_over_heads(tmp_path):
    """Qwen3-VL-4B's text model: 32 heads of 128 at width 2560 (q and o are 4096 wide)."""
    config = tiny_config("qwen3_vl", hidden_size=2560, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    config.save_pretrained(tmp_path / "m")
    spec = model_spec_from_dir(tmp_path / "m")
    llm = spec.modules["llm"]
    assert (llm.head_dim, llm.head_width, llm.attention_width) == (128, 128, 4096)
    assert describe(spec)[1] == "llm: 4 layers, hidden 2560, 32 heads (8 KV) of width 128, ffn 96, vocab 300"
    from orch.planner.costs import forward_coefficients, layer_params

    h = 2560
    assert layer_params(llm) == h * 4096 * 2 + 2 * h * 8 * 128 + 3 * h * 96 + 2 * h
    assert forward_coefficients(llm, llm).per_pair == 0.5 * 4 * 4096 * 4
    # equal widths record no head_dim (the plan JSON of every other model is unchanged)
    assert model_spec_from_dir(write(tmp_path, {"model_type": "qwen3_vl"}, "d")).modules["llm"].head_dim is None


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_hub_config_with_the_text_fields_at_the_top_level(tmp_path, family):
    """Hub configs of Qwen2-VL and Qwen2.5-VL: no text_config, the text model's fields at the top (an older
    vision model_type and field names transformers ignores included), read as transformers reads them."""
    vision = {"model_type": family, "depth": 4, "num_heads": 4, "in_chans": 3, "spatial_patch_size": 14}
    vision |= {"embed_dim": 32, "hidden_size": 64} if family == "qwen2_vl" else {
        "hidden_size": 32, "intermediate_size": 64, "out_hidden_size": 64, "fullatt_block_indexes": [3]}  # fmt: skip
    flat = {"model_type": family, "architectures": ["X"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "bos_token_id": None, "eos_token_id": None,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}, "vision_config": vision}  # fmt: skip
    d = write(tmp_path, flat)
    config = getattr(transformers, "Qwen2VLConfig" if family == "qwen2_vl" else "Qwen2_5_VLConfig").from_dict(flat)
    spec = model_spec_from_dir(d)
    check_against(spec, config, family, d)
    assert spec.modules["llm"].hidden == 64 and spec.modules["llm"].layers == 3
    # a text_config wins over top-level fields, as in transformers
    both = write(
        tmp_path,
        {**flat, "text_config": {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}},
        "both",
    )
    assert model_spec_from_dir(both).modules["llm"].hidden == 96


def test_qwen3_vl_reads_no_top_level_text_fields(tmp_path):
    """Qwen3VLConfig takes its text model from text_config only (a top-level hidden_size is not the LLM's)."""
    flat = {"model_type": "qwen3_vl", "hidden_size": 64}
    config = transformers.Qwen3VLConfig.from_dict(flat)
    assert model_spec_from_dir(write(tmp_path, flat)).modules["llm"].hidden == config.text_config.hidden_size


def test_defaults_match_transformers(tmp_path):
    """A config.json naming only its model_type (or sub-configs naming only theirs) derives what the full dump of
    transformers' config derives."""
    for family in FAMILIES:
        full = model_spec_from_dir(write(tmp_path, full_dict(default_config(family)), f"{family}-full"))
        for i, short in enumerate(
            (
                {"model_type": family},
                {"model_type": family, "vision_config": {}, "text_config": {}},
                {"model_type": family, "vision_config": {"model_type": f"{family}_vision"},
                 "text_config": {"model_type": f"{family}_text"}},
            )
        ):  # fmt: skip
            got = model_spec_from_dir(write(tmp_path, short, f"{family}-short{i}"))
            strip = {n: m.model_copy(update={"hf": None}) for n, m in got.modules.items()}
            assert strip == {n: m.model_copy(update={"hf": None}) for n, m in full.modules.items()}, (family, short)


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        ({"model_type": "qwen2_5_vl", "vision_config": {"depth": 0}}, "vision_config.depth",
         "expected a positive integer, got 0"),
        ({"model_type": "qwen2_vl", "vision_config": {"mlp_ratio": "four"}}, "vision_config.mlp_ratio",
         "expected a positive number, got 'four'"),
        ({"model_type": "qwen2_5_vl", "vision_config": {"fullatt_block_indexes": [7, 40]}},
         "vision_config.fullatt_block_indexes", "expected a list of block indices 0..31, got [7, 40]"),
        ({"model_type": "qwen3_vl", "vision_config": {"deepstack_visual_indexes": "8"}},
         "vision_config.deepstack_visual_indexes", "expected a list of block indices 0..26"),
        ({"model_type": "qwen2_5_vl", "vision_config": {"window_size": 20}}, "vision_config.window_size",
         "20 px is less than one merged token (2 x 14 px)"),
        ({"model_type": "qwen2_5_vl", "vision_config": {"num_heads": 5, "hidden_size": 32}}, "vision_config.num_heads",
         "5 heads do not divide the tower's width 32"),
        ({"model_type": "qwen2_5_vl", "vision_config": {"model_type": "siglip_vision_model"}},
         "vision_config.model_type", "'siglip_vision_model' is not supported; expected qwen2_5_vl_vision"),
        ({"model_type": "qwen2_5_vl", "vision_config": [1]}, "vision_config", "expected a mapping, got list"),
        ({"model_type": "qwen3_vl", "text_config": {"head_dim": -1}}, "text_config.head_dim",
         "expected a positive integer, got -1"),
        ({"model_type": "qwen2_5_vl", "num_key_value_heads": 3}, "num_key_value_heads",
         "expected a divisor of 64 heads, got 3"),
        ({"model_type": "qwen2_vl", "text_config": {"vocab_size": None, "hidden_size": "x"}}, "text_config.hidden_size",
         "expected a positive integer, got 'x'"),
    ],
)  # fmt: skip
def test_bad_field_names_file_and_field(tmp_path, config, field, message):
    d = write(tmp_path, config)
    with pytest.raises(SpecError) as err:
        model_spec_from_dir(d)
    assert err.value.source == str(d / "config.json")
    assert err.value.field == field
    assert message in err.value.message


def tower(**extra) -> ModuleSpec:
    """The tiny Qwen2.5-VL tower's spec: 4 blocks of width 32 (blocks 1 and 3 full-attention, 16-patch windows)."""
    fields = dict(kind="encoder", layers=4, hidden=32, heads=4, ffn=64, mlp="swiglu", feeds="llm", input_dim=1176,
                  downsample=4, item_attention=True, window_tokens=16, full_attention_blocks=(1, 3),
                  projector_hidden=128, hf={"path": "m", "part": "vision"})  # fmt: skip
    return ModuleSpec.model_validate({**fields, **extra})


def test_vision_flops_window_blocks_linear_full_blocks_quadratic():
    """A Qwen2.5-VL tower's forward FLOPs by hand for samples of 256 patches (2 FLOPs per multiply-add)."""
    from orch.planner.costs import forward_coefficients, forward_flops, workload
    from orch.planner.specs import DataSpec

    llm = ModuleSpec(kind="llm", layers=2, hidden=48, heads=4, ffn=96, vocab=300)
    model = ModelSpec(name="q", modules={"vision": tower(), "llm": llm})
    data = DataSpec(global_batch=8, seq_len=512, tasks=[{"weight": 1, "tokens": {"vision": 256, "llm": 100}}])
    h, n, batch = 32, 256, 8
    block = 4 * h * h + 3 * h * 64 + 2 * h  # fused qkv + proj, SwiGLU MLP, two norms: 10304 weights
    assert block == 10304
    weights = 2 * block * 4  # every block's weights once per patch
    window = 4 * h * 16 * 2  # QKᵀ and PV inside a 16-patch window, in the 2 windowed blocks
    stem = 2 * 1176 * h  # the patch embedding (a Conv3d of 3 x 2 x 14 x 14 values)
    merger = 2 * (128 * 128 + 128 * 48) / 4  # LayerNorm'd 4 patches (128 values) -> 128 -> 48, per patch
    per_pair = 4 * h * 2  # QKᵀ and PV over the whole image, in the 2 full-attention blocks only
    assert (weights, window, stem, merger, per_pair) == (82432, 4096, 75264, 11264, 256)
    flops = forward_coefficients(model.modules["vision"], llm)
    assert flops.per_token == weights + window + stem + merger == 173056
    assert flops.per_pair == per_pair
    w = workload(model, data, "vision")
    assert forward_flops(model.modules["vision"], llm, w) == batch * (173056 * n + 256 * n * n)
    # without windows (Qwen2-VL, Qwen3-VL) every block is priced per pair and none per window
    full = forward_coefficients(tower(window_tokens=None, full_attention_blocks=None), llm)
    assert (full.per_token, full.per_pair) == (weights + stem + merger, 4 * h * 4)
    # Qwen3-VL's deepstack: one more merger per deepstack block
    deep = forward_coefficients(tower(window_tokens=None, full_attention_blocks=None, deepstack_blocks=(1, 2)), llm)
    assert deep.per_token == weights + stem + 3 * merger


def test_spec_fields_are_checked_and_old_specs_unchanged():
    assert tower().windowed and tower().round_length(11) == 12 and tower().round_length(1) == 4  # whole merge groups
    for bad, message in [
        ({"full_attention_blocks": (4,)}, "full_attention_blocks: 4 is not a block of 4"),
        ({"window_tokens": None}, "full_attention_blocks needs window_tokens"),
        ({"item_attention": False, "full_attention_blocks": None}, "window_tokens needs item_attention"),
        ({"image_tokens": 16}, "no image_tokens or clip_tokens"),
        ({"hf": None}, "only a module built from a Hugging Face directory"),
        ({"deepstack_blocks": (1, 1)}, "deepstack_blocks: a block is named twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            tower(**bad)
    with pytest.raises(ValueError, match="describes an encoder"):
        ModuleSpec(kind="llm", layers=2, hidden=48, heads=4, ffn=96, vocab=300, max_tp=2, item_attention=True)
    with pytest.raises(ValueError, match="only a module built from a Hugging Face directory"):
        ModuleSpec(kind="llm", layers=2, hidden=48, heads=4, ffn=96, vocab=300, head_dim=16)
    plain = ModuleSpec(kind="encoder", layers=2, hidden=32, heads=4, ffn=64, feeds="llm")
    dumped = plain.model_dump(exclude_none=True)
    assert not {"item_attention", "window_tokens", "max_tp", "head_dim"} & {k for k, v in dumped.items() if v}
    assert plain.splits_over(4) and not plain.windowed and plain.head_width == 8


def test_planner_may_give_the_tower_tp_never_cp(tmp_path):
    """On a 2 x 2 cluster where TP 2 splits the tower's heads and FFN: the tower's candidates include TP 2 (its
    fused qkv is sharded by heads) and never CP, and a homogeneous option (tower and LLM on one grid) may have
    the LLM at TP 2; a tower whose max_tp is 1 gets TP 1 only, and homogeneous options then the LLM's TP 1."""
    from orch.planner.candidates import SearchInput, homogeneous_options, module_candidates
    from orch.planner.loading import load_cluster
    from orch.planner.plan import Placement
    from orch.planner.specs import DataSpec

    tiny_config("qwen2_5_vl").save_pretrained(tmp_path / "m")
    model = model_spec_from_dir(tmp_path / "m")
    data = DataSpec(global_batch=8, seq_len=256, tasks=[
        {"weight": 0.5, "tokens": {"vision": 256, "llm": 200}, "max": {"vision": 1024, "llm": 256}},
        {"weight": 0.5, "tokens": {"llm": 100}}])  # fmt: skip
    assert model.modules["vision"].heads % 2 == 0 and model.modules["vision"].ffn % 2 == 0
    bounded = model.model_copy(
        update={"modules": {**model.modules, "vision": model.modules["vision"].model_copy(update={"max_tp": 1})}}
    )
    for spec, tower_tps in ((model, {1, 2}), (bounded, {1})):
        inp = SearchInput(spec, load_cluster("local-cpu"), data)
        seen: set[int] = set()
        for gpus in (1, 2, 4):
            for placement in (Placement.COLOCATED, Placement.DISAGGREGATED):
                for c in module_candidates(inp, "vision", gpus, placement, prune=False):
                    assert c.layout.cp == 1
                    seen.add(c.layout.tp)
        assert seen == tower_tps
        options = homogeneous_options(inp)
        assert options and {o.llm.layout.tp for o in options} == tower_tps
