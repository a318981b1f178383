"""Cost model: known parameter counts, the papers' formulas, and the directions they imply."""

import pytest

from orch.planner.costs import (
    CostConfig,
    Links,
    activation_gb,
    block_activation_bytes,
    choose_data_parallel,
    forward_coefficients,
    forward_flops,
    module_cost,
    module_params,
    state_bytes_per_param,
    workload,
)
from orch.planner.data import module_draws, most_held
from orch.planner.loading import load_cluster, load_data, parse_text
from orch.planner.plan import DataParallel, Layout, Recompute
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.models.registry import load_model

FIXED = DataSpec.model_validate(
    {"global_batch": 64, "seq_len": 4096, "tasks": [{"weight": 1, "tokens": {"vision": 1024, "llm": 2048}}]}
)


def test_llama3_70b_parameter_count():
    llm = load_model("llava-1b-70b").llm
    assert module_params(llm) == pytest.approx(70.55e9, rel=0.01)


def test_forward_flops_are_2n_per_token_plus_attention():
    model = load_model("llava-1b-70b")
    llm = model.llm
    w = workload(model, FIXED, "llm")
    assert w.tokens == 64 * 2048 and w.tokens_sq == 64 * 2048**2
    from orch.planner.costs import layer_params

    dense = 2 * layer_params(llm) * llm.layers * w.tokens
    attention = 4 * llm.hidden * w.tokens_sq * llm.layers * 0.5
    head = 2 * llm.hidden * llm.vocab * w.tokens
    assert forward_flops(llm, llm, w) == pytest.approx(dense + attention + head)


def test_forward_coefficients_follow_the_model_shape():
    """Per token and per pair of one forward (the runtime's dispatcher prices samples with these too)."""
    model = load_model("tiny")
    per_token, per_pair = forward_coefficients(model.modules["vision"], model.llm)
    h, f, layers, d_in, h_llm = 32, 64, 2, 48, 64
    # q, k, v, o, a GELU MLP and two norms per block; the stem and the projector once
    assert per_token == 2 * (4 * h * h + 2 * h * f + 2 * h) * layers + 2 * d_in * h + 2 * h * h_llm
    assert per_pair == 4 * h * layers
    llm = model.llm
    assert forward_coefficients(llm, llm).per_pair == 0.5 * 4 * llm.hidden * llm.layers
    # MoE (tiny-moe's LLM is tiny's with 4 experts, top-2): a token meets the router and its
    # top_k experts' MLPs, not every expert's
    moe = load_model("tiny-moe").llm
    mlp = 3 * moe.hidden * moe.ffn  # SwiGLU
    extra = 2 * ((moe.top_k - 1) * mlp + moe.hidden * moe.experts) * moe.layers
    assert forward_coefficients(moe, moe).per_token == forward_coefficients(llm, llm).per_token + extra
    assert forward_coefficients(moe, moe).per_pair == forward_coefficients(llm, llm).per_pair


def test_a_tower_of_fixed_size_images_prices_attention_per_image():
    """LLaVA's images and InternVL's tiles attend inside each one: a sample of k images costs k times one image,
    however the planner sees its length (no Σlen² over the sample's patches)."""
    vision = load_model("tiny").modules["vision"].model_copy(update={"image_tokens": 16})
    llm = load_model("tiny").llm
    per_token, per_pair = forward_coefficients(vision, llm)
    assert per_pair == 0
    one, three = (forward_flops(vision, llm, _one_sample(16 * k)) for k in (1, 3))
    assert three == pytest.approx(3 * one)
    assert one == pytest.approx(per_token * 16)
    # and one image alone costs what whole-sequence attention over its patches costs
    whole = vision.model_copy(update={"image_tokens": None})
    assert one == pytest.approx(forward_flops(whole, llm, _one_sample(16)))


def _one_sample(tokens: int):
    """A step of one sample of `tokens` (forward_flops reads its tokens and Σlen²)."""
    from types import SimpleNamespace

    return SimpleNamespace(tokens=tokens, tokens_sq=tokens**2)


