"""Post-balancing in the runtime (runtime/train/post_balance.py) leaves training unchanged.

Pure tests of the tables (cost model, node grouping, the composed route equals the separate
moves), then gloo runs in float64: every balance mode, on heterogeneous plans, gives the
reference's losses (1e-9 relative), step-0 gradients (1e-9) and parameters after 3 steps (1e-8),
processes every sample exactly once per phase with all of its tokens, and the balanced run
equals the `--balance none` run.

The gloo checks share ONE launch of 4 processes (`gloo` fixture): every (plan, mode) of RUNS runs
there through the trainer (runtime/train/trainer.py), one after the other in one process group
(4-rank plans all, a TaskSequence), then the composed-move check; each test reads its part.
Process start-up (torch imports, gloo rendezvous) dominated the file's time when every run was
a launch of its own.
"""

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from equivalence import assert_close, merged

from orch.planner.costs import forward_coefficients
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.planner.routing import RouteTable
from orch.planner.sample_cost import SampleCost
from orch.runtime.data.batch import GlobalBatch, encoder_order
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.models.registry import load_model
from orch.runtime.parallel.grid import Grid, build_grids
from orch.runtime.plans import hand_plan
from orch.runtime.train.calibration import calibrate_module, modules_to_calibrate
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.post_balance import PostBalancer, StepTables, dp_per_node, lengths_columns
from orch.runtime.train.single_process import run_reference

STEPS = 2
SEED = 7

