"""An InternVL directory through the CLI: `orch plan --model DIR` says what it read, and a launch at lr 0 with the
tower at TP 2 (InternViT-6B's q/k norms, sharded by heads) and the LLM at TP 2 exports the input weights bit for
bit, loadable by transformers' InternVLForConditionalGeneration."""

import pytest
import yaml
from families import assert_same_weights, data_file_fixture, launch_lr0_then_export, plan_of
from internvl_models import make_internvl

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

DATA = {
    "global_batch": 4,
    "seq_len": 64,
    "tasks": [
        {"name": "text", "weight": 0.3, "tokens": {"llm": 20}, "max": {"llm": 40}},
        {"name": "image", "weight": 0.7, "tokens": {"vision": 32, "llm": 40}, "max": {"vision": 48, "llm": 64}},
    ],
}
data_file = data_file_fixture(DATA)


@pytest.fixture(scope="module")
def internvl(tmp_path_factory):
    return make_internvl(tmp_path_factory.mktemp("internvl") / "internvl",
                         vision_extra={"use_qk_norm": True, "norm_type": "rms_norm"})  # fmt: skip


def test_plan_reads_config_json_and_says_what_it_derived(cli, internvl, data_file, tmp_path):
    result = plan_of(cli, internvl, data_file, tmp_path / "plan.yaml")
    assert "config.json: vision: 3 layers, hidden 32, 4 heads, ffn 64, 16 tokens per image" in result.output
    assert "config.json: llm: 4 layers, hidden 48, 4 heads (2 KV), ffn 96" in result.output
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert plan["modules"]["vision"]["layout"]["cp"] == 1  # a tower of whole tiles takes no CP


@pytest.mark.slow
def test_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, internvl, data_file, tmp_path):
    import torch
    import transformers

    plan = tmp_path / "plan.yaml"
    plan_of(cli, internvl, data_file, plan, "--placement", "colocated", "--fix", "llm.tp=2", "--fix", "vision.tp=2")
    assert yaml.safe_load(plan.read_text())["modules"]["vision"]["layout"]["tp"] == 2
    out = launch_lr0_then_export(cli, plan, tmp_path / "run", tmp_path / "exported")
    assert_same_weights(internvl / "model.safetensors", out / "model.safetensors")
    back = transformers.InternVLForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    assert back.config.vision_config.use_qk_norm
