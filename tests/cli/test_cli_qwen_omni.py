"""A Qwen2.5-Omni directory (tests/qwen_omni_models.py) through the CLI: `orch plan --model DIR` says what it
derived of the thinker (both towers and the LLM) and plans them, an island per tower when asked; launched at lr 0
and exported back bit for bit, talker and token2wav as they came, into a directory
Qwen2_5OmniForConditionalGeneration loads."""

import pytest
import yaml
from families import assert_same_weights, data_file_fixture, launch_lr0_then_export, plan_of
from qwen_omni_models import make_qwen_omni

DATA = {
    "global_batch": 8,
    "seq_len": 100,
    "tasks": [
        {"name": "text", "weight": 0.2, "tokens": {"llm": 30}, "max": {"llm": 60}},
        {"name": "image", "weight": 0.3, "tokens": {"vision": 24, "llm": 56}, "max": {"vision": 40, "llm": 80}},
        {"name": "asr", "weight": 0.2, "tokens": {"audio": 30, "llm": 50}, "max": {"audio": 56, "llm": 80}},
        {"name": "image_asr", "weight": 0.3, "tokens": {"vision": 16, "audio": 20, "llm": 60},
         "max": {"vision": 40, "audio": 40, "llm": 100}},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return make_qwen_omni(tmp_path_factory.mktemp("hf") / "qwen2_5_omni")


data_file = data_file_fixture(DATA)


def test_plan_of_a_qwen_omni_directory_says_what_it_derived(cli, omni, data_file, tmp_path):
    out = tmp_path / "plan.yaml"
    printed = " ".join(plan_of(cli, omni, data_file, out, "--placement", "disaggregated").output.split())
    assert (
        "config.json: audio: 2 layers, hidden 32, 4 heads, ffn 64, 16 mel bins, 2 tokens per LLM token, clips of "
        "8 tokens" in printed
    )
    assert "config.json: vision: 2 blocks (1 full-attention, the rest in 16-patch windows), width 32" in printed
    assert "config.json: llm: 4 layers, hidden 48, 4 heads (2 KV), ffn 96" in printed
    plan = yaml.safe_load(out.read_text())
    ranks = {name: set(m["ranks"]) for name, m in plan["modules"].items()}
    assert set(ranks) == {"audio", "vision", "llm"}
    assert not ranks["audio"] & ranks["vision"] and not (ranks["audio"] | ranks["vision"]) & ranks["llm"]


@pytest.mark.slow
def test_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, omni, data_file, tmp_path):
    import torch
    import transformers
    from families import ONE_RANK, write_yaml

    plan = tmp_path / "plan.yaml"
    plan_of(cli, omni, data_file, plan, cluster=str(write_yaml(tmp_path / "one.yaml", ONE_RANK)))
    out = launch_lr0_then_export(cli, plan, tmp_path / "run", tmp_path / "exported")
    assert_same_weights(omni / "model.safetensors", out / "model.safetensors")  # talker and token2wav included
    assert (out / "spk_dict.pt").read_bytes() == (omni / "spk_dict.pt").read_bytes()
    back = transformers.Qwen2_5OmniForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    assert back.thinker.model.audio_tower.layers[0].fc1.weight.dtype == torch.float64
