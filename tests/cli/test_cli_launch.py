"""`orch launch` through the CLI: a real local run, the metrics file, and user errors."""

import json

import pytest
import yaml

from orch.runtime.train.single_process import run_reference


@pytest.mark.slow
def test_launch_writes_metrics_with_the_reference_loss(cli, plan_file, tmp_path):
    path, model, data = plan_file
    workdir = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text("optimizer: sgd\nlr: 0.1\n")  # SGD: step 1's loss shows step 0's gradient as it is
    args = ["launch", str(path), "--nproc", "2", "--steps", "2", "--seed", "5", "--dtype", "float64"]
    result = cli(*args, "--config", str(config), "--workdir", str(workdir))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    want = run_reference(model, data, seed=5, steps=2, optimizer="sgd", lr=0.1).losses
    assert [r["step"] for r in records] == [0, 1]
    for r, loss in zip(records, want, strict=True):
        assert r["loss"] == pytest.approx(loss, rel=1e-9, abs=0)
        assert r["tokens"] > 0 and r["step_time_s"] > 0
        assert set(r["ranks"]) == {"0", "1"}
        assert {"llm.fwd_bwd", "vision.boundary", "grad_sync"} <= set(r["ranks"]["0"])


def test_launch_bad_plan_is_one_line(cli, tmp_path):
    bad = tmp_path / "plan.yaml"
    bad.write_text("version: 1\nplacement: sideways\n")
    result = cli("launch", str(bad))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines and all(line.startswith(f"error: {bad}: ") for line in lines), result.output
    assert any("placement" in line for line in lines)
    assert "Traceback" not in result.output


def test_launch_missing_plan_file(cli, tmp_path):
    result = cli("launch", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {tmp_path / 'nope.yaml'}: no such file"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--executor", "pbs", "expected one of local, slurm, torchrun"),
        ("--dtype", "float16", "expected one of float32"),
    ],
)
def test_launch_bad_flags(cli, plan_file, flag, value, message):
    path, _, _ = plan_file
    result = cli("launch", str(path), flag, value)
    assert result.exit_code == 1
    assert f"error: {flag}: {message}" in result.output


def test_launch_wrong_nproc(cli, plan_file):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--nproc", "3")
    assert result.exit_code == 1
    assert "error: --nproc: the plan needs 2 processes, got 3" in result.output


