"""A model directory's safetensors: sharded indexes, transformers' disk names, slices of the local shard."""

import pytest
import torch

from orch.planner.errors import SpecError


def test_a_sharded_checkpoint_is_found_through_its_index(tmp_path):
    import transformers

    from orch.runtime.models.hf.build import build_full
    from orch.runtime.models.hf.weights import Checkpoint, safetensors_files

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, vocab_size=256)  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    files = safetensors_files(tmp_path)
    assert len(files) > 2 and (tmp_path / "model.safetensors.index.json").is_file()
    ckpt = Checkpoint.of(tmp_path, build_full(str(tmp_path)))
    assert ckpt is not None
    assert set(ckpt.tensors) == {k for k, _ in model.named_parameters()}
    assert len({loc.file for loc in ckpt.tensors.values()}) == len(files)


def test_an_unreadable_index_names_the_file(tmp_path):
    from orch.runtime.models.hf.weights import safetensors_files

    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(SpecError, match="weight_map: unreadable index"):
        safetensors_files(tmp_path)


def test_local_region_of_a_plain_tensor_is_all_of_it():
    from orch.runtime.models.hf.weights import local_region

    assert local_region(torch.zeros(3, 5)) == (slice(0, 3), slice(0, 5))