PLANS = {
    # encoder DP4 / LLM DP2 TP2 on 4 ranks, emulated as 2 nodes x 2 ranks
    "colocated_enc_dp4_llm_dp2_tp2": {
        "llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "homogeneous_dp4": {"llm": (Layout(dp=4), [0, 1, 2, 3])},
    # LLM pipeline: token ids go to stage 0, labels to stage 1, encoder outputs to stage 0
    "colocated_enc_dp4_llm_pp2_dp2": {
        "llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    # encoder island on node 0, LLM island on node 1
    "disaggregated_enc_dp2_llm_dp2": {
        "llm": (Layout(dp=2), [2, 3]),
        "vision": (Layout(dp=2), [0, 1]),
        "audio": (Layout(dp=2), [0, 1]),
    },
    # one island per encoder on node 0, the LLM island on node 1: both encoders' outputs are routed
    # from islands of their own into the balanced LLM
    "disaggregated_islands_llm_dp2": {
        "llm": (Layout(dp=2), [2, 3]),
        "vision": (Layout(dp=1), [0]),
        "audio": (Layout(dp=1), [1]),
    },
    # context parallelism in the LLM and in an encoder: balanced inputs are broadcast over (cp, tp)
    "colocated_cp2": {
        "llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
}
MODES = ("none", "orch", "paper", "lpt")
# Every mode on the colocated (encoders DP4, LLM DP2xTP2) and the disaggregated plan, and the
# homogeneous and the CP plan balanced once; `none` is the baseline the balanced runs must equal, and
# equals the reference.
EQUAL_TO_NONE = ("colocated_enc_dp4_llm_dp2_tp2", "disaggregated_enc_dp2_llm_dp2")
RUNS = [(name, mode) for name in EQUAL_TO_NONE for mode in MODES] + [
    ("homogeneous_dp4", "orch"),
    ("colocated_enc_dp4_llm_pp2_dp2", "orch"),
    ("colocated_cp2", "orch"),
    ("disaggregated_islands_llm_dp2", "orch"),
]


@pytest.fixture(scope="module")
def specs():
    return load_model("tiny"), load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})


def _plan(specs, name):
    model, data = specs
    return hand_plan(model, data, PLANS[name]).model_copy(update={"ranks_per_node": 2})


def _tables(specs, name, mode, step=0) -> tuple[StepTables, GlobalBatch]:
    model, data = specs
    plan = _plan(specs, name)
    orch = PostBalancer(plan, build_grids(plan.modules), mode, 8)
    batch = SyntheticBatch.build(model, data, SEED, step)
    return orch.dispatch(step, lengths_columns(model, batch)), batch


# -- pure ---------------------------------------------------------------------------------


def test_calibration_is_the_sample_cost_model_split_over_tp(specs):
    """Timed on this machine: finite, non-negative seconds, cached; the orchestrator charges the per-token and
    per-pair terms over the module's tp ranks and the per-sample constant whole, on every present sample."""
    model, data = specs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run (and quick on a shared machine)
    try:
        calibrated = calibrate_module(model, "vision", torch.float64)
    finally:
        torch.set_num_threads(threads)
    timed = calibrated.cost
    assert timed is not None
    assert all(0 <= x < 1.0 for x in (timed.call, timed.constant, timed.linear, timed.quadratic))
    assert calibrate_module(model, "vision", torch.float64) is calibrated  # cached: one timing

    plan = _plan(specs, "colocated_enc_dp4_llm_dp2_tp2")
    calibration = {
        "vision": SampleCost(constant=1e-4, linear=2e-6, quadratic=3e-9),
        "audio": SampleCost(call=1e-3, constant=3e-4, linear=1e-6),
        "llm": SampleCost(constant=7e-4, linear=4e-6, quadratic=1e-8),
    }
    orch = PostBalancer(plan, build_grids(plan.modules), "lpt", 8, calibration)
    batch = SyntheticBatch.build(model, data, SEED, 0)
    cols = lengths_columns(model, batch)
    t = orch.dispatch(0, cols)
    for m, c in calibration.items():
        tp = 2 if m == "llm" else 1
        got = orch.costs[m]
        assert (got.call, got.constant) == (c.call, c.constant)
        assert (got.linear, got.quadratic) == pytest.approx((c.linear / tp, c.quadratic / tp), rel=1e-15)
        cost = [c.constant + (c.linear * n + c.quadratic * n * n) / tp if n else 0.0 for n in cols[m]]
        before = [sum(x for x, d in zip(cost, t.origin[m], strict=True) if d == r) for r in range(t.dp[m])]
        assert t.stats[m]["max_cost_before"] == pytest.approx(max(before), rel=1e-12)
        assert t.stats[m]["max_cost"] <= t.stats[m]["max_cost_before"]
        floor = max(sum(before) / len(before), max(cost))
        assert t.stats[m]["floor_cost"] == pytest.approx(floor, rel=1e-12)
        assert t.stats[m]["floor_cost"] <= t.stats[m]["max_cost"] * (1 + 1e-12)


def test_dp_indices_per_node():
    assert dp_per_node(Grid("m", 1, 1, 4, 1, (0, 1, 2, 3)), 2) == 2
    assert dp_per_node(Grid("m", 2, 1, 2, 1, (0, 1, 2, 3)), 2) == 1  # one DP index per node
    assert dp_per_node(Grid("m", 1, 1, 3, 1, (1, 2, 3)), 2) == 3  # uneven: one node for the dispatcher


@pytest.mark.parametrize("mode", ["orch", "paper", "lpt"])
@pytest.mark.parametrize("name", list(PLANS))
def test_tables_balance_and_respect_the_token_cap(specs, name, mode):
    model, _ = specs
    t, batch = _tables(specs, name, mode)
    cols = lengths_columns(model, batch)
    for m in [*encoder_order(model), model.llm_name]:
        phase = "llm" if m == model.llm_name else m
        assert t.stats[phase]["max_cost"] <= t.stats[phase]["max_cost_before"] * (1 + 1e-12)
        assert t.stats[phase]["mean_cost"] == pytest.approx(t.stats[phase]["mean_cost_before"])
        tokens = lambda where, m=m: [  # noqa: E731
            sum(n for n, d in zip(cols[m], where, strict=True) if d == r) for r in range(t.dp[m])
        ]
        assert max(tokens(t.dest[m])) <= max(tokens(t.origin[m]))  # never bigger than the unbalanced max


def test_none_keeps_every_sample_at_its_origin(specs):
    t, _ = _tables(specs, "colocated_enc_dp4_llm_dp2_tp2", "none")
    assert t.dest == t.origin


@pytest.mark.parametrize("name", list(PLANS))
def test_composed_route_equals_separate_moves(specs, name):
    """Π_llm ∘ B ∘ Π_enc⁻¹ (one move) puts every sample where the three moves would."""
    t, batch = _tables(specs, name, "orch")
    for e in encoder_order(specs[0]):
        composed = t.boundary_table(e)
        assert composed == RouteTable.build(list(t.dest[e]), list(t.dest[t.llm]), t.dp[e], t.dp[t.llm])
        # Simulate the moves on per-rank lists of sample ids.
        here = {r: composed.source_held(r) for r in range(t.dp[e])}
        steps = [
            t.input_table(e).inverse(),
            RouteTable.build(list(t.origin[e]), list(t.origin[t.llm]), t.dp[e], t.dp[t.llm]),
            t.input_table(t.llm),
        ]
        for table in steps:
            nxt: dict[int, list[int]] = {r: [] for r in range(table.num_dst)}
            for r, ids in here.items():
                for i in ids:
                    assert table.src[i] == r
                    nxt[table.dst[i]].append(i)
            here = {r: sorted(ids) for r, ids in nxt.items()}
        assert here == {r: composed.held(r) for r in range(t.dp[t.llm])}


# -- gloo: one launch for every run and the composed move ------------------------------------


def _move_check(rank: int, tables: StepTables, rows: tuple[int, ...], out: Path) -> None:
    """The composed boundary move and the three separate moves, on tensors that name their rows."""
    from orch.runtime.parallel.grid import build_meshes
    from orch.runtime.parallel.transport import Route, move

    grids = {"vision": Grid("vision", 1, 1, 4, 1, (0, 1, 2, 3)), "llm": Grid("llm", 2, 1, 2, 1, (0, 1, 2, 3))}
    build_meshes(grids)
    enc, llm = grids["vision"], grids["llm"]
    mine = tables.held("vision", enc.coord(rank).dp)
    parts = [torch.stack([torch.full((rows[i],), float(i)), torch.arange(rows[i]) * 1.0], 1) for i in mine]
    x = torch.cat(parts) if parts else torch.zeros(0, 2)
    once = move(x, Route(tables.boundary_table("vision"), enc, llm, rows), rank, 4)
    y = move(x, Route(tables.input_table("vision").inverse(), enc, enc, rows), rank, 4)
    unbalanced = RouteTable.build(list(tables.origin["vision"]), list(tables.origin["llm"]), 4, 2)
    y = move(y, Route(unbalanced, enc, llm, rows), rank, 4)
    y = move(y, Route(tables.input_table("llm"), llm, llm, rows), rank, 4)
    torch.save((once, y), out / f"move.rank{rank}.pt")


@dataclass
class MoveCheck:
    """The composed-move check as a task of the same launch as the training runs."""

    tables: StepTables
    rows: tuple[int, ...]
    workdir: str
    world_size: int = 4
    device: str = "auto"
    timeout_s: float = 120.0

    def prepare(self) -> None:
        pass

    def run(self, ctx) -> None:
        _move_check(ctx.env.rank, self.tables, self.rows, Path(self.workdir))

    def result(self) -> None:
        return None

    def release(self) -> None:
        pass


@pytest.fixture(scope="module")
def gloo(specs, tmp_path_factory):
    """The one launch (a TaskSequence of every (plan, mode) run through the trainer, then the move check):
    (plan, mode) -> (records, merged grads, merged params), and the move results."""
    from launching import train_tasks

    from orch.runtime.train.debug import DebugConfig

    _, data = specs
    out = tmp_path_factory.mktemp("gloo")
    tables, batch = _tables(specs, "colocated_enc_dp4_llm_dp2_tp2", "orch")
    rows = tuple(random.Random(0).randint(1, 4) for _ in range(batch.size))
    plans = {f"{name}-{mode}": _plan(specs, name) for name, mode in RUNS}
    cfgs = {
        f"{name}-{mode}": TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", balance=mode)
        for name, mode in RUNS
    }
    records = train_tasks(
        plans, data, cfgs, out, debug=DebugConfig(count_tokens=True), extra=[MoveCheck(tables, rows, str(out))]
    )
    results = {}
    for name, mode in RUNS:
        workdir = out / f"{name}-{mode}"
        dicts = [r.model_dump() for r in records[f"{name}-{mode}"]]
        results[(name, mode)] = (dicts, merged(workdir, "grads"), merged(workdir, "params"))
    moves = [torch.load(out / f"move.rank{r}.pt") for r in range(4)]
    return results, (tables, rows, moves)


@pytest.mark.slow
def test_composed_move_equals_separate_moves_on_gloo(gloo):
    _, (t, rows, moves) = gloo
    for rank, (once, separate) in enumerate(moves):
        held = t.held("llm", rank // 2)
        assert torch.equal(once, separate)
        assert once[:, 0].tolist() == [float(i) for i in held for _ in range(rows[i])]
        assert once[:, 1].tolist() == [float(j) for i in held for j in range(rows[i])]


# -- gloo: training is unchanged --------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(specs):
    model, data = specs
    return run_reference(model, data, seed=SEED, steps=STEPS, dtype=torch.float64, optimizer="sgd", lr=0.1)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode"), RUNS)
def test_balanced_training_matches_reference(specs, reference, gloo, name, mode):
    model, data = specs
    records, grads, params = gloo[0][(name, mode)]
    assert [r["step"] for r in records] == list(range(STEPS))
    for r, want in zip(records, reference.losses, strict=True):
        assert r["loss"] == pytest.approx(want, rel=1e-9, abs=0)
    assert_close(grads, reference.grads, 1e-9)
    assert_close(params, reference.params, 1e-8)

    # Every sample is processed exactly once per phase per step, with all of its tokens.
    plan = _plan(specs, name)
    for r in records:
        batch = SyntheticBatch.build(model, data, SEED, r["step"])
        want = lengths_columns(model, batch)
        for m, col in want.items():
            seen: dict[int, int] = {}
            for per_rank in r["processed"].values():
                for sid, n in per_rank.get(m, {}).items():
                    assert int(sid) not in seen, f"step {r['step']}: sample {sid} ran twice in {m}"
                    seen[int(sid)] = n
            assert seen == dict(enumerate(col)), f"step {r['step']}: {m}"
        bal = r["balance"]
        assert bal["mode"] == mode
        for phase in [*encoder_order(model), "llm"]:
            st = bal[phase]
            assert st["max_cost"] <= st["max_cost_before"] * (1 + 1e-12)
            assert st["intra_node_bytes"] >= 0 and st["inter_node_bytes"] >= 0
            if mode == "none" and phase != "llm":
                assert st["intra_node_bytes"] == st["inter_node_bytes"] == 0
        assert 0 <= bal["dispatcher_hidden_s"] <= bal["dispatcher_s"]
        if mode != "none" and r["step"] == 0:
            assert bal["dispatcher_hidden_s"] == 0  # nothing to overlap with before the first step
    if plan.placement.value == "disaggregated":  # the islands sit on different nodes
        assert all(r["balance"]["llm"]["inter_node_bytes"] > 0 for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [m for m in MODES if m != "none"])
@pytest.mark.parametrize("name", EQUAL_TO_NONE)
def test_balanced_equals_unbalanced(gloo, name, mode):
    """`--balance <mode>` and `--balance none` on the same global batches: equal losses, grads, parameters."""
    base, base_grads, base_params = gloo[0][(name, "none")]
    got, grads, params = gloo[0][(name, mode)]
    for a, b in zip(got, base, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-9, abs=0)
    assert_close(grads, base_grads, 1e-9)
    assert_close(params, base_params, 1e-8)
    if mode == "orch":
        assert any(r["balance"]["llm"]["max_cost"] < r["balance"]["llm"]["max_cost_before"] for r in got)
    assert all(r["balance"]["llm"]["max_cost"] == r["balance"]["llm"]["max_cost_before"] for r in base)


def test_a_profiled_plan_gives_the_dispatcher_its_costs_before_the_calibration(specs):
    """A plan priced with a profile records each module's per-sample seconds: the orchestrator balances by
    them, the start-up calibration covers only the modules without one, and the FLOP model the rest."""
    model, data = specs
    base = _plan(specs, "colocated_enc_dp4_llm_dp2_tp2")
    profiled = {
        "llm": SampleCost(call=1e-3, constant=5e-4, linear=3e-6, quadratic=2e-9),
        "vision": SampleCost(linear=1e-6),
    }
    modules = {m: mp.model_copy(update={"sample_cost": profiled.get(m)}) for m, mp in base.modules.items()}
    plan = base.model_copy(update={"modules": modules})
    assert modules_to_calibrate(base) == ["audio", "vision", "llm"]  # encoder_order, then the LLM
    assert modules_to_calibrate(plan) == ["audio"]
    timed = {m: SampleCost(constant=1.0, linear=2.0, quadratic=4.0) for m in ("vision", "audio", "llm")}
    grids = build_grids(plan.modules)
    orch = PostBalancer(plan, grids, "orch", 8, timed)
    assert orch.costs == {"llm": profiled["llm"], "vision": profiled["vision"], "audio": timed["audio"]}
    flops = forward_coefficients(model.modules["audio"], model.llm)
    uncalibrated = PostBalancer(plan, grids, "orch", 8)
    assert uncalibrated.costs["audio"] == SampleCost(linear=flops.per_token, quadratic=flops.per_pair)
    assert uncalibrated.costs["llm"] == profiled["llm"]
    # the dispatcher's phase carries those coefficients, and its statistics are in the profile's seconds
    batch = SyntheticBatch.build(model, data, SEED, 0)
    cols = lengths_columns(model, batch)
    origin = np.asarray([i % 2 for i in range(batch.size)], dtype=np.int64)
    spec = orch._phase("llm", origin, cols["llm"]).spec
    assert (spec.call, spec.constant, spec.linear, spec.quadratic) == (1e-3, 5e-4, 3e-6, 2e-9)
    t = orch.dispatch(0, cols)
    c = profiled["llm"]
    per_rank = [0.0, 0.0]
    for n, d in zip(cols["llm"], t.origin["llm"], strict=True):
        per_rank[d] += c.constant + c.linear * n + c.quadratic * n * n if n else 0.0
    assert t.stats["llm"]["max_cost_before"] == pytest.approx(max(per_rank), rel=1e-12)


def test_start_up_calibration_runs_only_without_a_profiled_cost(specs, monkeypatch):
    """One gloo rank in this process: TrainStep times the modules whose plan carries no cost, none otherwise."""
    import torch.distributed as dist

    import orch.runtime.train.step as step_module
    from orch.runtime.launch.procgroup import free_port, init_rank
    from orch.runtime.train.step import TrainStep

    model, _ = specs
    data = load_data("tiny-mix").model_copy(update={"global_batch": 2, "seq_len": 32})
    base = hand_plan(model, data, {"llm": (Layout(), [0])})
    profiled = base.model_copy(
        update={
            "modules": {
                m: mp.model_copy(update={"sample_cost": SampleCost(linear=1e-6)}) for m, mp in base.modules.items()
            }
        }
    )
    calls = []
    timed = SampleCost(constant=1e-3, linear=1e-5)

    def fake(model, dtype, device, max_lens, modules, say):
        calls.append(list(modules))
        return {m: timed for m in modules}

    warmed = []
    monkeypatch.setattr(step_module, "shared_calibration", fake)
    monkeypatch.setattr(step_module, "warm_up", lambda model, names, *args: warmed.append(list(names)))
    init_rank(0, 1, master="127.0.0.1", port=free_port(), timeout_s=30, backend="gloo", device=torch.device("cpu"))
    try:
        cfg = TrainConfig(device="cpu", balance="orch", calibrate=True)
        ex = TrainStep(base, data, cfg, 0, 1, device=torch.device("cpu"))
        assert calls == [["audio", "vision", "llm"]] and ex.balancer.costs == dict.fromkeys(calls[0], timed)
        assert warmed == [[]]  # the calibration grew the heap itself
        ex.finish()
        ex = TrainStep(profiled, data, cfg, 0, 1, device=torch.device("cpu"))
        assert len(calls) == 1  # nothing timed: the profile's costs
        assert sorted(warmed[1]) == ["audio", "llm", "vision"]  # but run once, untimed, to grow the heap
        assert ex.balancer.costs == dict.fromkeys(calls[0], SampleCost(linear=1e-6))
        ex.finish()
    finally:
        dist.destroy_process_group()


def test_calibration_climbs_towards_the_data_s_longest_samples(specs):
    """Beyond the fixed shapes, single samples of doubling length up to the data's longest, the last rung that
    length itself (timed while the budget lasts: tests/unit/test_calibration.py)."""
    from orch.planner.specs import DataSpec
    from orch.runtime.train.calibration import calibration_ladder, longest_sample

    assert calibration_ladder(0) == calibration_ladder(256) == ()
    assert calibration_ladder(600) == (512, 600)
    assert calibration_ladder(2048) == (512, 1024, 2048)
    model = specs[0]
    data = DataSpec.model_validate(
        {
            "global_batch": 8,
            "seq_len": 300,
            "tasks": [{"weight": 1, "tokens": {"vision": 64, "llm": 200}, "max": {"vision": 512, "llm": 1000}}],
        }
    )
    assert 64 <= longest_sample(data, model, "vision") <= 512
    assert longest_sample(data, model, "llm") == 300  # the LLM's sequences are cut at seq_len
