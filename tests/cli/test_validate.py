"""`orch validate`: predicted vs measured from a hand-written metrics file, errors, and one real loop."""

import json

import pytest
import yaml

from orch.planner.plan import Plan, Prediction
from orch.runtime.profile.validate import Validation

pytestmark = pytest.mark.usefixtures("forked_ranks")  # a run's ranks forked (tests/conftest.py)


@pytest.fixture
def known_plan(plan_file, tmp_path):
    """The 2-rank tiny plan with a known prediction."""
    path, _, _ = plan_file
    plan = Plan.model_validate(yaml.safe_load(path.read_text()))
    phases = {"vision": 0.1, "vision->llm": 0.02, "llm": 0.3}
    terms = {
        "vision fwd+bwd": 0.1,
        "audio fwd+bwd": 0.0,
        "llm fwd+bwd": 0.2,
        "boundaries": 0.02,
        "grad sync+optimizer": 0.15,
        "orchestrator": 0.01,
        "step bookkeeping": 0.05,
    }
    pred = Prediction(step_time_s=0.5, tokens_per_s=0, mfu=0, phases=phases, terms=terms)
    plan = plan.model_copy(update={"predicted": pred})
    out = tmp_path / "known.yaml"
    out.write_text(yaml.safe_dump(plan.model_dump(mode="json")))
    return out


def _metrics(tmp_path, steps: list[float]):
    """Two ranks: rank 0 computes longer, so rank 1 waits for it inside every collective."""
    lines = []
    for k, s in enumerate(steps):
        slow = {
            "vision.fwd": 0.05,
            "vision.bwd": 0.05,
            "llm.fwd_bwd": 0.25,
            "vision.boundary": 0.01,
            "vision.boundary_bwd": 0.01,
            "grad_sync": 0.1,
            "optimizer": 0.01,
            "dispatch": 0.004,
            "llm.route": 0.006,
            "step": s,
        }
        fast = {
            **slow,
            "vision.fwd": 0.04,
            "vision.bwd": 0.04,
            "llm.fwd_bwd": 0.2,
            "vision.boundary": 0.03,  # waits for rank 0's forward
            "vision.boundary_bwd": 0.06,  # and for its LLM
            "grad_sync": 0.15,
            "optimizer": 0.02,
            "dispatch": 0.01,
        }
        ranks = {"0": slow, "1": fast}
        lines.append(json.dumps({"step": k, "loss": 1.0, "tokens": 10, "step_time_s": s, "setup_s": 0, "ranks": ranks}))
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_validate_on_a_hand_written_metrics_file(cli, tmp_path, known_plan):
    metrics = _metrics(tmp_path, [9.0, 0.45, 0.6, 0.5])  # step 0 (warm-up) is left out: median 0.5
    result = cli("validate", "--plan", str(known_plan), "--metrics", str(metrics), "--json")
    assert result.exit_code == 0, result.output
    v = Validation.model_validate_json(result.stdout)
    assert v.predicted_step_time_s == pytest.approx(0.5)
    assert v.measured_step_time_s == pytest.approx(0.5)
    assert v.relative_error == pytest.approx(0.0)
    assert v.steps_used == 3
    rows = {r.phase: r for r in v.phases}
    # compute: the slowest rank's; collectives: the least any rank spent in them (the last to arrive)
    assert rows["vision fwd+bwd"].measured_s == pytest.approx(0.10)
    assert rows["vision fwd+bwd"].relative_error == pytest.approx(0.0)
    assert rows["llm fwd+bwd"].measured_s == pytest.approx(0.25)
    assert rows["llm fwd+bwd"].relative_error == pytest.approx(-0.05 / 0.25)
    assert rows["boundaries"].measured_s == pytest.approx(0.02)
    assert rows["grad sync+optimizer"].measured_s == pytest.approx(0.12)  # min grad sync + max optimizer
    assert rows["grad sync+optimizer"].relative_error == pytest.approx(0.03 / 0.12)
    assert rows["orchestrator (dispatch, routes)"].measured_s == pytest.approx(0.01)
    # per step: the step less every row above (0.10 + 0 + 0.25 + 0.02 + 0.12 + 0.01 = 0.50); median of 0, .1, 0
    assert rows["bookkeeping, waits, python"].measured_s == pytest.approx(0.0)
    assert rows["bookkeeping, waits, python"].predicted_s == pytest.approx(0.05)
    # the table form prints the same rows
    table = cli("validate", "--plan", str(known_plan), "--metrics", str(metrics))
    assert table.exit_code == 0, table.output
    assert "vision fwd+bwd" in table.output and "+0%" in table.output


