"""FSDP2 that reshards (ZeRO-3, runtime/parallel/fsdp.py): float64 losses (1e-9), step-0 gradients (1e-9) and
parameters after the steps (1e-8) equal the single-process reference under every placement, with
post-balancing giving DP ranks different numbers of samples (a rank with no sample at all, and so none of any
modality), composed with TP, CP, PP, EP, recompute and beside kept modules. Each rank pads its calls with empty
micro-batches to the count its module's DP ranks agree from the step's tables (runtime/train/inputs.py
`InputRouter.calls`). All plans in one launch of 4 processes.
"""

import pytest
import torch
from equivalence import assert_close, merged
from launching import train_tasks

from orch.planner.balance.mode import Mode
from orch.planner.loading import load_data
from orch.planner.plan import DataParallel, Layout, Recompute, Sharding
from orch.runtime.models.registry import load_model
from orch.runtime.parallel.grid import build_grids
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.inputs import InputRouter
from orch.runtime.train.post_balance import StepTables
from orch.runtime.train.single_process import run_reference

RESHARD, KEEP = Sharding.RESHARD, Sharding.KEEP
STEPS, SEED = 2, 11
R4 = [0, 1, 2, 3]
ENC_DP4 = {"vision": (Layout(dp=4), R4), "audio": (Layout(dp=4), R4)}
# name -> (model, global batch, balance, layouts, sharding, recompute)
PLANS = {
    "homogeneous_dp4": ("tiny", 8, Mode.ORCH, {"llm": (Layout(dp=4), R4)}, RESHARD, Recompute.NONE),
    # 3 samples over 4 DP indices: one rank runs only empty micro-batches, of every module
    "homogeneous_dp4_rank_without_samples": ("tiny", 3, Mode.NONE, {"llm": (Layout(dp=4), R4)}, RESHARD, Recompute.NONE),
    "colocated_llm_tp2_dp2": ("tiny", 8, Mode.ORCH, {"llm": (Layout(tp=2, dp=2), R4), **ENC_DP4}, RESHARD, Recompute.NONE),
    "colocated_llm_pp2_dp2_recompute": (
        "tiny", 8, Mode.ORCH, {"llm": (Layout(pp=2, dp=2), R4), **ENC_DP4}, RESHARD,
        {"llm": Recompute.FULL, "vision": Recompute.SELECTIVE},
    ),
    "colocated_llm_cp2_dp2_vision_cp2_dp2": (
        "tiny", 8, Mode.ORCH,
        {"llm": (Layout(cp=2, dp=2), R4), "vision": (Layout(cp=2, dp=2), R4), "audio": ENC_DP4["audio"]},
        RESHARD, Recompute.NONE,
    ),
    "disaggregated_enc_dp2_llm_dp2": (
        "tiny", 8, Mode.ORCH,
        {"llm": (Layout(dp=2), [2, 3]), "vision": (Layout(dp=2), [0, 1]), "audio": (Layout(dp=2), [0, 1])},
        RESHARD, Recompute.NONE,
    ),
    "moe_dp4_ep2": ("tiny-moe", 8, Mode.NONE, {"llm": (Layout(dp=4, ep=2), R4), **ENC_DP4}, RESHARD, Recompute.NONE),
    "llm_reshards_encoders_keep": (
        "tiny", 8, Mode.ORCH, {"llm": (Layout(dp=4), R4)}, {"llm": RESHARD, "vision": KEEP, "audio": KEEP},
        Recompute.NONE,
    ),
}  # fmt: skip
MEMORY = {  # the same plan kept and resharded, for the measured state and peak, and in bf16 on fp32 masters
    "memory_keep_dp4": ("tiny", 8, Mode.NONE, {"llm": (Layout(dp=4), R4)}, KEEP, Recompute.NONE),
    "memory_reshard_dp4": ("tiny", 8, Mode.NONE, {"llm": (Layout(dp=4), R4)}, RESHARD, Recompute.NONE),
    "bfloat16_keep_dp4": ("tiny", 8, Mode.ORCH, {"llm": (Layout(dp=4), R4)}, KEEP, Recompute.NONE),
    "bfloat16_reshard_dp4": ("tiny", 8, Mode.ORCH, {"llm": (Layout(dp=4), R4)}, RESHARD, Recompute.NONE),
}
CFG = TrainConfig(
    steps=STEPS, seed=SEED, dtype="float64", balance=Mode.NONE, optimizer="adamw", lr=0.01, lr_schedule="cosine",
    warmup_steps=1, min_lr=0.001, clip_norm=0.05,
)  # fmt: skip


def _data(global_batch: int):
    return load_data("tiny-mix").model_copy(update={"global_batch": global_batch, "seq_len": 96})


def _plan(name: str):
    model, gb, _, layouts, sharding, rc = {**PLANS, **MEMORY}[name]
    plan = hand_plan(
        load_model(model), _data(gb), layouts, data_parallel=DataParallel.FSDP, recompute=rc, sharding=sharding
    )
    return plan.model_copy(update={"ranks_per_node": 2})  # two emulated nodes: the dispatcher's node grouping


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    every = {**PLANS, **MEMORY}
    plans = {name: _plan(name) for name in every}
    data = {name: _data(every[name][1]) for name in every}
    cfgs = {name: CFG.model_copy(update={"balance": every[name][2]}) for name in every}
    for name in ("bfloat16_keep_dp4", "bfloat16_reshard_dp4"):
        cfgs[name] = cfgs[name].model_copy(update={"dtype": "bfloat16"})
    out = tmp_path_factory.mktemp("reshard")
    return train_tasks(plans, data, cfgs, out), out


