"""`orch profile`: the fits, nccl-tests' bus factors, the cases and the profile built from them, the schema
round-trip, the planner using a profile, errors."""

import json

import pytest
import yaml

from orch.planner.costs import module_cost
from orch.planner.loading import load_cluster, load_data
from orch.planner.plan import Layout, Recompute
from orch.planner.profile import BoundaryFit, CollectiveRow, ComputeFit, LinkFit, ModuleProfile, Profile
from orch.runtime.models.registry import load_model
from orch.runtime.profile.build import build_profile
from orch.runtime.profile.cases import (
    BlockCase,
    CommCase,
    OverheadCase,
    ProfileConfig,
    RestCase,
    RuntimeCase,
    StepCase,
    build_cases,
)
from orch.runtime.profile.fit import bandwidths, bus_factor, fit_alpha_beta, fit_compute


def test_fit_recovers_exact_coefficients():
    call, c0, c1, c2 = 3e-4, 2e-5, 1e-6, 4e-9
    pts = [(k, n, call + k * (c0 + c1 * n + c2 * n * n)) for k in (1, 4) for n in (8, 16, 64, 192, 384)]
    f, err = fit_compute(pts)
    assert (f.call, f.constant, f.linear, f.quadratic) == pytest.approx((call, c0, c1, c2), rel=1e-6)
    assert err < 1e-9


def test_fit_with_one_batch_size_has_no_call_term():
    pts = [(1, n, 1e-4 + 2e-6 * n + 3e-9 * n * n) for n in (16, 64, 192)]
    f, _ = fit_compute(pts)
    assert f.call == 0.0
    assert (f.constant, f.linear, f.quadratic) == pytest.approx((1e-4, 2e-6, 3e-9), rel=1e-6)


def test_fit_keeps_small_micro_batches_within_the_noise():
    """3% noise on times spanning 40x, the largest ones read high: the fit minimises relative error
    under c >= 0, so the small micro-batches (call overhead dominant, what the runtime runs) stay
    within the noise. An unweighted fit lets the large points pull the call term down by 30%."""
    call, c1 = 2e-3, 1e-5
    grid = [(k, n) for k in (1, 4) for n in (16, 64, 512, 2048)]
    noise = [0.97] * 6 + [1.03] * 2
    f, err = fit_compute([(k, n, (call + k * c1 * n) * e) for (k, n), e in zip(grid, noise, strict=True)])
    assert min(f.call, f.constant, f.linear, f.quadratic) >= 0.0
    assert err < 0.07
    assert f.call == pytest.approx(call, rel=0.1)


def test_fit_reports_its_error_and_never_goes_negative():
    pts = [(1, 16, 1.0), (1, 64, 1.2), (1, 192, 0.9), (4, 16, 4.0)]
    f, err = fit_compute(pts)
    assert min(f.call, f.constant, f.linear, f.quadratic) >= 0.0
    assert err > 0.01
    with pytest.raises(ValueError, match="points"):
        fit_compute([(1, 16, 1.0)])


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("all_to_all", 2, 0.5),
        ("send_recv", 2, 1.0),
    ],
)
def test_bus_factors_are_nccl_tests(op, n, factor):
    assert bus_factor(op, n) == pytest.approx(factor)


def test_algbw_and_busbw():
    algbw, busbw = bandwidths("all_reduce", 4, 1_000_000_000, 0.5)
    assert (algbw, busbw) == pytest.approx((2.0, 3.0))
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor("broadcast_all", 2)


def test_alpha_beta_fit_is_exact_on_a_line():
    alpha, gbps = 50e-6, 12.5
    pts = [(b, alpha + b / (gbps * 1e9)) for b in (1024, 32768, 1 << 20, 16 << 20)]
    a, g = fit_alpha_beta(pts)
    assert a == pytest.approx(alpha, rel=1e-6)
    assert g == pytest.approx(gbps, rel=1e-6)
    with pytest.raises(ValueError, match="two message sizes"):
        fit_alpha_beta(pts[:1])


def _cfg(**kw) -> ProfileConfig:
    model, data = load_model("tiny"), load_data("tiny-mix")
    return ProfileConfig(model.model_dump_json(), data.model_dump_json(), ranks_per_node=2, quick=True, **kw)


