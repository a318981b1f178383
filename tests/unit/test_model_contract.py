"""The module contract, the family registry and the one TP path (runtime/models/contract.py,
runtime/models/registry.py, runtime/parallel/tensor.py; docs/model_families.md)."""

import pytest
import torch
from hf_models import make_llava, make_qwen2_audio

from orch.planner.errors import SpecError
from orch.planner.model_dir import Role, family_of, types_of
from orch.runtime.models.family import Family
from orch.runtime.models.registry import FAMILIES, load_model, model_spec_from_dir


def _overrides(family: Family, method: str) -> bool:
    return getattr(type(family), method) is not getattr(Family, method)


def test_every_registered_family_names_a_transformers_class_and_gives_wrap_and_its_media_processor():
    import transformers

    for model_type, family in FAMILIES.items():
        assert family.model_type == model_type
        assert hasattr(transformers, family.transformers_class), model_type
        assert _overrides(family, "wrap"), model_type
        if family.role != Role.LLM:  # a family with encoders processes their media
            assert _overrides(family, "media_processor"), model_type
        assert _overrides(family, "read") == (family.role != Role.TOWER), model_type
        assert _overrides(family, "read_source") == (family.role != Role.MODEL), model_type


def test_an_unsupported_model_type_names_the_supported_ones():
    with pytest.raises(SpecError) as err:
        family_of(FAMILIES, "bert", "m/config.json", "model_type", Role.MODEL, Role.LLM)
    assert str(err.value) == (
        "m/config.json: model_type: 'bert' is not supported; expected one of "
        + ", ".join(types_of(FAMILIES, Role.MODEL, Role.LLM))
    )
    assert types_of(FAMILIES, Role.MODEL) == (
        "llava",
        "qwen2_audio",
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_vl_moe",
        "qwen2_5_omni",
        "internvl",
    )


def test_the_reference_modules_implement_the_contract():
    from orch.runtime.models.contract import CausalLM, Encoder, Staged, TensorParallel
    from orch.runtime.models.reference import build_model

    model = load_model("tiny")
    modules = build_model(model, 0, torch.float32)
    for name, module in modules.items():
        assert isinstance(module, TensorParallel)
        if name == model.llm_name:
            assert isinstance(module, CausalLM) and isinstance(module, Staged)
        else:
            assert isinstance(module, Encoder) and module.output_dim == model.llm.hidden


@pytest.mark.parametrize("maker", ["llava", "qwen2_audio"])
def test_each_hf_family_wraps_its_parts_in_the_contract(maker, tmp_path):
    from orch.runtime.models.contract import CausalLM, Encoder, Staged, TensorParallel
    from orch.runtime.models.hf.build import build_hf_modules

    directory = make_llava(tmp_path / "m") if maker == "llava" else make_qwen2_audio(tmp_path / "m")
    model = model_spec_from_dir(directory)
    modules = build_hf_modules(model)
    llm = modules.pop(model.llm_name)
    assert isinstance(llm, CausalLM) and isinstance(llm, Staged) and isinstance(llm, TensorParallel)
    for name, encoder in modules.items():
        assert isinstance(encoder, Encoder) and encoder.output_dim == model.llm.hidden, name
        # every TP plan key names a module that exists (by path, as parallelize_module resolves it)
        paths = {p for p, _ in encoder.named_modules()}
        assert set(encoder.tp_plan()) <= paths, name
    assert set(llm.tp_plan()) <= {p for p, _ in llm.named_modules()}


def test_the_reference_tp_plan_shards_every_block_by_path():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from orch.runtime.models.reference import Block, block_tp_plan, build_model

    model = load_model("tiny")
    llm = build_model(model, 0, torch.float32, [model.llm_name])[model.llm_name]
    plan = block_tp_plan(llm)
    blocks = [p for p, m in llm.named_modules() if isinstance(m, Block)]
    assert len(blocks) == model.llm.layers
    cols = {k for k, v in plan.items() if isinstance(v, ColwiseParallel)}
    rows = {k for k, v in plan.items() if isinstance(v, RowwiseParallel)}
    assert cols == {f"{b}.{p}" for b in blocks for p in ("attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up")}
    assert rows == {f"{b}.{p}" for b in blocks for p in ("attn.o", "mlp.down")}
    # a bare Block (orch profile times one) keys its own children
    assert set(block_tp_plan(llm.blocks["0"])) == {
        k.removeprefix("blocks.0.") for k in plan if k.startswith("blocks.0.")
    }


def test_moe_blocks_shard_only_their_attention():
    from orch.runtime.models.reference import MoE, block_tp_plan, build_model

    model = load_model("tiny")
    moe_spec = model.model_copy(
        update={"modules": {**model.modules, model.llm_name: model.llm.model_copy(update={"experts": 4, "top_k": 2})}}
    )
    llm = build_model(moe_spec, 0, torch.float32, [model.llm_name])[model.llm_name]
    assert any(isinstance(m, MoE) for m in llm.modules())
    assert {k.rsplit(".", 1)[-1] for k in block_tp_plan(llm)} == {"q", "k", "v", "o"}


def test_what_each_module_takes_is_a_declared_protocol(tmp_path):
    """Optional capabilities are Protocols checked with isinstance: a Qwen-VL tower merges patches of grids, a
    Qwen2-Audio tower takes clips (items, no merge), a LLaVA tower and orch's reference encoders take neither;
    a Qwen-VL LLM takes layouts, the others do not."""
    from qwen_vl_models import make_qwen_vl

    from orch.runtime.models.contract import AdjustsAfterTP, MergesPatches, TakesItems, TakesLayouts
    from orch.runtime.models.hf.build import build_hf_modules
    from orch.runtime.models.reference import build_model

    tiny = load_model("tiny")
    for name, module in build_model(tiny, 0, torch.float32).items():
        assert not isinstance(module, (TakesItems, TakesLayouts)), name
    takes: dict[str, tuple[bool, bool, bool]] = {}
    for maker, directory in (
        ("llava", make_llava(tmp_path / "llava")),
        ("qwen2_audio", make_qwen2_audio(tmp_path / "qa")),
        ("qwen2_5_vl", make_qwen_vl(tmp_path / "qvl")),
    ):
        model = model_spec_from_dir(directory)
        for name, module in build_hf_modules(model).items():
            assert isinstance(module, AdjustsAfterTP), (maker, name)
            takes[f"{maker}.{name}"] = (
                isinstance(module, TakesItems),
                isinstance(module, MergesPatches),
                isinstance(module, TakesLayouts),
            )
    assert takes == {
        "llava.vision": (False, False, False),
        "llava.llm": (False, False, False),
        "qwen2_audio.audio": (True, False, False),
        "qwen2_audio.llm": (False, False, False),
        "qwen2_5_vl.vision": (True, True, False),
        "qwen2_5_vl.llm": (False, False, True),
    }