def test_launch_unsupported_layout_fails_before_starting(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    doc = yaml.safe_load(path.read_text())
    doc["modules"]["vision"]["layout"] = {"tp": 1, "cp": 1, "dp": 1, "pp": 2, "ep": 1}
    path.write_text(yaml.safe_dump(doc))
    result = cli("launch", str(path), "--workdir", str(tmp_path / "w"))
    assert result.exit_code == 1
    assert "error: modules.vision.layout.pp: 2: only the LLM runs pipeline stages" in result.output


@pytest.mark.slow
def test_launch_trace_covers_every_rank_and_module(cli, plan_file, tmp_path, forked_ranks):
    path, model, _ = plan_file
    trace = tmp_path / "trace.json"
    config = tmp_path / "train.yaml"
    config.write_text(f"trace: {trace}\n")
    args = ["launch", str(path), "--nproc", "2", "--steps", "2", "--dtype", "float64", "--config", str(config)]
    result = cli(*args, "--workdir", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    events = json.loads(trace.read_text())["traceEvents"]
    assert events and all(e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0 for e in events)
    assert {e["tid"] for e in events} == {"rank 0", "rank 1"}
    assert set(model.modules) <= {e["pid"] for e in events}
    names = {e["name"] for e in events}
    assert {"forward", "backward", "boundary", "grad_sync", "optimizer"} <= names
    assert {e["args"]["step"] for e in events} == {0, 1}


def test_a_workdir_in_use_is_refused_before_a_task_is_written_or_submitted(cli, plan_file, tmp_path):
    import os

    from orch.runtime.workdir.run_lock import RunLock

    path, _, _ = plan_file
    work = tmp_path / "busy"
    held = RunLock(work)  # a running launch's lock (this process's own descriptor: flock is per open file)
    held.acquire()
    try:
        for executor in ("torchrun", "slurm", "local"):
            result = cli("launch", str(path), "--executor", executor, "--workdir", str(work))
            assert result.exit_code == 1, result.output
            assert result.output.strip() == (
                f"error: {work}: in use by pid {os.getpid()} on {os.uname().nodename} (job local, since "
                f"{result.output.split('since ')[1].split(')')[0]}) ({work / 'run.lock'}); wait for it to end, stop "
                "it, or choose another --workdir"
            )
        assert sorted(p.name for p in work.iterdir()) == ["run.lock"]  # no task.pkl, no plan.json, no job record
    finally:
        held.release()


def test_a_workdir_of_another_model_is_refused_before_a_job_is_submitted(cli, plan_file, tmp_path):
    from orch.planner.plan import Plan

    path, _, _ = plan_file
    work = tmp_path / "other"
    work.mkdir()
    plan = Plan.model_validate(yaml.safe_load(path.read_text()))
    llm = plan.model.modules["llm"].model_copy(update={"layers": 2})
    other = plan.model_copy(
        update={"model": plan.model.model_copy(update={"modules": {**plan.model.modules, "llm": llm}})}
    )
    (work / "plan.json").write_text(other.model_dump_json())
    for executor in ("torchrun", "slurm", "local"):
        result = cli("launch", str(path), "--executor", executor, "--workdir", str(work))
        assert result.exit_code == 1, result.output
        assert result.output.strip() == (
            f"error: {work}: holds a run of another model (modules.llm.layers: 2 then, 4 now): launch with "
            "--no-resume to start over (the old run is moved aside) or choose another --workdir"
        )
    assert sorted(p.name for p in work.iterdir()) == ["plan.json"]  # no task.pkl, no lock, no job record


def test_report_to_is_comma_separated_and_checked(cli, plan_file, launched_tasks, monkeypatch):
    import orch.runtime.reporting as reporting

    path, _, _ = plan_file
    installed = {"tensorboard", "mlflow"}  # as if: CI installs tensorboard only (the dev extra)
    real = reporting.importlib.util.find_spec
    monkeypatch.setattr(
        reporting.importlib.util, "find_spec", lambda name: object() if name in installed else real(name)
    )
    assert (r := cli("launch", str(path), "--report-to", "tensorboard, mlflow")).exit_code == 0, r.output
    assert (r := cli("launch", str(path), "--report-to", "none")).exit_code == 0, r.output
    assert [t.cfg.report_to for t in launched_tasks] == [["tensorboard", "mlflow"], []]

    bad = cli("launch", str(path), "--report-to", "tensorboard,comet")
    assert bad.exit_code == 1 and bad.output.startswith(
        "error: --report-to: expected one of tensorboard, wandb, mlflow"
    )
    assert "Traceback" not in bad.output

    monkeypatch.setattr(reporting.importlib.util, "find_spec", lambda name: None)
    missing = cli("launch", str(path), "--report-to", "wandb")
    assert missing.exit_code == 1
    assert (
        missing.output
        == "error: --report-to: wandb is not installed: pip install wandb (or pip install 'orch[report]')\n"
    )
    assert len(launched_tasks) == 2  # nothing started


def test_watchdog_flag_sets_the_config(cli, plan_file, launched_tasks):
    path, _, _ = plan_file
    assert (r := cli("launch", str(path), "--watchdog-s", "45")).exit_code == 0, r.output
    assert launched_tasks[0].cfg.watchdog_s == 45 and launched_tasks[0].watchdog_s == 45
    bad = cli("launch", str(path), "--watchdog-s", "-1")
    assert bad.exit_code == 1 and bad.output.startswith("error: --watchdog-s: expected a value >= 0, got -1")


def test_a_local_dry_run_starts_nothing(cli, plan_file, launched_tasks, tmp_path):
    path, _, _ = plan_file
    work = tmp_path / "run"
    result = cli("launch", str(path), "--dry-run", "--workdir", str(work))
    assert result.exit_code == 0, result.output
    assert "dry run: would launch the" in result.output and "started nothing" in result.output
    assert launched_tasks == [] and not work.exists()
