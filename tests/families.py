"""Every model family the registry lists (runtime/models/registry.py, FAMILIES), as the CLI tests build one: a tiny
model from its config, given to `orch plan --model` as a user would (a model directory; a bare tower or
language model in a composed spec of its own), and the data spec and plan steps the CLI tests share."""

from collections.abc import Callable
from pathlib import Path

import yaml
from hf_models import make_llava, make_parts, make_qwen2_audio, make_whisper, save
from internvl_models import make_internvl
from qwen3_omni_models import make_qwen3_omni
from qwen_omni_models import make_qwen_omni
from qwen_vl_models import make_qwen_vl

# Text, image and speech samples (`data_for`: those a model's modules take), sized for every family's tiny model: whole LLaVA images of 16 patches, Qwen-VL grids of 2x2 merge windows, clips of
# 20 Whisper tokens.
DATA = {
    "global_batch": 4,
    "seq_len": 80,
    "tasks": [
        {"name": "text", "weight": 0.2, "tokens": {"llm": 30}, "max": {"llm": 60}},
        {"name": "image", "weight": 0.5, "tokens": {"vision": 24, "llm": 56}, "max": {"vision": 40, "llm": 80}},
        {"name": "asr", "weight": 0.3, "tokens": {"audio": 30, "llm": 50}, "max": {"audio": 56, "llm": 80}},
    ],
}


# An omni model's samples (Qwen-Omni's thinkers): text, an image, speech, and an image with speech (both towers in
# one sample), sized for their tiny models.
OMNI_DATA = {
    "global_batch": 6,
    "seq_len": 100,
    "tasks": [
        {"name": "text", "weight": 0.2, "tokens": {"llm": 30}, "max": {"llm": 60}},
        {"name": "image", "weight": 0.3, "tokens": {"vision": 24, "llm": 56}, "max": {"vision": 40, "llm": 80}},
        {"name": "asr", "weight": 0.2, "tokens": {"audio": 30, "llm": 50}, "max": {"audio": 56, "llm": 80}},
        {"name": "image_asr", "weight": 0.3, "tokens": {"vision": 16, "audio": 20, "llm": 60},
         "max": {"vision": 40, "audio": 40, "llm": 100}},
    ],
}  # fmt: skip


def data_for(modules) -> dict:
    """DATA's tasks whose modules the model has (a data spec may name only the model's modules)."""
    return {**DATA, "tasks": [t for t in DATA["tasks"] if set(t["tokens"]) <= set(modules)]}


# One CPU rank: what `orch launch` runs with no GPU, at the least start-up cost.
ONE_RANK = {"name": "one-cpu", "nodes": 1, "gpus_per_node": 1, "gpu": {"memory_gb": 4, "peak_tflops": 0.05},
            "links": {"intra_node_gbps": 2, "inter_node_gbps": 1}, "mfu": 0.5}  # fmt: skip


def write_yaml(path: Path, content: dict) -> Path:
    path.write_text(yaml.safe_dump(content))
    return path


def plan_of(cli, model, data, out, *extra, cluster: str = "local-cpu"):
    """`orch plan --model MODEL --data DATA --out OUT`, asserted to succeed; its result."""
    result = cli("plan", "--model", str(model), "--cluster", cluster, "--data", str(data), "--out", str(out), *extra)
    assert result.exit_code == 0, result.output
    return result


def make_decoder(directory: Path, family: str, *, seed: int = 0) -> Path:
    """A bare language model of `family` (llama, qwen2, mistral): `orch plan --model DIR` trains it on text."""
    import torch
    import transformers
    from hf_models import TEXT

    config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
              "mistral": transformers.MistralConfig}[family](**TEXT)  # fmt: skip
    torch.manual_seed(seed)
    causal = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
              "mistral": transformers.MistralForCausalLM}[family]  # fmt: skip
    save(causal(config), directory)
    return Path(directory)


