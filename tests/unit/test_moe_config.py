"""A Mixture-of-Experts decoder's config.json read into the LLM's ModuleSpec (planner/hf_config.py `moe_module`,
Qwen3-VL-MoE through runtime/models/qwen_vl/config.py) against transformers 5.24's own config and model, and
priced by the planner as the runtime runs it: experts of their own width, dense blocks, experts whole under TP
and outside FSDP2 under EP; a real-shaped Qwen3-VL-30B-A3B planned on one node takes expert parallelism."""

import json

import pytest

from orch.planner.costs import Links, _blocks_local, _local_params, layer_params, module_basis, module_params
from orch.planner.errors import SpecError
from orch.planner.hf_config import describe
from orch.planner.loading import load_cluster, load_data
from orch.planner.plan import Layout
from orch.runtime.models.registry import model_spec_from_dir

transformers = pytest.importorskip("transformers")

TEXT = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
            head_dim=12, vocab_size=300, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=20,
            decoder_sparse_step=2, mlp_only_layers=[1], tie_word_embeddings=False)  # fmt: skip
VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=48,
              num_position_embeddings=64, deepstack_visual_indexes=[0])  # fmt: skip
# Qwen3-VL-30B-A3B's shapes (its hub config.json)
A3B_TEXT = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)  # fmt: skip
A3B_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=2048,
                  patch_size=16, deepstack_visual_indexes=[8, 16, 24], num_position_embeddings=2304)  # fmt: skip


def saved(tmp_path, text=TEXT, vision=VISION, name="m"):
    config = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision)
    config.save_pretrained(tmp_path / name)
    return tmp_path / name, config


def test_moe_fields_are_the_config_objects(tmp_path):
    directory, config = saved(tmp_path)
    llm = model_spec_from_dir(directory).llm
    t = config.text_config
    assert (llm.experts, llm.top_k, llm.expert_ffn, llm.ffn) == (8, 2, 20, 96)
    # block i is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers: 3 and 5
    assert llm.dense_blocks == (0, 1, 2, 4) and llm.moe_blocks == 2
    assert llm.aux_loss_coef == 0.0  # output_router_logits is off by default
    with_aux = saved(tmp_path, {**TEXT, "output_router_logits": True, "router_aux_loss_coef": 0.02}, name="aux")[0]
    assert model_spec_from_dir(with_aux).llm.aux_loss_coef == 0.02
    assert "num_local_experts" in json.loads((directory / "config.json").read_text())["text_config"]
    assert t.num_experts == llm.experts
    assert describe(model_spec_from_dir(directory))[1] == (
        "llm: 6 layers, hidden 48, 4 heads (2 KV), ffn 96, 8 experts of ffn 20 (2 a token, blocks "
        "[0, 1, 2, 4] dense), vocab 300"
    )


def test_defaults_are_transformers(tmp_path):
    directory = tmp_path / "d"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3_vl_moe"}))
    llm = model_spec_from_dir(directory).llm
    t = transformers.Qwen3VLMoeTextConfig()
    got = (llm.layers, llm.hidden, llm.ffn, llm.experts, llm.top_k, llm.expert_ffn, llm.vocab)
    assert got == (t.num_hidden_layers, t.hidden_size, t.intermediate_size, t.num_experts, t.num_experts_per_tok,
                   t.moe_intermediate_size, t.vocab_size)  # fmt: skip


def test_planner_counts_the_hf_models_decoder_parameters(tmp_path):
    """Blocks' parameters as the planner counts them equal the HF decoder layers' (experts of
    moe_intermediate_size, dense blocks of intermediate_size, routers)."""
    import torch

    directory, config = saved(tmp_path)
    llm = model_spec_from_dir(directory).llm
    with torch.device("meta"):
        hf = transformers.Qwen3VLMoeForConditionalGeneration(config)
    layers = sum(p.numel() for p in hf.model.language_model.layers.parameters())
    # q/k norms of width head_dim are Qwen3's (2 x head_dim a layer) and not in the planner's count
    assert llm.layers * layer_params(llm) + llm.layers * 2 * 12 == pytest.approx(layers, rel=1e-12)
    assert module_params(llm) > llm.layers * layer_params(llm)