def test_cases_have_distinct_keys_and_one_peak_per_block_group():
    model = load_model("tiny")
    one, two = build_cases(_cfg(), model, 2), build_cases(_cfg(), model, 4)
    for cases in (one, two):
        keys = [c.key for c in cases]
        runtime = next(c for c in cases if isinstance(c, RuntimeCase))
        keys += [k for p in runtime.boundaries for k in (p.key, p.bytes_key)]
        assert len(set(keys)) == len(keys)
        peaks = [(c.module, c.tp, c.k, c.length) for c in cases if isinstance(c, BlockCase) and c.peak]
        cfg = _cfg()
        assert peaks == [(n, t, 4, max(cfg.seq_lengths(n, "llm"))) for n in model.modules for t in (1, 2)]
    assert {c.link for c in one if isinstance(c, CommCase)} == {"intra_node"}  # one node: no inter-node link
    assert {c.link for c in two if isinstance(c, CommCase)} == {"intra_node", "inter_node"}
    assert {c.module for c in build_cases(_cfg(modules=("llm",)), model, 2) if isinstance(c, BlockCase)} == {"llm"}


def test_blocks_are_timed_at_the_lengths_the_data_has():
    """Median, p90 and the largest sample per module (the LLM's capped at seq_len), above a short ladder."""
    from orch.planner.data import sample_lengths
    from orch.runtime.profile.cases import data_lengths

    cfg, data = _cfg(), load_data("tiny-mix")
    for n in ("vision", "audio", "llm"):
        values = sorted(
            min(v, data.seq_len) if n == "llm" else v for x in sample_lengths(data, 4096, 0) if (v := x.get(n, 0)) > 0
        )
        seen = data_lengths(cfg.data_json, n, "llm")
        assert seen == tuple(sorted({values[len(values) // 2], values[int(0.9 * (len(values) - 1))], values[-1]}))
        lengths = cfg.seq_lengths(n, "llm")
        assert set(seen) <= set(lengths) and max(lengths) == values[-1] and min(lengths) == 16
    text_only = load_data("tiny-mix").model_copy(update={"tasks": [load_data("tiny-mix").tasks[0]]})
    cfg = ProfileConfig(load_model("tiny").model_dump_json(), text_only.model_dump_json(), ranks_per_node=2, quick=True)
    assert cfg.seq_lengths("vision", "llm") == (16, 64, 192)  # the data never uses it: the ladder
    assert _cfg(lengths=(8, 32)).seq_lengths("llm", "llm") == (8, 32)


def test_profile_reads_each_number_through_its_case():
    """A raw record made from the case list, with times from known coefficients, builds the profile back
    (after a JSON round trip, as rank 0's file travels): fits, memory, collectives in order, links, boundary."""
    model, cfg = load_model("tiny"), _cfg(max_bytes=1 << 20)
    call, c0, c1 = 2e-4, 1e-5, 1e-7
    times, memory = {}, {}
    for c in build_cases(cfg, model, 4):
        if isinstance(c, BlockCase):
            times[c.key] = c.tp * call + c.k * (c0 + c1 * c.length)
            if c.peak:
                memory[c.key] = 1000.0 * c.tp
        elif isinstance(c, RestCase):
            times[c.key] = call + c.k * c1 * c.length
        elif isinstance(c, OverheadCase):
            times[c.key] = 0.0625 if c.alone else 0.5
        elif isinstance(c, StepCase):
            times[c.key] = 0.25
        elif isinstance(c, RuntimeCase):
            times[c.key] = 0.125
            for p in c.boundaries:
                times[p.bytes_key] = 1e6 * p.scale
                times[p.key] = 1e-3 + 1e6 * p.scale / 2e9
        elif isinstance(c, CommCase):
            times[c.key] = -1.0 if c.op == "reduce_scatter" else 1e-4 + c.nbytes / 1e9
    raw = {"times": times, "memory": memory, "group_sizes": {"intra_node": 2, "inter_node": 2}, "device": "cpu"}
    prof = build_profile(json.loads(json.dumps(raw)), model, cfg, 4, "gloo")

    assert set(prof.modules) == set(model.modules)
    for mp in prof.modules.values():
        assert set(mp.block) == {1, 2}
        for t, fit in mp.block.items():
            assert (fit.call, fit.constant, fit.linear) == pytest.approx((t * call, c0, c1), rel=1e-6)
            assert fit.memory_bytes_per_token == 1000.0 * t
        assert mp.rest is not None and (mp.rest.call, mp.rest.linear) == pytest.approx((call, c1), rel=1e-6)
        assert (mp.step_overhead_s, mp.step_overhead_alone_s) == (0.5, 0.0625)
    assert (prof.step_bookkeeping_s, prof.balance_step_s) == (0.25, 0.125)
    assert prof.boundary is not None
    assert (prof.boundary.alpha_s, prof.boundary.gbps) == pytest.approx((1e-3, 2.0), rel=1e-6)
    order = [(r.link, r.op, r.bytes) for r in prof.collectives]
    assert order == sorted(order) and "reduce_scatter" not in {r.op for r in prof.collectives}
    assert {(r.link, r.ranks) for r in prof.collectives} == {("intra_node", 2), ("inter_node", 2)}
    assert list(prof.links) == ["intra_node", "inter_node"]
    for link in prof.links.values():
        assert (link.alpha_s, link.gbps) == pytest.approx((1e-4, 1.0), rel=1e-6)


def _profile() -> Profile:
    fit = ComputeFit(constant=1e-4, linear=2e-6, quadratic=1e-9, call=5e-4, rel_error=0.05, memory_bytes_per_token=4096)
    rest = ComputeFit(constant=1e-5, linear=1e-6, call=1e-4)
    return Profile(
        device="cpu",
        backend="gloo",
        torch_version="2.13.0",
        date="2026-01-01T00:00:00+00:00",
        model="tiny",
        modules={
            n: ModuleProfile(block={1: fit, 2: fit}, rest=rest, step_overhead_s=0.01)
            for n in ("vision", "audio", "llm")
        },
        links={"intra_node": LinkFit(alpha_s=1e-4, gbps=1.0), "inter_node": LinkFit(alpha_s=2e-4, gbps=0.5)},
        collectives=[
            CollectiveRow(
                op="all_reduce", link="intra_node", ranks=2, bytes=1024, time_s=1e-4, algbw_gbps=0.01, busbw_gbps=0.01
            )
        ],
        nproc=4,
        ranks_per_node=2,
    )


def test_profile_round_trips_through_json_and_yaml(tmp_path):
    from orch.planner.io import to_yaml
    from orch.planner.loading import load_json_file

    prof = _profile()
    assert Profile.model_validate_json(prof.model_dump_json()) == prof
    path = tmp_path / "p.yaml"
    path.write_text(to_yaml(prof.model_dump(mode="json")))
    assert load_json_file(Profile, str(path)) == prof
    old = json.loads(prof.model_dump_json())
    for key in ("nproc", "ranks_per_node", "quick"):
        old.pop(key)
    for m in old["modules"].values():
        m.pop("rest"), m.pop("step_overhead_s")
        for f in m["block"].values():
            f.pop("call")
    assert Profile.model_validate(old).modules["llm"].step_overhead_s == 0.0  # version-1 files without new fields


def test_cost_model_adds_call_rest_and_step_overhead():
    model, data, cluster = load_model("tiny"), load_data("tiny-mix"), load_cluster("local-cpu")
    lay = Layout(dp=4)
    base = ModuleProfile(block={1: ComputeFit(constant=1e-4, linear=1e-6)})
    plain = Profile(device="cpu", backend="gloo", modules={"llm": base})

    def compute(prof: Profile, mb: int = 2) -> float:
        c = module_cost(model, data, cluster, "llm", lay, mb, Recompute.NONE, in_flight=1, profile=prof)
        return c.compute_s + c.fixed_s

    with_call = base.model_copy(update={"block": {1: ComputeFit(constant=1e-4, linear=1e-6, call=1e-3)}})
    calls = data.global_batch / 4 / 2
    delta = compute(Profile(device="cpu", backend="gloo", modules={"llm": with_call})) - compute(plain)
    assert delta == pytest.approx(1e-3 * calls * model.llm.layers)
    with_overhead = base.model_copy(update={"step_overhead_s": 0.25})
    assert compute(Profile(device="cpu", backend="gloo", modules={"llm": with_overhead})) == pytest.approx(
        compute(plain) + 0.25
    )
    with_rest = base.model_copy(update={"rest": ComputeFit(constant=0.0, linear=0.0, call=0.01)})
    rest = compute(Profile(device="cpu", backend="gloo", modules={"llm": with_rest}))
    assert rest == pytest.approx(compute(plain) - _datasheet_rest(plain, compute) + 0.01 * calls)


def test_step_overhead_runs_from_alone_to_every_profiled_rank_in_the_rings_steps():
    mp = ModuleProfile(block={1: ComputeFit(constant=0.0, linear=1e-6)}, step_overhead_s=0.4, step_overhead_alone_s=0.1)
    assert [mp.step_overhead(n, profiled=4) for n in (1, 2, 3, 4, 64)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4])
    assert mp.step_overhead(1, profiled=1) == 0.4  # one profiled rank: its one figure
    old = mp.model_copy(update={"step_overhead_alone_s": None})
    assert old.step_overhead(1, profiled=4) == 0.4  # a profile without the alone case: the figure over every rank
    model, data, cluster = load_model("tiny"), load_data("tiny-mix"), load_cluster("local-cpu")
    prof = Profile(device="cpu", backend="gloo", modules={"llm": mp}, nproc=4)
    fixed = [
        module_cost(model, data, cluster, "llm", Layout(dp=dp), 1, Recompute.NONE, in_flight=1, profile=prof).overhead_s
        for dp in (1, 2, 4)
    ]
    assert fixed == pytest.approx([0.1, 0.2, 0.4])  # an island of one rank reduces with no peer


def test_profile_round_trips_the_runtime_fields():
    prof = _profile().model_copy(update={"boundary": BoundaryFit(alpha_s=3e-3, gbps=0.2), "balance_step_s": 0.03})
    back = Profile.model_validate_json(prof.model_dump_json())
    assert back == prof and back.boundary is not None and back.boundary.elem_bytes == 4
    assert back.balance_step_s == 0.03
    old = json.loads(prof.model_dump_json())
    old.pop("boundary"), old.pop("balance_step_s")
    assert Profile.model_validate(old).boundary is None  # files without the runtime fields: datasheet boundary


def test_cost_model_adds_the_measured_orchestrator_step_to_the_llm_only():
    model, data, cluster = load_model("tiny"), load_data("tiny-mix"), load_cluster("local-cpu")
    lay = Layout(dp=4)
    mods = {n: ModuleProfile(block={1: ComputeFit(constant=1e-4, linear=1e-6)}) for n in ("vision", "llm")}
    plain = Profile(device="cpu", backend="gloo", modules=mods)
    balanced = plain.model_copy(update={"balance_step_s": 0.04})

    def compute(name: str, prof: Profile) -> float:
        c = module_cost(model, data, cluster, name, lay, 2, Recompute.NONE, in_flight=1, profile=prof)
        assert c.orchestrator_s == (prof.balance_step_s if name == "llm" else 0.0)
        return c.compute_s + c.fixed_s

    assert compute("llm", balanced) == pytest.approx(compute("llm", plain) + 0.04)
    assert compute("vision", balanced) == pytest.approx(compute("vision", plain))


def test_measured_boundary_replaces_the_datasheet_move_also_when_homogeneous():
    from orch.planner.candidates import SearchInput, _recv_s, _send_s, homogeneous_options
    from orch.planner.costs import GB, workload
    from orch.planner.plan import Placement

    model, data, cluster = load_model("tiny"), load_data("tiny-mix"), load_cluster("local-cpu")
    fit = BoundaryFit(alpha_s=5e-3, gbps=0.5, elem_bytes=4)
    plain = _profile()
    measured = plain.model_copy(update={"boundary": fit})
    inp_plain = SearchInput(model=model, data=data, cluster=cluster, profile=plain)
    inp = SearchInput(model=model, data=data, cluster=cluster, profile=measured)
    lay = Layout(dp=4)

    def move(e: str, dp: int) -> float:
        return fit.alpha_s + workload(model, data, e).out_tokens * model.llm.hidden * 4 / dp / (fit.gbps * GB)

    assert _send_s(inp, "vision", lay, Placement.COLOCATED) == pytest.approx(move("vision", 4))
    assert _send_s(inp_plain, "vision", lay, Placement.COLOCATED) != pytest.approx(move("vision", 4))
    assert dict(_recv_s(inp, lay, Placement.COLOCATED)) == pytest.approx({e: move(e, 4) for e in model.encoder_names})
    # homogeneous: the runtime moves too, so the measured moves join the step
    by_layout = {o.llm.describe(): o.step_s for o in homogeneous_options(inp_plain)}
    for o in homogeneous_options(inp):
        if o.llm.layout == lay:
            want = by_layout[o.llm.describe()] + sum(move(e, 4) for e in model.encoder_names)
            assert o.step_s == pytest.approx(want)


def _datasheet_rest(prof: Profile, compute) -> float:
    """The FLOP-based rest the measured one replaces: compute minus the blocks' share."""
    model, data = load_model("tiny"), load_data("tiny-mix")
    from orch.planner.costs import workload
    from orch.planner.imbalance import residual_imbalance

    w = workload(model, data, "llm")
    fit = prof.modules["llm"].block[1]
    samples = w.samples * w.stats.present / 4
    slowest = residual_imbalance(data, "llm", "llm", 4, 2, fit)  # the slowest of 4 DP ranks
    return compute(prof) - (fit.constant * samples + fit.linear * w.tokens / 4) * slowest * model.llm.layers


def test_plan_with_profile_changes_the_predicted_compute(cli, tmp_path):
    prof = tmp_path / "profile.json"
    prof.write_text(_profile().model_dump_json())
    args = ["plan", "-m", "tiny", "-c", "local-cpu", "--placement", "homogeneous", "--json", "--top", "0"]
    args += ["--fix", "llm.tp=1", "--fix", "llm.pp=1", "--fix", "llm.cp=1"]
    plain = cli(*args, "--out", str(tmp_path / "a.yaml"))
    measured = cli(*args, "--out", str(tmp_path / "b.yaml"), "--profile", str(prof))
    assert plain.exit_code == 0, plain.output
    assert measured.exit_code == 0, measured.output
    a, b = json.loads(plain.stdout), json.loads(measured.stdout)
    assert b["modules"]["llm"]["time_s"] != pytest.approx(a["modules"]["llm"]["time_s"])
    assert b["predicted"]["step_time_s"] > 0.03  # three modules x 0.01 s step overhead at least

    # The plan records the per-sample seconds it priced each module with: every block's fit at the
    # layout's TP degree (tp 1 here) plus the module's rest, for the runtime's dispatcher.
    from orch.planner.plan import Plan
    from orch.runtime.parallel.grid import build_grids
    from orch.runtime.train.calibration import modules_to_calibrate
    from orch.runtime.train.post_balance import dispatch_costs

    assert all(m["sample_cost"] is None for m in a["modules"].values())  # datasheet plan: the runtime times
    llm = b["modules"]["llm"]
    assert (llm["layout"]["tp"], llm["layout"]["cp"], llm["recompute"]) == (1, 1, "none")
    layers = load_model("tiny").llm.layers
    want = {"call": 5e-4 * layers + 1e-4, "constant": 1e-4 * layers + 1e-5, "linear": 2e-6 * layers + 1e-6}
    assert llm["sample_cost"] == pytest.approx({**want, "quadratic": 1e-9 * layers}, rel=1e-12)
    plan = Plan.model_validate(b)
    assert modules_to_calibrate(plan) == []  # every module priced from the profile: nothing timed at start-up
    costs = dispatch_costs(plan, build_grids(plan.modules))
    assert {m: c.model_dump() for m, c in costs.items()} == {m: b["modules"][m]["sample_cost"] for m in b["modules"]}
    # a plan written before the field existed still loads, and its modules are calibrated at start-up
    old = json.loads(json.dumps(b))
    for m in old["modules"].values():
        m.pop("sample_cost")
    for m in old["baseline"]["modules"].values():
        m.pop("sample_cost")
    assert sorted(modules_to_calibrate(Plan.model_validate(old))) == ["audio", "llm", "vision"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--executor", "slurm"], "--nodes: --executor slurm needs --nodes N"),
        (["--executor", "k8s"], "--executor: expected one of local, slurm, got 'k8s'"),
        (["--nproc", "0"], "--nproc: expected a positive process count, got 0"),
        (["--nproc", "3"], "--nproc: 3 is not a multiple of the cluster's 2 GPUs per node"),
        (["--max-bytes", "10"], "--max-bytes: expected at least 1024 bytes, got 10"),
        (["--passes", "0"], "--passes: expected at least one pass, got 0"),
        (["--nodes", "2"], "--nodes: only with --executor slurm"),
    ],
)
def test_profile_bad_input_is_one_line(cli, tmp_path, args, message):
    result = cli("profile", "-m", "tiny", "--out", str(tmp_path / "p.json"), *args)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {message}")


def test_profile_unknown_model_is_one_line(cli, tmp_path):
    result = cli("profile", "-m", "no-such-model", "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("error: ")


def test_profile_yaml_is_read_by_plan(tmp_path):
    from orch.planner.loading import load_json_file

    path = tmp_path / "p.yml"
    path.write_text(yaml.safe_dump(_profile().model_dump(mode="json")))
    assert load_json_file(Profile, str(path)).modules["vision"].block[2].call == 5e-4