def make_clip(directory: Path, *, seed: int = 0) -> Path:
    """A bare CLIP vision tower."""
    import torch
    import transformers
    from hf_models import VISION

    torch.manual_seed(seed)
    save(transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**VISION)), directory)
    return Path(directory)


def composed(root: Path, encoder: str, source: dict | str) -> Path:
    """A composed spec of one bare tower (`encoder`: vision or audio) feeding a Qwen2 LLM (root/parts/qwen2)."""
    make_parts(root / "parts")
    return write_yaml(root / f"{encoder}-qwen2.yaml", {"name": f"{encoder}-qwen2", "modules": {
        encoder: {"hf": source, "feeds": "llm", **({"downsample": 2} if encoder == "audio" else {})},
        "llm": {"hf": "parts/qwen2"}}})  # fmt: skip


def _tower(root: Path, encoder: str, folder: str, make: Callable[[Path], Path] | None, part: str | None) -> Path:
    if make is not None:
        make(root / "parts" / folder)
    return composed(root, encoder, {"path": f"parts/{folder}", "part": part} if part else f"parts/{folder}")


# model_type -> what `orch plan --model` takes for a tiny model of that family, built under a folder.
FAMILY_MODELS: dict[str, Callable[[Path], Path]] = {
    "llava": lambda root: make_llava(root / "llava", "clip", "llama"),
    "qwen2_audio": lambda root: make_qwen2_audio(root / "qwen2_audio"),
    "qwen2_vl": lambda root: make_qwen_vl(root / "qwen2_vl", "qwen2_vl"),
    "qwen2_5_vl": lambda root: make_qwen_vl(root / "qwen2_5_vl", "qwen2_5_vl"),
    "qwen3_vl": lambda root: make_qwen_vl(root / "qwen3_vl", "qwen3_vl"),
    "qwen3_vl_moe": lambda root: make_qwen_vl(root / "qwen3_vl_moe", "qwen3_vl_moe"),
    "qwen2_5_omni": lambda root: make_qwen_omni(root / "qwen2_5_omni"),
    "qwen3_omni_moe": lambda root: make_qwen3_omni(root / "qwen3_omni_moe"),
    "internvl": lambda root: make_internvl(root / "internvl"),
    "llama": lambda root: make_decoder(root / "llama", "llama"),
    "qwen2": lambda root: make_decoder(root / "qwen2", "qwen2"),
    "mistral": lambda root: make_decoder(root / "mistral", "mistral"),
    "clip_vision_model": lambda root: _tower(root, "vision", "clip", make_clip, None),
    "siglip_vision_model": lambda root: _tower(root, "vision", "siglip", None, None),  # make_parts makes it
    "whisper": lambda root: _tower(root, "audio", "whisper", make_whisper, "encoder"),
}


def data_file_fixture(spec: dict):
    """A pytest fixture `data_file`: `spec` written to the test's folder as a data spec file."""
    import pytest

    @pytest.fixture
    def data_file(tmp_path):
        return write_yaml(tmp_path / "data.yaml", spec)

    return data_file


def launch_lr0_then_export(cli, plan: Path, run: Path, out: Path, *extra: str) -> Path:
    """`orch launch PLAN --lr 0 --steps 1 --dtype float64` (a positive step-0 loss), then `orch export RUN`: `out`."""
    import json

    result = cli("launch", str(plan), "--lr", "0", "--steps", "1", "--dtype", "float64", "--workdir", str(run), *extra)
    assert result.exit_code == 0, result.output
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["loss"] > 0
    result = cli("export", str(run), "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def assert_same_weights(before: Path, after: Path) -> None:
    """Two safetensors files hold the same keys, dtypes and values, bit for bit."""
    import torch
    from safetensors.torch import load_file

    old, new = load_file(before), load_file(after)
    assert set(old) == set(new)
    for key, tensor in old.items():  # their bytes: a NaN equals itself, 0.0 is not -0.0
        same = new[key].shape == tensor.shape and new[key].dtype == tensor.dtype
        assert same and new[key].reshape(-1).view(torch.uint8).equal(tensor.reshape(-1).view(torch.uint8)), key