def test_validate_relative_error_sign(cli, tmp_path, known_plan):
    metrics = _metrics(tmp_path, [1.0, 1.0])
    v = json.loads(cli("validate", "--plan", str(known_plan), "--metrics", str(metrics), "--json").stdout)
    assert v["relative_error"] == pytest.approx(-0.5)  # predicted 0.5 s, measured 1.0 s


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such metrics file"),
        ("", "no metrics records"),
        ("{not json\n", "line 1: not JSON"),
        ('{"step": 0}\n', "line 1: expected a metrics record (`orch schema metrics`): loss: field required"),
        (
            '{"step": 0, "loss": 1, "tokens": 1, "step_time_s": "x"}\n',
            "line 1: expected a metrics record (`orch schema metrics`): step_time_s",
        ),
    ],
)
def test_validate_bad_metrics_is_one_line(cli, tmp_path, known_plan, content, message):
    path = tmp_path / "m.jsonl"
    if content is not None:
        path.write_text(content)
    result = cli("validate", "--plan", str(known_plan), "--metrics", str(path))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_validate_missing_plan_is_one_line(cli, tmp_path):
    metrics = _metrics(tmp_path, [0.5])
    result = cli("validate", "--plan", str(tmp_path / "nope.yaml"), "--metrics", str(metrics))
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"error: {tmp_path / 'nope.yaml'}: no such file"]


