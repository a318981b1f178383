"""A Qwen-VL directory (tests/qwen_vl_models.py) through the CLI: `orch plan --model DIR` says what it derived,
takes the tower at TP 2 when pinned and refuses its CP, a bad field in one line; launched at lr 0 with the tower
at TP 2 and exported back bit for bit."""

import json

import pytest
import yaml
from families import assert_same_weights, data_file_fixture, launch_lr0_then_export, plan_of
from qwen_vl_models import make_qwen_vl

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

DATA = {
    "global_batch": 8,
    "seq_len": 128,
    "tasks": [
        {"name": "text", "weight": 0.3, "tokens": {"llm": 40}, "max": {"llm": 80}},
        {"name": "image", "weight": 0.7, "tokens": {"vision": 64, "llm": 60}, "max": {"vision": 256, "llm": 128}},
    ],
}


@pytest.fixture(scope="module")
def qwen2_5_vl(tmp_path_factory):
    return make_qwen_vl(tmp_path_factory.mktemp("hf") / "qwen2_5_vl", "qwen2_5_vl")


data_file = data_file_fixture(DATA)


def test_plan_of_a_qwen2_5_vl_directory_says_what_it_derived(cli, qwen2_5_vl, data_file, tmp_path):
    out = tmp_path / "plan.yaml"
    result = plan_of(cli, qwen2_5_vl, data_file, out)
    printed = " ".join(result.output.split())  # the console wraps long lines
    assert (
        "config.json: vision: 4 blocks (2 full-attention, the rest in 16-patch windows), width 32, 4 heads, ffn 64 "
        "swiglu, merge 2x2 → 4 patches per LLM token, 1176 values per patch" in printed
    )
    assert "config.json: llm: 4 layers, hidden 48, 4 heads (2 KV), ffn 96" in printed
    plan = yaml.safe_load(out.read_text())
    vision = plan["model"]["modules"]["vision"]
    assert (vision["item_attention"], vision["window_tokens"], vision["full_attention_blocks"]) == (True, 16, [1, 3])
    assert (vision.get("max_tp"), vision["projector_hidden"], vision["downsample"]) == (None, 128, 4)
    layout = plan["modules"]["vision"]["layout"]
    assert (layout["tp"], layout["cp"]) == (1, 1)


def test_plan_with_a_bad_qwen_vl_field_is_one_line(cli, data_file, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": {"depth": 8,
                                                                                            "fullatt_block_indexes": [3, 8]}}))  # fmt: skip
    result = cli("plan", "--model", str(d), "--cluster", "local-cpu", "--data", str(data_file))
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: {d / 'config.json'}: vision_config.fullatt_block_indexes: expected a list of block indices 0..7, "
        "got [3, 8]"
    )


def test_plan_takes_the_tower_tp2_pinned_and_refuses_its_cp(cli, qwen2_5_vl, data_file, tmp_path):
    out = tmp_path / "plan.yaml"
    plan_of(cli, qwen2_5_vl, data_file, out, "--placement", "colocated", "--fix", "llm.tp=2", "--fix", "vision.tp=2")
    plan = yaml.safe_load(out.read_text())
    assert plan["modules"]["vision"]["layout"]["tp"] == 2 and plan["modules"]["vision"]["layout"]["cp"] == 1
    assert plan["modules"]["llm"]["layout"]["tp"] == 2
    result = cli("plan", "--model", str(qwen2_5_vl), "--cluster", "local-cpu", "--data", str(data_file),
                 "--out", str(tmp_path / "cp.yaml"), "--fix", "vision.cp=2")  # fmt: skip
    assert result.exit_code != 0 and "takes no context parallelism" in result.output


@pytest.mark.slow
def test_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, qwen2_5_vl, data_file, tmp_path, train_config):
    plan = tmp_path / "plan.yaml"
    # the tower at TP 2: its fused qkv sharded by heads, read from and written back to HF's layout
    plan_of(cli, qwen2_5_vl, data_file, plan, "--placement", "colocated", "--fix", "llm.tp=2", "--fix", "vision.tp=2")
    assert yaml.safe_load(plan.read_text())["modules"]["vision"]["layout"]["tp"] == 2
    out = launch_lr0_then_export(cli, plan, tmp_path / "run", tmp_path / "exported",
                                 "--config", train_config(checkpoint_every=1))  # fmt: skip
    assert_same_weights(qwen2_5_vl / "model.safetensors", out / "model.safetensors")
    import torch
    import transformers

    back = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    assert sum(p.numel() for p in back.parameters()) > 0
