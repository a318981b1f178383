"""config.json -> ModelSpec without transformers: fields, defaults (checked against transformers 5.24) and bad input."""

import json

import pytest

from orch.planner.errors import SpecError
from orch.planner.specs import Modality, ModuleKind
from orch.runtime.models.registry import model_spec_from_dir


def write(tmp_path, config, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def full_dict(config):
    """What save_pretrained writes for a transformers config: every field, sub-configs included."""
    return json.loads(config.to_json_string(use_diff=False))


def test_llava_fields(tmp_path):
    d = write(
        tmp_path,
        {
            "model_type": "llava",
            "vision_feature_layer": -2,
            "vision_feature_select_strategy": "default",
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 6,
                "num_attention_heads": 4,
                "image_size": 56,
                "patch_size": 14,
            },
            "text_config": {
                "model_type": "qwen2",
                "hidden_size": 96,
                "intermediate_size": 192,
                "num_hidden_layers": 3,
                "num_attention_heads": 6,
                "num_key_value_heads": 2,
                "vocab_size": 1000,
            },
        },
    )
    spec = model_spec_from_dir(d)
    vision, llm = spec.modules["vision"], spec.modules["llm"]
    assert (vision.kind, vision.layers, vision.hidden, vision.heads, vision.ffn) == (ModuleKind.ENCODER, 5, 64, 4, 128)
    assert (vision.input_dim, vision.image_tokens, vision.mlp_kind) == (3 * 14 * 14, 16, "gelu")
    assert spec.modality("vision") == Modality.VISION
    assert (llm.layers, llm.hidden, llm.heads, llm.num_kv_heads, llm.ffn, llm.vocab) == (3, 96, 6, 2, 192, 1000)
    assert llm.hf is not None and llm.hf.part == "text" and vision.hf is not None and vision.hf.part == "vision"
    assert llm.hf.path == str(d.resolve())


def test_feature_layer_list_runs_the_deepest(tmp_path):
    base = {"model_type": "llava", "vision_config": {"num_hidden_layers": 10}}
    assert model_spec_from_dir(write(tmp_path, {**base, "vision_feature_layer": [2, -3]})).modules["vision"].layers == 8
    assert model_spec_from_dir(write(tmp_path, {**base, "vision_feature_layer": 4}, "b")).modules["vision"].layers == 4


def test_defaults_match_transformers(tmp_path):
    """A config.json naming only its model_type derives what the full dump of transformers' config derives."""
    transformers = pytest.importorskip("transformers")
    cases = {
        "llava": transformers.LlavaConfig(),
        "qwen2_audio": transformers.Qwen2AudioConfig(),
        "llama": transformers.LlamaConfig(),
        "qwen2": transformers.Qwen2Config(),
        "mistral": transformers.MistralConfig(),
    }
    for model_type, config in cases.items():
        short = model_spec_from_dir(write(tmp_path, {"model_type": model_type}, f"{model_type}-short"))
        full = model_spec_from_dir(write(tmp_path, full_dict(config), f"{model_type}-full"))
        strip = {n: m.model_copy(update={"hf": None}) for n, m in short.modules.items()}
        assert strip == {n: m.model_copy(update={"hf": None}) for n, m in full.modules.items()}, model_type
    # and a sub-config naming only its model_type takes that family's defaults
    siglip = transformers.SiglipVisionConfig()
    short = model_spec_from_dir(
        write(
            tmp_path,
            {
                "model_type": "llava",
                "vision_feature_select_strategy": "full",
                "vision_config": {"model_type": "siglip_vision_model"},
            },
            "siglip-short",
        )
    )
    full = model_spec_from_dir(
        write(
            tmp_path,
            full_dict(transformers.LlavaConfig(vision_config=siglip, vision_feature_select_strategy="full")),
            "siglip-full",
        )
    )
    assert short.modules["vision"].model_copy(update={"hf": None}) == full.modules["vision"].model_copy(
        update={"hf": None}
    )


def test_qwen2_audio(tmp_path):
    spec = model_spec_from_dir(write(tmp_path, {"model_type": "qwen2_audio"}))
    audio = spec.modules["audio"]
    assert (audio.layers, audio.hidden, audio.heads, audio.ffn, audio.input_dim, audio.downsample) == (
        32, 1280, 20, 5120, 128, 2,
    )  # fmt: skip
    assert spec.modality("audio") == Modality.AUDIO


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        ({"model_type": "gpt2"}, "model_type", "'gpt2' is not supported; expected one of llava"),
        ({"model_type": "llava", "text_config": {"model_type": "gemma"}}, "text_config.model_type", "'gemma'"),
        ({"model_type": "llava", "vision_feature_select_strategy": "full"}, "vision_feature_select_strategy",
         "orch supports 'default'"),
        ({"model_type": "llama", "hidden_size": "big"}, "hidden_size", "expected a positive integer, got 'big'"),
        ({"model_type": "llava", "vision_config": {"image_size": 30, "patch_size": 14}}, "vision_config.patch_size",
         "does not divide image_size 30"),
        ({"model_type": "llava", "vision_feature_layer": 99}, "vision_feature_layer", "within 24 layers"),
    ],
)  # fmt: skip
def test_bad_config_names_file_and_field(tmp_path, config, field, message):
    d = write(tmp_path, config)
    with pytest.raises(SpecError) as err:
        model_spec_from_dir(d)
    assert err.value.source == str(d / "config.json")
    assert err.value.field == field
    assert message in err.value.message


def test_directory_without_config(tmp_path):
    with pytest.raises(SpecError, match="needs config.json"):
        model_spec_from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        model_spec_from_dir(tmp_path)


def test_composed_whisper_encoder_defaults_and_part(tmp_path):
    transformers = pytest.importorskip("transformers")
    import yaml

    from orch.runtime.models.registry import load_model

    write(tmp_path, {"model_type": "whisper"}, "short")
    write(tmp_path, full_dict(transformers.WhisperConfig()), "full")
    write(tmp_path, {"model_type": "llama"}, "lm")
    specs = {}
    for name in ("short", "full"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "modules": {
            "audio": {"hf": {"path": name, "part": "encoder"}, "feeds": "llm", "downsample": 4},
            "llm": {"hf": "lm"}}}))  # fmt: skip
        specs[name] = load_model(str(path)).modules["audio"].model_copy(update={"hf": None})
    assert specs["short"] == specs["full"]
    audio = specs["short"]
    assert (audio.hidden, audio.layers, audio.input_dim, audio.clip_tokens, audio.downsample) == (384, 4, 80, 1500, 4)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"name": "b", "modules": {"audio": {"hf": "short", "feeds": "llm"}, "llm": {"hf": "lm"}}})
    )
    with pytest.raises(SpecError, match="give part: encoder") as err:
        load_model(str(bad))
    assert err.value.field == "modules.audio.hf.part"