def test_activation_memory_is_what_each_block_saves_divided_by_tp():
    """Per layer s x block_activation_bytes / t with sequence parallelism (fused attention stores no 5as/h scores,
    so selective recompute keeps as much); full keeps each block's input and one block whole."""
    model = load_model("llava-1b-70b")
    m = model.llm.model_copy(update={"vocab": None, "kind": "llm"})
    w = workload(model, FIXED, "llm")
    s, h, L = 2048, m.hidden, m.layers
    # two norms (3h), queries, repeated keys and values, output and o's copy (5h), SwiGLU (4 ffn); lse per head
    block = 2 * (6 * h + 5 * h + 4 * m.ffn) + 4 * m.heads
    assert block_activation_bytes(m) == block
    lay = Layout(tp=8, pp=1, dp=8)
    none = activation_gb(m, w, lay, 1, Recompute.NONE, in_flight=1) * 1e9
    assert none == pytest.approx(s * block / 8 * L)
    sel = activation_gb(m, w, lay, 1, Recompute.SELECTIVE, in_flight=1) * 1e9
    assert sel == pytest.approx(s * block / 8 * L)
    full = activation_gb(m, w, lay, 1, Recompute.FULL, in_flight=1) * 1e9
    assert full == pytest.approx(2 * s * h / 8 * L + s * block / 8)


@pytest.mark.parametrize(
    "shape",
    [
        {"hidden": 64, "heads": 4, "ffn": 256},  # ffn 4 x hidden
        {"hidden": 64, "heads": 8, "kv_heads": 2, "ffn": 172},  # grouped KV heads, LLaMA's 8/3
        {"hidden": 96, "heads": 4, "ffn": 128, "mlp": "gelu"},
    ],
)
def test_block_activation_bytes_are_what_the_runtime_blocks_save(shape):
    """The bytes autograd keeps for one reference block's backward per token (runtime/memory.py's saved-tensor
    meter), in bf16: the cost model's per-block term, whatever the FFN's width, KV heads and MLP kind (a constant
    34 x hidden was 16-60% off on these shapes)."""
    import torch

    from orch.runtime.memory import ActivationMeter, parameter_storages
    from orch.runtime.models.reference import build_model

    model = ModelSpec.model_validate(
        {"name": "b", "modules": {"llm": {"kind": "llm", "layers": 2, "vocab": 32, **shape}}}
    )
    llm = build_model(model, 0, torch.bfloat16)["llm"]
    tokens = 64
    meter = ActivationMeter(parameter_storages({"llm": llm}))
    x = torch.randn(tokens, model.llm.hidden, dtype=torch.bfloat16, requires_grad=True)  # as the embedding's
    with meter.tracking():
        llm.run_blocks(x, [tokens])
    per_token_block = meter.peak / tokens / model.llm.layers
    assert per_token_block == pytest.approx(block_activation_bytes(model.llm), rel=0.01)


def test_micro_batches_in_flight_hold_what_that_many_samples_hold_not_the_longest_in_each():
    """An encoder holds every micro-batch of its step (three-phase schedule): the most tokens that many samples of
    the mix hold together over the drawn samples, not the longest sample in each: where long samples are rare, few
    GPUs ever hold several (one long video in 32 was predicted eight videos a GPU). Where the post-balancer evens
    the ranks out, a rank's share of the most a step's samples hold."""
    assert most_held((1, 9, 2, 2, 9, 9), 1) == 9
    assert most_held((1, 9, 2, 2, 9, 9), 2) == 18  # as a rank takes them: (1, 9), (2, 2), (9, 9)
    assert most_held((1, 9, 2, 2, 9, 9), 3) == 20
    model = load_model("llava-1b-70b")
    data = DataSpec.model_validate(
        {"global_batch": 64, "seq_len": 4096,
         "tasks": [{"weight": 31, "tokens": {"vision": 576, "llm": 512}}, {"weight": 1, "tokens": {"vision": 4608, "llm": 1024}}]}
    )  # fmt: skip
    m, w = model.modules["vision"], workload(model, data, "vision")
    assert w.held_tokens(1) == w.max_len == 4608
    eight = w.held_tokens(1, in_flight=8)
    assert eight == most_held(module_draws(data, "vision", "llm"), 8)
    assert 4608 + 7 * 576 <= eight < 4 * 4608  # a few videos at most, never eight
    one_gb = activation_gb(m, w, Layout(), 1, Recompute.NONE, in_flight=1)
    eight_gb = activation_gb(m, w, Layout(), 1, Recompute.NONE, in_flight=8)
    assert one_gb * 1e9 == pytest.approx(4608 * block_activation_bytes(m) * m.layers)
    assert eight_gb == pytest.approx(one_gb * eight / 4608)
    # on 8 ranks the post-balancer shares out the step's heaviest 64 samples, whole samples: a rank's share and
    # about one sample of the mix more
    balanced = w.held_tokens(1, in_flight=8, dp=8)
    share = most_held(module_draws(data, "vision", "llm"), 64) / 8 + w.stats.mean * 7 / 8
    assert balanced == max(min(share, eight), 4608) and balanced <= eight
    assert activation_gb(m, w, Layout(dp=8), 1, Recompute.NONE, in_flight=8) == pytest.approx(one_gb * balanced / 4608)


