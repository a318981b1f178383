"""A Qwen3-VL-MoE directory (tests/qwen_vl_models.py) through the CLI: `orch plan --model DIR` says what it derived
of the MoE decoder and takes the LLM's expert parallelism pinned; launched at lr 0 with the experts split over
EP 2 (each rank's experts a DTensor shard: read from the safetensors by rows, checkpointed, gathered by export)
and exported back bit for bit, loadable by Qwen3VLMoeForConditionalGeneration."""

import pytest
import yaml
from families import assert_same_weights, data_file_fixture, launch_lr0_then_export, plan_of
from qwen_vl_models import make_qwen_vl

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

DATA = {
    "global_batch": 4,
    "seq_len": 128,
    "tasks": [
        {"name": "text", "weight": 0.3, "tokens": {"llm": 40}, "max": {"llm": 80}},
        {"name": "image", "weight": 0.7, "tokens": {"vision": 64, "llm": 60}, "max": {"vision": 256, "llm": 128}},
    ],
}

data_file = data_file_fixture(DATA)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_qwen_vl(tmp_path_factory.mktemp("hf") / "qwen3_vl_moe", "qwen3_vl_moe")


@pytest.mark.slow
def test_ep2_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, moe_dir, data_file, tmp_path, train_config):
    plan = tmp_path / "plan.yaml"
    said = plan_of(
        cli, moe_dir, data_file, plan, "--placement", "colocated", "--nodes", "1", "--fix", "llm.ep=2"
    ).output
    assert "4 experts of ffn 20 (2 a token, blocks [3] dense)" in " ".join(said.split())
    assert yaml.safe_load(plan.read_text())["modules"]["llm"]["layout"]["ep"] == 2
    out = launch_lr0_then_export(cli, plan, tmp_path / "run", tmp_path / "exported",
                                 "--config", train_config(checkpoint_every=1))  # fmt: skip
    assert_same_weights(moe_dir / "model.safetensors", out / "model.safetensors")
    import torch
    import transformers

    back = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    assert back.model.language_model.layers[0].mlp.experts.gate_up_proj.shape == (4, 40, 48)
