"""A tower that cannot run on zero rows (LLaVA's whole images, Qwen2-Audio's clips, Qwen-VL's grids), called on
a chunk without media where every DP rank must run its blocks (ZeRO-3: runtime/train/compute.py `encode` with
`empty_width`): it runs its placeholder input, returns no rows, and its backward reaches every block it ran
with gradients of exact zeros (the blocks' reduce-scatters happen on every rank)."""

import pytest
import torch
from families import FAMILY_MODELS


@pytest.mark.parametrize("family", ["llava", "qwen2_audio", "qwen2_vl"])
def test_a_chunk_without_media_runs_the_tower_and_adds_zeros(tmp_path, family):
    from orch.runtime.data.batch import Sample
    from orch.runtime.models.build import build_modules
    from orch.runtime.models.registry import model_spec_from_dir
    from orch.runtime.train.compute import encode

    model = model_spec_from_dir(FAMILY_MODELS[family](tmp_path))
    name = model.encoder_names[0]
    tower = build_modules(model, 0, torch.float64, names=[name])[name]
    tower.materialize(torch.device("cpu"), 0, name)
    width = model.modules[name].input_dim
    text_only = Sample(0, {name: torch.zeros(0, width, dtype=torch.float64)}, torch.ones(5, dtype=torch.int64),
                       torch.ones(5, dtype=torch.int64))  # fmt: skip

    out = encode(tower, name, [text_only], torch.float64, model.modality(name).frames_per_token, None, width)
    assert out.shape == (0, tower.output_dim)
    out.sum().backward()
    first_block = tower.layer_stack()[0]
    assert all(p.grad is not None for p in first_block.parameters())
    grads = [p.grad for p in tower.parameters() if p.grad is not None]
    assert grads and all(bool((g == 0).all()) for g in grads)