def test_logits_are_counted_for_the_scored_text_rows_only():
    """The LLM scores its text rows, not the encoders' prefix rows (runtime/models/staged.py text_logits): a sample of
    1,024 image tokens (one LLM row each) among 2,048 LLM tokens has logits for 1,024 of them."""
    model = load_model("llava-1b-70b")
    llm = model.llm
    w = workload(model, FIXED, "llm")
    assert w.scored == pytest.approx(1 - 1024 / 2048)
    lay = Layout(tp=8, dp=8)
    with_head = activation_gb(llm, w, lay, 1, Recompute.NONE, in_flight=1)
    blocks = activation_gb(llm.model_copy(update={"vocab": None}), w, lay, 1, Recompute.NONE, in_flight=1)
    assert (with_head - blocks) * 1e9 == pytest.approx(1024 * llm.vocab * 4 / 8)


def test_distributed_optimizer_bytes_per_parameter():
    model = load_model("llava-1b-14b")
    cluster = load_cluster("h100-80g", 1)
    for dp in (1, 8):
        lay = Layout(tp=8 // dp, dp=dp)
        c = module_cost(model, FIXED, cluster, "vision", lay, 1, Recompute.FULL, in_flight=1)
        params = module_params(model.modules["vision"]) / lay.tp
        assert c.params_gb * 1e9 == pytest.approx(params * (2 + 4 + 12 / dp))


def test_frozen_encoder_costs_a_third_and_keeps_no_optimizer():
    model = load_model("llava-1b-70b")
    frozen = model.model_copy(
        update={"modules": {**model.modules, "vision": model.modules["vision"].model_copy(update={"trainable": False})}}
    )
    cluster = load_cluster("h100-80g", 1)
    lay = Layout(dp=8)
    t = module_cost(model, FIXED, cluster, "vision", lay, 1, Recompute.NONE, in_flight=1)
    f = module_cost(frozen, FIXED, cluster, "vision", lay, 1, Recompute.NONE, in_flight=1)
    assert f.compute_s == pytest.approx(t.compute_s / 3)
    # sharded (fsdp): a frozen module only gathers its parameters, and holds no gradient or moments
    assert t.data_parallel == f.data_parallel == DataParallel.FSDP
    assert 0 < f.dp_s < t.dp_s
    assert f.params_gb == pytest.approx(t.params_gb * (2 + 4 / 8) / (2 + 4 + 12 / 8))
    replicated = CostConfig(data_parallel=DataParallel.REPLICATE)
    r = module_cost(frozen, FIXED, cluster, "vision", lay, 1, Recompute.NONE, in_flight=1, cfg=replicated)
    assert r.dp_s == 0 and r.params_gb == pytest.approx(t.params_gb * (2 + 4) / (2 + 4 + 12 / 8))


def test_data_parallel_mode_prices_what_fsdp2_holds():
    # bf16 compute, fp32 masters: fsdp gathers a bf16 copy and accumulates full fp32 gradients, its masters
    # and moments sharded; replicate holds it all; with fp32 compute replicate needs no copy
    assert state_bytes_per_param(DataParallel.FSDP, True, 4) == 2 + 4 + 12 / 4
    assert state_bytes_per_param(DataParallel.REPLICATE, True, 4) == 2 + 4 + 12
    assert state_bytes_per_param(DataParallel.REPLICATE, True, 4, compute_bytes=4) == 16
    assert state_bytes_per_param(DataParallel.FSDP, True, 4, compute_bytes=4) == 4 + 4 + 12 / 4
    small = load_model("tiny").modules["vision"]
    big = load_model("llava-1b-70b").modules["llm"]
    assert choose_data_parallel(small, Layout(dp=8), CostConfig()) == DataParallel.REPLICATE
    assert choose_data_parallel(big, Layout(tp=8, dp=8), CostConfig()) == DataParallel.FSDP
    assert choose_data_parallel(big, Layout(tp=8, pp=8), CostConfig()) == DataParallel.REPLICATE  # dp 1
    forced = CostConfig(data_parallel=DataParallel.FSDP)
    assert choose_data_parallel(small, Layout(dp=8), forced) == DataParallel.FSDP


def test_links_pick_intra_or_inter_node():
    links = Links.build(load_cluster("h100-80g"), None)
    assert links.axis(1, 8) == pytest.approx((450, 5e-6))  # TP8 inside a node
    assert links.axis(8, 4) == pytest.approx((50, 15e-6))  # DP across nodes
    assert links.ring(8e9, 1, 8) == pytest.approx(7 * 5e-6 + 7 / 8 * 8e9 / 450e9)


def test_tp_hurts_a_small_encoder_more_than_a_large_llm():
    model = load_model("llava-1b-70b")
    cluster = load_cluster("h100-80g", 1)

    def slowdown(name):
        t1 = module_cost(model, FIXED, cluster, name, Layout(tp=1, pp=1, dp=8), 1, Recompute.FULL, in_flight=1)
        t8 = module_cost(model, FIXED, cluster, name, Layout(tp=8, pp=1, dp=1), 8, Recompute.FULL, in_flight=1)
        return (t8.compute_s + t8.tp_s) / t1.compute_s

    assert slowdown("vision") > slowdown("llm") > 1.0


def test_pipeline_bubble_is_pp_minus_1_over_m():
    model = load_model("llava-1b-70b")
    cluster = load_cluster("h100-80g", 4)
    c = module_cost(model, FIXED, cluster, "llm", Layout(tp=8, pp=4, dp=1), 4, Recompute.FULL, in_flight=4)
    work = c.compute_s + c.tp_s + c.cp_s + c.ep_s + c.pp_p2p_s
    assert c.bubble_s == pytest.approx(work * 3 / (64 // 4))


def test_profile_replaces_datasheet_compute():
    from orch.planner.profile import ComputeFit, ModuleProfile, Profile

    model = load_model("tiny")
    data = load_data("tiny-mix")
    cluster = load_cluster("local-cpu")
    fit = ComputeFit(constant=0.0, linear=1e-4, quadratic=0.0)
    prof = Profile(device="cpu", backend="gloo", modules={"llm": ModuleProfile(block={1: fit})})
    lay = Layout(dp=4)
    c = module_cost(model, data, cluster, "llm", lay, 1, Recompute.NONE, in_flight=1, profile=prof)
    w = workload(model, data, "llm")
    block = 1e-4 * w.tokens / 4 * model.llm.layers
    assert c.compute_s == pytest.approx(block, rel=0.5)  # the head and embedding add datasheet time
    assert c.compute_s >= block


def test_config_knobs_change_costs():
    model = load_model("llava-1b-70b")
    cluster = load_cluster("h100-80g", 2)
    lay = Layout(tp=8, dp=2)
    a = module_cost(model, FIXED, cluster, "vision", lay, 1, Recompute.FULL, in_flight=1)
    b = module_cost(model, FIXED, cluster, "vision", lay, 1, Recompute.FULL, in_flight=1, cfg=CostConfig(dp_overlap=0))
    assert b.dp_s > a.dp_s > 0


def test_unused_tiny_spec_shapes():
    spec = parse_text(DataSpec, "d", "global_batch: 4\nseq_len: 8\ntasks: [{weight: 1, tokens: {llm: 4}}]")
    assert spec.tasks[0].tokens == {"llm": 4}


def test_profiled_tp_shard_is_not_charged_tp_traffic_twice():
    from orch.planner.profile import ComputeFit, ModuleProfile, Profile

    model, data, cluster = load_model("tiny"), load_data("tiny-mix"), load_cluster("local-cpu")
    lay = Layout(tp=2, dp=2)
    plain = module_cost(model, data, cluster, "llm", lay, 1, Recompute.NONE, in_flight=1)
    fit = ComputeFit(constant=0.0, linear=1e-4)
    prof = Profile(device="cpu", backend="gloo", modules={"llm": ModuleProfile(block={2: fit})})
    measured = module_cost(model, data, cluster, "llm", lay, 1, Recompute.NONE, in_flight=1, profile=prof)
    assert plain.tp_s > 0 and measured.tp_s == 0


def test_measured_per_step_work_is_not_stretched_by_the_pipeline():
    """Gradient sync, optimizer and the orchestrator run once per step: a pipeline's fill and drain
    (the bubble) scale the micro-batches' work, never these."""
    from orch.planner.profile import ComputeFit, ModuleProfile, Profile

    model = load_model("tiny")
    data = load_data("tiny-mix")
    cluster = load_cluster("local-cpu")
    fit = ComputeFit(constant=0.0, linear=1e-4, quadratic=0.0)

    def cost(overhead: float, balance: float):
        prof = Profile(
            device="cpu",
            backend="gloo",
            modules={"llm": ModuleProfile(block={1: fit}, step_overhead_s=overhead)},
            balance_step_s=balance,
        )
        return module_cost(
            model, data, cluster, "llm", Layout(pp=2, dp=2), 1, Recompute.NONE, in_flight=2, profile=prof
        )

    bare, loaded = cost(0.0, 0.0), cost(0.5, 0.25)
    assert loaded.overhead_s == 0.5 and loaded.orchestrator_s == 0.25
    assert loaded.bubble_s == pytest.approx(bare.bubble_s)
    assert loaded.work_s == pytest.approx(bare.work_s)
    assert loaded.time_s == pytest.approx(bare.time_s + 0.75)


def test_reshard_prices_shards_and_the_blocks_in_flight():
    from orch.planner.costs import gathered_bytes
    from orch.planner.plan import Sharding

    reshard = Sharding.RESHARD
    # fp32 master, fp32 gradient shard and the two moments, all sharded; frozen: the master alone
    assert state_bytes_per_param(DataParallel.FSDP, True, 8, sharding=reshard) == 16 / 8
    assert state_bytes_per_param(DataParallel.FSDP, False, 8, sharding=reshard) == 4 / 8
    assert state_bytes_per_param(DataParallel.REPLICATE, True, 8, sharding=reshard) == 2 + 4 + 12  # no shards
    # the root: copy, gradient, fp32 reduce-scatter input; the block in backward: copy and gradient, then the
    # gradient and the fp32 reduce-scatter input once its copy is freed (4 > 2); the prefetched block: copy
    assert gathered_bytes(10, 3, True) == 10 * (2 + 2 + 4) + 3 * (2 + 4) + 3 * 2
    assert gathered_bytes(10, 3, False) == (10 + 3) * 2 + 3 * 2
    # an LLM's embedding or head, gathered per call, or a block with its neighbour, whichever is larger
    assert gathered_bytes(0, 3, True, part=7) == 7 * (2 + 4)
    assert gathered_bytes(0, 3, True, part=2) == 3 * (2 + 4) + 3 * 2
    model, cluster = load_model("llava-1b-70b"), load_cluster("h100-80g")
    lay = Layout(tp=8, dp=8)
    keep = module_cost(model, FIXED, cluster, "llm", lay, 1, Recompute.FULL, in_flight=1)
    zero3 = module_cost(model, FIXED, cluster, "llm", lay, 1, Recompute.FULL, in_flight=1, sharding=reshard)
    assert (keep.sharding, zero3.sharding) == (Sharding.KEEP, reshard)
    assert zero3.params_gb < keep.params_gb / 2 and zero3.activations_gb == keep.activations_gb
    assert zero3.dp_s > keep.dp_s  # a second gather per block, per micro-batch
    replicated = CostConfig(data_parallel=DataParallel.REPLICATE)
    r = module_cost(model, FIXED, cluster, "llm", lay, 1, Recompute.FULL, in_flight=1, cfg=replicated, sharding=reshard)
    assert r.sharding == Sharding.KEEP  # a replicated module has nothing to reshard


def test_the_search_prices_reshard_only_where_memory_binds():
    from orch.planner.costs import module_basis, shardings
    from orch.planner.plan import Sharding

    model, cluster = load_model("llava-1b-70b"), load_cluster("h100-80g")
    b = module_basis(model, FIXED, cluster, "llm")
    lay = Layout(tp=8, dp=8)
    assert shardings(b, lay, keep_gb=10, capacity_gb=77) == (Sharding.KEEP,)
    assert shardings(b, lay, keep_gb=60, capacity_gb=77) == (Sharding.KEEP, Sharding.RESHARD)
    assert shardings(b, lay, keep_gb=90, capacity_gb=77) == (Sharding.RESHARD,)
    assert shardings(b, Layout(tp=8, pp=8), keep_gb=90, capacity_gb=77) == (Sharding.KEEP,)  # dp 1: replicate
    pinned = module_basis(model, FIXED, cluster, "llm", cfg=CostConfig(sharding=Sharding.KEEP))
    assert shardings(pinned, lay, keep_gb=90, capacity_gb=77) == (Sharding.KEEP,)


def test_a_7b_mllm_fits_one_node_at_pure_dp_only_when_it_reshards():
    """Qwen2.5-VL-7B-shaped (8.2B parameters) on 8 x 80 GB: keeping every unit gathered needs TP or PP; with
    reshard priced the LLM runs with neither (its state at dp 8: 57 GB kept, 18.5 GB resharded)."""
    from orch.planner.candidates import SearchInput
    from orch.planner.plan import Sharding
    from orch.planner.planner import make_plan
    from orch.planner.search import SolverConfig

    model = parse_text(ModelSpec, "qwen2.5-vl-7b-shaped", QWEN25_VL_7B)
    data = load_data("llava-mix").model_copy(update={"global_batch": 64})
    cluster = load_cluster("h100-80g", 1)
    plans = {
        sh: make_plan(SearchInput(model, cluster, data, cfg=CostConfig(sharding=sh)), SolverConfig(time_limit_s=10))
        for sh in (Sharding.KEEP, None)
    }
    kept, chosen = plans[Sharding.KEEP].modules["llm"], plans[None].modules["llm"]
    assert kept.layout.tp * kept.layout.pp > 1 and kept.sharding == Sharding.KEEP
    assert (chosen.layout.tp, chosen.layout.pp) == (1, 1) and chosen.sharding == Sharding.RESHARD
    assert plans[None].predicted.step_time_s <= plans[Sharding.KEEP].predicted.step_time_s
    lay = Layout(dp=8)
    keep = module_cost(model, data, cluster, "llm", lay, 8, Recompute.FULL, in_flight=1)
    zero3 = module_cost(model, data, cluster, "llm", lay, 8, Recompute.FULL, in_flight=1, sharding=Sharding.RESHARD)
    assert keep.params_gb == pytest.approx(57.1, abs=0.1) and zero3.params_gb == pytest.approx(18.5, abs=0.1)


QWEN25_VL_7B = """
name: qwen2.5-vl-7b-shaped
modules:
  vision: {kind: encoder, modality: vision, layers: 32, hidden: 1280, heads: 16, ffn: 3420, mlp: swiglu,
           input_dim: 1176, downsample: 4, projector_hidden: 5120, feeds: llm}
  llm: {kind: llm, layers: 28, hidden: 3584, heads: 28, kv_heads: 4, ffn: 18944, vocab: 152064}
"""