_refs: dict[tuple[str, int], object] = {}


def _reference(model: str, global_batch: int):
    if (model, global_batch) not in _refs:
        _refs[(model, global_batch)] = run_reference(
            load_model(model), _data(global_batch), seed=SEED, steps=STEPS, dtype=torch.float64, train=CFG
        )
    return _refs[(model, global_batch)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_reshard_matches_the_reference(name, launched):
    records, out = launched
    ref = _reference(PLANS[name][0], PLANS[name][1])
    assert [r.loss for r in records[name]] == pytest.approx(ref.losses, rel=1e-9)
    assert_close(merged(out / name, "grads"), ref.grads, rel=1e-9)
    assert_close(merged(out / name, "params"), ref.params, rel=1e-8)


@pytest.mark.slow
def test_reshard_holds_the_same_state_and_a_lower_peak(launched):
    records, _ = launched
    keep, reshard = records["memory_keep_dp4"][-1].memory, records["memory_reshard_dp4"][-1].memory
    assert [r["state_bytes"] for r in reshard.values()] == [r["state_bytes"] for r in keep.values()]  # the shards
    for rank, r in reshard.items():
        # the gathered blocks in flight and the gradient shards instead of every unit and full gradients
        assert r["state_bytes"] < r["peak_bytes"] < keep[rank]["peak_bytes"], rank


@pytest.mark.slow
def test_bfloat16_reshards_like_keep_on_fp32_masters(launched):
    """bf16 compute on fp32 masters: the same bf16 math per micro-batch; only the fp32 reductions' order differs
    (per micro-batch against once per step)."""
    records, out = launched
    keep = [r.loss for r in records["bfloat16_keep_dp4"]]
    reshard = [r.loss for r in records["bfloat16_reshard_dp4"]]
    assert reshard == pytest.approx(keep, rel=1e-4)
    assert reshard != pytest.approx([r.loss for r in records["homogeneous_dp4"]], rel=1e-6)  # bf16 math ran
    params = merged(out / "bfloat16_reshard_dp4", "params")
    assert params and all(p.dtype == torch.float32 for p in params.values())  # the masters stay fp32
    assert_close(params, merged(out / "bfloat16_keep_dp4", "params"), rel=1e-4)


@pytest.mark.slow
def test_a_keep_checkpoint_resumes_under_reshard(tmp_path):
    """The shards at rest are the same under keep and reshard: a checkpoint saved by a kept run (PP stages,
    CP-sharded vision, experts outside FSDP2, AdamW state) resumes under reshard on the trajectory of a run
    that resharded throughout."""
    from launching import train_local, train_runs

    from orch.runtime.workdir.run_dir import step_folders

    model, data = load_model("tiny-moe"), _data(8)
    layouts = {
        "llm": (Layout(pp=2, dp=2, ep=2), R4),
        "vision": (Layout(cp=2, dp=2), R4),
        "audio": (Layout(dp=4), R4),
    }

    def plan(sharding):
        return hand_plan(model, data, layouts, data_parallel=DataParallel.FSDP, sharding=sharding)

    def cfg(steps, **kw):
        return TrainConfig(steps=steps, seed=4, dtype="float64", optimizer="adamw", lr=0.01, balance=Mode.NONE, **kw)

    runs = {
        "full": (plan(RESHARD), data, cfg(3), tmp_path / "full"),
        "part": (plan(KEEP), data, cfg(1, checkpoint_every=1), tmp_path / "part"),
    }
    done = train_runs(runs)
    assert [step for step, _ in step_folders(tmp_path / "part")] == [1]
    resumed = train_local(plan(RESHARD), data, cfg(3), tmp_path / "part")
    assert [r.step for r in resumed] == [0, 1, 2]
    assert [r.loss for r in resumed] == pytest.approx([r.loss for r in done["full"]], rel=1e-9, abs=0)


def _tables(plan, dest: dict[str, tuple[int, ...]]) -> StepTables:
    dp = {n: mp.layout.dp for n, mp in plan.modules.items()}
    return StepTables(0, dest, dest, dp, plan.model.llm_name)


def test_calls_are_agreed_from_the_tables():
    """Under reshard every DP rank of a module runs the most micro-batches any DP index needs (empty ones included);
    under keep each rank its own; under EP num_micro_batches."""
    model, data = load_model("tiny"), _data(8)
    layouts = {"llm": (Layout(dp=4), R4)}
    dest = {n: (0, 0, 0, 1, 2, 2, 0, 0) for n in model.modules}  # DP index 0 holds 5 samples, 3 holds none
    for sharding, want in ((RESHARD, 2), (KEEP, 0)):
        plan = hand_plan(model, data, layouts, data_parallel=DataParallel.FSDP, sharding=sharding)
        router = InputRouter(plan, build_grids(plan.modules), 3, 4, torch.device("cpu"), balanced=True)
        tables = _tables(plan, dest)
        assert router.calls("llm", tables) == want
        # the rank without samples: two empty micro-batches under reshard, none under keep
        mbs = router.micro_batches("llm", tables.held("llm", 3), None, want)  # type: ignore[arg-type]
        assert [mb.ids for mb in mbs] == [()] * want
        assert router.chunks("vision", [], want) == [[]] * max(want, 1)
    replicated = hand_plan(model, data, layouts, data_parallel=DataParallel.REPLICATE, sharding=RESHARD)
    router = InputRouter(replicated, build_grids(replicated.modules), 0, 4, torch.device("cpu"), balanced=True)
    assert router.calls("llm", _tables(replicated, dest)) == 0  # replicate: one all-reduce, nothing to agree