def test_experts_whole_under_tp_and_outside_fsdp_under_ep(tmp_path):
    directory, _ = saved(tmp_path)
    model = model_spec_from_dir(directory)
    llm = model.llm
    experts = 2 * llm.experts * 3 * llm.hidden * llm.expert_ffn  # two sparse blocks
    assert _local_params(llm, Layout(tp=2, dp=2)) - _local_params(llm, Layout(tp=4, dp=1)) == pytest.approx(
        (_local_params(llm, Layout(dp=2)) - experts) / 2 - (_local_params(llm, Layout(dp=2)) - experts) / 4
    )
    assert _local_params(llm, Layout(dp=4, ep=4)) == pytest.approx(_local_params(llm, Layout(dp=4)) - experts * 3 / 4)
    basis = module_basis(model, load_data("tiny-mix"), load_cluster("local-cpu", 1), "llm")
    assert _blocks_local(basis, Layout(dp=4, ep=2)) == pytest.approx(_blocks_local(basis, Layout(dp=4)) - experts)
    assert isinstance(basis.links, Links)


def test_bad_moe_fields_are_named(tmp_path):
    directory, _ = saved(tmp_path, {**TEXT, "num_experts_per_tok": 9})
    with pytest.raises(SpecError, match=r"text_config\.num_experts_per_tok.*9 is more than the 8 experts"):
        model_spec_from_dir(directory)


def test_a3b_on_one_node_takes_expert_parallelism(tmp_path):
    """Qwen3-VL-30B-A3B on one node of 8 x H100: its experts' state does not fit beside the rest unless EP
    splits it, so the LLM's layout has ep > 1 (on 8 nodes, where PP splits it, the planner prices EP's
    all-to-alls above what it saves and picks none)."""
    from orch.planner.candidates import SearchInput
    from orch.planner.planner import make_plan
    from orch.planner.search import SolverConfig

    directory, _ = saved(tmp_path, A3B_TEXT, A3B_VISION)
    model = model_spec_from_dir(directory)
    plan = make_plan(
        SearchInput(model, load_cluster("h100-80g", 1), load_data("llava-mix")), SolverConfig(time_limit_s=10)
    )
    assert plan.modules["llm"].layout.ep > 1, plan.modules["llm"].layout


def test_a_router_aux_loss_keeps_the_llm_off_a_pipeline(tmp_path):
    """The aux loss takes every layer's choices of a micro-batch on one stage: the one list of module rules
    (ModuleSpec.refuses) refuses pp > 1, so the search never plans it and a plan file that pins it is refused;
    without the aux loss the same model pipelines (on 8 nodes the planner picks pp > 1 for A3B)."""
    from orch.planner.candidates import SearchInput
    from orch.planner.planner import make_plan
    from orch.planner.search import SolverConfig

    with_aux = {**A3B_TEXT, "output_router_logits": True, "router_aux_loss_coef": 0.001}
    model = model_spec_from_dir(saved(tmp_path, with_aux, A3B_VISION, name="aux")[0])
    assert model.llm.refuses("pp", 2).startswith("the router's auxiliary loss (aux_loss_coef 0.001)")
    assert model.llm.refuses("pp", 1) is None
    plain = model_spec_from_dir(saved(tmp_path, A3B_TEXT, A3B_VISION)[0])
    assert plain.llm.refuses("pp", 2) is None
    inputs = (load_cluster("h100-80g", 8), load_data("llava-mix"))
    assert make_plan(SearchInput(plain, *inputs), SolverConfig(time_limit_s=10)).modules["llm"].layout.pp > 1
    assert make_plan(SearchInput(model, *inputs), SolverConfig(time_limit_s=10)).modules["llm"].layout.pp == 1


def test_a_moe_too_big_for_the_cluster_is_explained_at_its_smallest_layout_with_ep(tmp_path):
    """Nothing fits: the one line names the smallest footprint the search could reach, a MoE's experts split over
    EP with the rest resharded on every GPU, not the LLM alone at dp 1 (which EP cannot split)."""
    from orch.planner.candidates import SearchInput
    from orch.planner.planner import make_plan
    from orch.planner.search import SolverConfig

    model = model_spec_from_dir(saved(tmp_path, {**A3B_TEXT, "num_hidden_layers": 96}, A3B_VISION)[0])
    cluster = load_cluster("h100-80g", 1)
    with pytest.raises(SpecError) as err:
        make_plan(SearchInput(model, cluster, load_data("llava-mix")), SolverConfig(time_limit_s=10))
    assert "gpu.memory_gb: model" in str(err.value)
    import re

    assert re.search(r"even at (\w+ )*dp\d+ ep[2-9]\d* resharded with full recompute on 8 GPUs", str(err.value)), err
