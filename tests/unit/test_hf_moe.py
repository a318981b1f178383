"""transformers' sparse MoE blocks under orch (runtime/models/hf/moe.py): an `ExpertBlock` and `RoutesTokens` of the
module contract as orch's reference MoE is, HF's forward in float64, and Qwen3-VL-MoE's experts read
from the layout its hub checkpoints store ([experts, in, out]: transformers transposes them at load)."""

import pytest
import torch
from qwen_vl_models import make_qwen_vl

from orch.runtime.models.contract import ExpertBlock, RoutesTokens
from orch.runtime.models.hf.build import build_hf_modules
from orch.runtime.models.hf.moe import HFSparseMoE
from orch.runtime.models.reference import MoE
from orch.runtime.models.registry import load_model, model_spec_from_dir

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_qwen_vl(tmp_path_factory.mktemp("hf-moe") / "m", "qwen3_vl_moe")


def llm_of(directory):
    llm = build_hf_modules(model_spec_from_dir(directory), ["llm"])["llm"]
    llm.materialize(torch.device("cpu"), 0, "llm")
    return llm.to(torch.float64)


def test_sparse_blocks_are_expert_blocks_as_the_reference_moe(moe_dir):
    llm = llm_of(moe_dir)
    kinds = [isinstance(layer.mlp, HFSparseMoE) for layer in llm.layers.values()]
    assert kinds == [True, True, True, False]  # mlp_only_layers [3]
    for block in (llm.layers["0"].mlp, MoE(load_model("tiny-moe").llm)):
        assert isinstance(block, ExpertBlock) and isinstance(block, RoutesTokens)
    assert not isinstance(llm.layers["3"].mlp, (ExpertBlock, RoutesTokens))
    # names are HF's, so the safetensors, orch's checkpoints and export keep them
    assert llm.hf_keys["layers.0.mlp.experts.gate_up_proj"] == "model.language_model.layers.0.mlp.experts.gate_up_proj"
    assert llm.tp_plan().keys().isdisjoint({"layers.0.mlp.gate_proj", "layers.0.mlp.experts"})
    assert "layers.3.mlp.gate_proj" in llm.tp_plan()


def test_block_equals_hf_and_routes_as_hf(moe_dir):
    hf = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(
        moe_dir, dtype=torch.float64, experts_implementation="eager"
    )
    ours = llm_of(moe_dir).layers["1"].mlp
    theirs = hf.model.language_model.layers[1].mlp
    x = torch.randn(1, 29, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ours.keeps_logits = True
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-15)  # a token's k experts summed in order
    assert torch.equal(ours.take_router_logits(), theirs.gate(x.view(-1, 48))[0])
    assert ours.take_router_logits() is None  # read once
    assert ours(x[:, :0]).shape == (1, 0, 48)


def test_experts_stored_as_on_the_hub_are_read_transposed(moe_dir, tmp_path):
    """Qwen3-VL-30B-A3B's safetensors hold gate_up_proj [experts, hidden, 2 x inner] and down_proj [experts,
    inner, hidden]; orch reads them into the model's [experts, 2 x inner, hidden] and [experts, hidden, inner]."""
    import shutil

    from safetensors.torch import load_file, save_file

    hub = tmp_path / "hub"
    shutil.copytree(moe_dir, hub)
    tensors = load_file(str(moe_dir / "model.safetensors"))
    stacked = [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert stacked
    for k in stacked:
        tensors[k] = tensors[k].transpose(1, 2).contiguous()
    save_file(tensors, str(hub / "model.safetensors"), metadata={"format": "pt"})
    want, got = llm_of(moe_dir), llm_of(hub)
    for (name, p), (_, q) in zip(want.named_parameters(), got.named_parameters(), strict=True):
        assert torch.equal(p, q), name
