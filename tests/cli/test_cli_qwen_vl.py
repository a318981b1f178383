"""A Qwen2.5-VL directory through the CLI: planned from config.json (its tower at TP 1, no CP), launched, exported
back bit for bit."""

import json

import pytest
import yaml
from qwen_vl_models import make_qwen_vl

DATA = {
    "global_batch": 4,
    "seq_len": 96,
    "tasks": [
        {"name": "text", "weight": 0.3, "tokens": {"llm": 20}, "max": {"llm": 40}},
        {"name": "image", "weight": 0.7, "tokens": {"vision": 64, "llm": 60}, "max": {"vision": 160, "llm": 96}},
    ],
}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return make_qwen_vl(tmp_path_factory.mktemp("hf") / "qwen2_5_vl", "qwen2_5_vl")


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(DATA))
    return path


def test_plan_gives_the_tower_tp1_and_no_cp(cli, qwen, data_file, tmp_path):
    out = tmp_path / "plan.yaml"
    result = cli("plan", "--model", str(qwen), "--cluster", "local-cpu", "--data", str(data_file), "--out", str(out),
                 "--placement", "colocated", "--fix", "llm.tp=2")  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = yaml.safe_load(out.read_text())
    assert plan["modules"]["vision"]["layout"]["tp"] == 1 and plan["modules"]["vision"]["layout"]["cp"] == 1
    assert plan["modules"]["llm"]["layout"]["tp"] == 2


@pytest.mark.slow
def test_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, qwen, data_file, tmp_path, train_config):
    from safetensors.torch import load_file

    plan = tmp_path / "plan.yaml"
    result = cli("plan", "--model", str(qwen), "--cluster", "local-cpu", "--data", str(data_file), "--out", str(plan),
                 "--placement", "colocated", "--fix", "llm.tp=2")  # fmt: skip
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    result = cli("launch", str(plan), "--lr", "0", "--steps", "1", "--config", train_config(checkpoint_every=1),
                 "--dtype", "float64", "--workdir", str(run))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["loss"] > 0
    out = tmp_path / "exported"
    result = cli("export", str(run), "--out", str(out))
    assert result.exit_code == 0, result.output
    before, after = load_file(qwen / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and after[key].equal(tensor), key
    import torch
    import transformers

    back = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    assert sum(p.numel() for p in back.parameters()) > 0
