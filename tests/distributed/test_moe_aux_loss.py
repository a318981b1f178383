"""The router's auxiliary loss of a Mixture-of-Experts LLM (runtime/train/aux_loss.py), held in float64 against
Hugging Face's own `load_balancing_loss_func` on a tiny Qwen3-VL-MoE whose config asks for it
(output_router_logits, router_aux_loss_coef 0.25): one micro-batch holding the whole batch (one rank; and its
rows over CP2) is HF's aux of the whole batch; micro-batches of one sample each (two on each of two DP2 EP2 ranks)
are the row-weighted sum of HF's aux of each sample. Per plan: the step's LM loss (1e-9
relative), its `aux_loss` metric (1e-9 relative) and every gradient of LM loss + coef x aux (1e-9 of the
tensor's largest entry). Two launches (one per world size)."""

import pytest
from equivalence import assert_matches_hf, orch_keys
from hf_references import qwen_vl_moe_aux
from launching import train_tasks
from qwen_vl_models import make_qwen_vl

from orch.planner.plan import DataParallel, Layout, Recompute
from orch.planner.specs import DataSpec, TaskSpec
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

SEED = 4
DATA = DataSpec(
    global_batch=4,
    seq_len=120,
    tasks=[
        TaskSpec(name="text", weight=0.25, tokens={"llm": 30}, max={"llm": 60}),
        TaskSpec(name="image", weight=0.75, tokens={"vision": 80, "llm": 70}, max={"vision": 256, "llm": 120}),
    ],
)
# name -> (LLM layout and ranks, micro-batches, whether the reference's aux is per sample)
PLANS = {
    "one_micro_batch": ((Layout(dp=1), [0]), 1, False),
    "llm_cp2": ((Layout(cp=2), [0, 1]), 1, False),
    "llm_dp2_ep2": ((Layout(dp=2, ep=2), [0, 1]), 2, True),
}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-aux")
    return make_qwen_vl(root / "qwen3_vl_moe", "qwen3_vl_moe", output_router_logits=True, router_aux_loss_coef=0.25)


def test_config_reads_the_aux_loss_coefficient(moe_dir):
    llm = model_spec_from_dir(moe_dir).llm
    assert (llm.experts, llm.top_k, llm.expert_ffn, llm.dense_blocks, llm.aux_loss_coef) == (4, 2, 20, (3,), 0.25)


@pytest.mark.slow
def test_aux_loss_equals_hf(moe_dir, tmp_path):
    model = model_spec_from_dir(moe_dir)
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    plans = {}
    for name, ((layout, ranks), micro, _) in PLANS.items():
        layouts = {"llm": (layout, ranks), "vision": (Layout(dp=len(ranks)), ranks)}
        # DP2 EP2 recomputes its blocks: the router logits read after a forward whose block runs again in backward
        recompute = Recompute.FULL if name == "llm_dp2_ep2" else Recompute.NONE
        plans[name] = hand_plan(
            model, DATA, layouts, micro_batches=micro, data_parallel=DataParallel.FSDP, recompute=recompute
        )
    records = {}
    for world in (1, 2):
        mine = {n: p for n, p in plans.items() if len(PLANS[n][0][1]) == world}
        records |= train_tasks(mine, DATA, cfg, tmp_path / f"world{world}")
    keys = orch_keys(model)
    for per_sample in (False, True):
        loss, aux, grads = qwen_vl_moe_aux(moe_dir, "Qwen3VLMoeForConditionalGeneration", model, DATA, SEED, per_sample)
        assert aux > 0
        for name in [n for n, plan in PLANS.items() if plan[2] == per_sample]:
            assert records[name][0].aux_loss == pytest.approx(aux, rel=1e-9), name
            assert_matches_hf(records, name, tmp_path / f"world{len(PLANS[name][0][1])}", keys, loss, grads)
