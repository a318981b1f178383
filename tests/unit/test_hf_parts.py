"""What `orch profile` times of an HF model is the model's own layers (runtime/models/hf/parts.py)."""

import pytest
import torch
from hf_models import make_llava, make_qwen2_audio

from orch.runtime.models.registry import model_spec_from_dir


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return model_spec_from_dir(make_llava(tmp_path_factory.mktemp("parts") / "llava", "clip", "llama"))


def test_the_llm_layer_is_transformers_own(llava):
    from orch.runtime.models.hf.parts import layer_case

    case = layer_case(llava, "llm", torch.float64, torch.device("cpu"), 0, None)
    assert [type(m).__name__ for m in case.module.layers.values()] == ["LlamaDecoderLayer"]
    x = torch.randn(7, llava.llm.hidden, dtype=torch.float64)
    # two packed samples: the second one's rows do not depend on the first's
    alone = case(x[3:], [4])
    packed = case(x, [3, 4])
    assert torch.allclose(packed[3:], alone, rtol=0, atol=1e-12)


def test_a_vision_layer_runs_whole_images(llava):
    from orch.runtime.models.hf.parts import layer_case

    case = layer_case(llava, "vision", torch.float64, torch.device("cpu"), 0, None)
    layer = case.module.core.encoder.layers[0]
    assert type(layer).__name__ == "CLIPEncoderLayer" and len(case.module.core.encoder.layers) == 1
    p = llava.modules["vision"].image_tokens
    x = torch.randn(2 * p, llava.modules["vision"].hidden, dtype=torch.float64)
    want = layer(x.view(2, p, -1), None).reshape(2 * p, -1)
    assert torch.equal(case(x, [2 * p]), want)


def test_the_bare_audio_tower_projects_clips(tmp_path):
    from orch.runtime.models.hf.parts import bare_module

    model = model_spec_from_dir(make_qwen2_audio(tmp_path / "qa"))
    bare = bare_module(model, "audio", torch.float64, torch.device("cpu"), 0, None)
    assert len(bare.audio_tower.layers) == 0
    frames = torch.randn(2 * 24, model.modules["audio"].input_dim, dtype=torch.float64)  # 24 tokens: 2 clips (20 + 4)
    assert bare(frames, [24]).shape == (12, model.llm.hidden)