def test_profile_plan_launch_validate_end_to_end(cli, tmp_path, monkeypatch):
    """The loop on 2 local ranks: profile --quick (two lengths only), plan with it, launch 3 steps, validate --json."""
    import dataclasses

    from orch.planner.profile import Profile
    from orch.runtime.profile import local as profile_local

    real = profile_local.run_profile_local

    def fewer_lengths(cfg, **kw):
        # max_steal below any share: the one pass counts as stolen and is timed again, once (--passes 1)
        return real(dataclasses.replace(cfg, lengths=(16, 64), max_steal=-1.0), **kw)

    monkeypatch.setattr(profile_local, "run_profile_local", fewer_lengths)

    prof = tmp_path / "profile.json"
    r = cli(
        "profile",
        "-m",
        "tiny",
        "--nproc",
        "2",
        "--quick",
        "--passes",
        "1",
        "--max-bytes",
        "32768",
        "--out",
        str(prof),
        "--workdir",
        str(tmp_path / "prof"),
        "--json",
    )
    assert r.exit_code == 0, r.output
    profile = Profile.model_validate_json(prof.read_text())
    assert Profile.model_validate_json(r.stdout) == profile
    assert set(profile.modules) == {"vision", "audio", "llm"}
    assert set(profile.modules["llm"].block) == {1, 2}
    assert profile.modules["llm"].step_overhead_s > 0 and profile.modules["llm"].rest is not None
    assert profile.nproc == 2 and profile.backend == "gloo" and "intra_node" in profile.links
    assert profile.steal_share is not None and 0 <= profile.steal_share <= 1  # Linux: /proc/stat says
    assert profile.passes_repeated == 1
    # the runtime's own per-step work, measured through its code: boundary moves and the orchestrator
    assert profile.boundary is not None and profile.boundary.alpha_s >= 0 and profile.balance_step_s > 0
    assert {row.op for row in profile.collectives} >= {"all_reduce", "all_gather", "all_to_all", "send_recv"}

    plan = tmp_path / "plan.yaml"
    fixes = [x for a in ("vision.cp=1", "audio.cp=1", "llm.cp=1", "llm.pp=1", "llm.ep=1") for x in ("--fix", a)]
    r = cli(
        "plan",
        "-m",
        "tiny",
        "-c",
        "local-cpu",
        "--nodes",
        "1",
        "--profile",
        str(prof),
        "--placement",
        "homogeneous",
        *fixes,
        "--out",
        str(plan),
        "--json",
        "--top",
        "0",
    )
    assert r.exit_code == 0, r.output
    r = cli("launch", str(plan), "--steps", "3", "--workdir", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    r = cli("validate", "--plan", str(plan), "--metrics", str(tmp_path / "run" / "metrics.jsonl"), "--json")
    assert r.exit_code == 0, r.output
    v = json.loads(r.stdout)
    assert v["predicted_step_time_s"] == pytest.approx(
        Plan.model_validate(yaml.safe_load(plan.read_text())).predicted.step_time_s
    )
    assert v["measured_step_time_s"] > 0
    assert v["relative_error"] == pytest.approx(
        (v["predicted_step_time_s"] - v["measured_step_time_s"]) / v["measured_step_time_s"]
    )
    assert v["steps_used"] == 2


def test_validate_pools_several_runs(cli, tmp_path, known_plan):
    """Each run's first step is left out; the rest are pooled: medians over 0.45, 0.5 and 0.6, 0.7."""
    first = _metrics(tmp_path, [9.0, 0.45, 0.5])
    (tmp_path / "a.jsonl").write_text(first.read_text())
    second = _metrics(tmp_path, [8.0, 0.6, 0.7])
    result = cli(
        "validate",
        "--plan",
        str(known_plan),
        "--metrics",
        str(tmp_path / "a.jsonl"),
        "--metrics",
        str(second),
        "--json",
    )
    assert result.exit_code == 0, result.output
    v = Validation.model_validate_json(result.stdout)
    assert v.runs == 2 and v.steps_used == 4
    assert v.measured_step_time_s == pytest.approx((0.5 + 0.6) / 2)


def test_memory_rows_set_predicted_beside_measured_per_set_of_modules():
    from orch.planner.loading import load_data
    from orch.planner.plan import Layout
    from orch.runtime.models.registry import load_model
    from orch.runtime.plans import hand_plan
    from orch.runtime.profile.validate import memory_rows
    from orch.runtime.workdir.metrics import StepRecord

    model, data = load_model("tiny"), load_data("tiny-mix")
    plan = hand_plan(model, data, {"llm": (Layout(dp=2), [1, 2]), "vision": (Layout(dp=1), [0]),
                                   "audio": (Layout(dp=1), [0])})  # fmt: skip
    plan = plan.model_copy(
        update={"modules": {n: m.model_copy(update={"memory_gb": 1.0}) for n, m in plan.modules.items()}}
    )
    record = StepRecord(step=0, loss=1.0, tokens=1, step_time_s=1.0, memory={
        "0": {"state_bytes": 10**9, "peak_bytes": 4 * 10**9}, "1": {"state_bytes": 10**9, "peak_bytes": 2 * 10**9},
        "2": {"state_bytes": 10**9, "peak_bytes": 10**9}})  # fmt: skip
    rows = {r.modules: r for r in memory_rows(plan, record)}
    assert set(rows) == {"vision+audio", "llm"}
    assert (rows["vision+audio"].ranks, rows["vision+audio"].predicted_gb, rows["vision+audio"].measured_peak_gb) == (
        1,
        2.0,
        4.0,
    )
    assert (rows["llm"].ranks, rows["llm"].measured_peak_gb, rows["llm"].relative_error) == (2, 2.0, -0.5)
