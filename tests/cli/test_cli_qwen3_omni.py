"""A Qwen3-Omni directory (tests/qwen3_omni_models.py) through the CLI: `orch plan --model DIR` says what it
derived of the thinker (the audio encoder, the deepstack vision tower, the MoE LLM) and plans the LLM's experts
over EP 2; launched at lr 0 and exported back bit for bit (the experts as stored, one tensor per expert; talker
and code2wav as they came) into a directory Qwen3OmniMoeForConditionalGeneration loads."""

import pytest
import yaml
from families import OMNI_DATA, assert_same_weights, data_file_fixture, launch_lr0_then_export, plan_of
from qwen3_omni_models import make_qwen3_omni

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)

DATA = {**OMNI_DATA, "global_batch": 8}


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return make_qwen3_omni(tmp_path_factory.mktemp("hf") / "qwen3_omni_moe")


data_file = data_file_fixture(DATA)


@pytest.mark.slow
def test_ep2_launch_lr0_then_export_returns_the_weights_bit_for_bit(cli, omni, data_file, tmp_path, train_config):
    import torch
    import transformers

    plan = tmp_path / "plan.yaml"
    said = " ".join(
        plan_of(
            cli, omni, data_file, plan, "--placement", "colocated", "--nodes", "1", "--fix", "llm.ep=2"
        ).output.split()
    )
    assert (
        "audio: 2 layers, hidden 32, 4 heads, ffn 64, 64 mel bins, 1 tokens per LLM token, clips of 26 tokens" in said
    )
    assert "deepstack: blocks 1 also feed the LLM's first 1 layers" in said
    assert "4 experts of ffn 20 (2 a token, blocks [3] dense)" in said
    assert yaml.safe_load(plan.read_text())["modules"]["llm"]["layout"]["ep"] == 2
    out = launch_lr0_then_export(cli, plan, tmp_path / "run", tmp_path / "exported",
                                 "--config", train_config(checkpoint_every=1))  # fmt: skip
    assert_same_weights(omni / "model.safetensors", out / "model.safetensors")  # talker and code2wav included
    back = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    assert back.thinker.model.language_model.layers[0].mlp.experts.gate_up_proj.shape == (4, 40, 48)
