"""`orch launch --executor slurm` against the real local Slurm cluster (`make slurm-up`), never a mock.

Skipped with a reason when no cluster answers, except under CI=true, where they must run. Every wait is
bounded; a job still alive at the end of a test is cancelled.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from orch.planner.errors import OrchError
from orch.planner.loading import load_data, load_model
from orch.planner.plan import Layout
from orch.runtime.executor import RunConfig
from orch.runtime.plans import hand_plan
from orch.runtime.reference import run_reference
from orch.runtime.slurm import job_status, submit
from orch.runtime.slurm_sbatch import SlurmOptions

JOB_TIMEOUT_S = 150
SEED = 3


def _cluster_answers() -> str | None:
    """None when sinfo lists idle nodes, else why not."""
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10, check=False)
    except FileNotFoundError:
        return "sinfo not installed"
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    if done.returncode != 0:
        return f"sinfo failed: {done.stderr.strip()[:200]}"
    if not any(s.strip() in ("idle", "mix", "alloc") for s in done.stdout.splitlines()):
        return f"no usable nodes: {done.stdout.split()}"
    return None


@pytest.fixture(scope="module")
def slurm_cluster():
    why = _cluster_answers()
    if why is not None:
        message = f"no Slurm cluster answers ({why}); run `make slurm-up` first"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state" / "jobs"


@pytest.fixture(scope="module")
def specs():
    return load_model("tiny"), load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 64})


def _plan(specs, layouts):
    model, data = specs
    plan = hand_plan(model, data, layouts)
    return plan.model_copy(update={"ranks_per_node": 2})  # 2 nodes x 2 tasks


HOMOGENEOUS = {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "vision": (Layout(dp=4), [0, 1, 2, 3])}
DISAGGREGATED = {
    "llm": (Layout(dp=2), [2, 3]),
    "vision": (Layout(dp=2), [0, 1]),
    "audio": (Layout(dp=2), [0, 1]),
}


def _wait(job_id: str, until, timeout_s: float = JOB_TIMEOUT_S, poll_s: float = 1.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        st = job_status(job_id)
        if until(st):
            return st
        time.sleep(poll_s)
    subprocess.run(["scancel", job_id], check=False)
    raise AssertionError(f"job {job_id} still {st.state} after {timeout_s} s")


def _release_requeued(job_id: str, timeout_s: float = 60) -> None:
    """Slurm holds a requeued job for about two minutes (PENDING, Reason=BeginTime); start it now instead."""
    end = time.monotonic() + timeout_s
    seen_pending = False
    while time.monotonic() < end:
        queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=False)
        state = queued.stdout.strip()
        if state == "PENDING":
            seen_pending = True
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], capture_output=True, check=False)
        elif seen_pending and state != "PENDING":
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} was not requeued and restarted within {timeout_s} s")


def _metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _reference(specs, steps):
    model, data = specs
    return run_reference(model, data, seed=SEED, steps=steps).losses


def test_cli_launch_two_nodes_four_ranks(slurm_cluster, state_dir, specs, tmp_path, cli):
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(_plan(specs, HOMOGENEOUS).model_dump(mode="json")))
    workdir = tmp_path / "run"
    args = ["launch", str(plan_path), "--executor", "slurm", "--steps", "2", "--dtype", "float64", "--seed", str(SEED)]
    result = cli(*args, "--time", "5", "--workdir", str(workdir), "--wait")
    assert result.exit_code == 0, result.output
    (record,) = state_dir.glob("*.json")
    job_id = record.stem
    records = _metrics(workdir)
    assert [r["step"] for r in records] == [0, 1]
    assert all(set(r["ranks"]) == {"0", "1", "2", "3"} for r in records)
    for r, want in zip(records, _reference(specs, 2), strict=True):
        assert r["loss"] == pytest.approx(want, rel=1e-9, abs=0)
    status = cli("status", job_id, "--json")
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["state"] == "COMPLETED"
    logs = cli("logs", job_id, "--rank", "3")
    assert logs.exit_code == 0, logs.output
    bad = cli("logs", job_id, "--rank", "4")
    assert bad.exit_code == 1 and "error: --rank 4: the job has ranks 0..3" in bad.output


def test_disaggregated_plan_on_one_allocation(slurm_cluster, state_dir, specs, tmp_path):
    plan = _plan(specs, DISAGGREGATED)
    assert plan.placement.value == "disaggregated"
    workdir = tmp_path / "run"
    cfg = RunConfig(steps=2, seed=SEED, dtype="float64")
    record = submit(plan, specs[1], cfg, SlurmOptions(time="5"), workdir=workdir)
    st = _wait(record.job_id, lambda s: s.done)
    assert st.state == "COMPLETED", st
    records = _metrics(workdir)
    assert all(set(r["ranks"]) == {"0", "1", "2", "3"} for r in records)
    for r, want in zip(records, _reference(specs, 2), strict=True):
        assert r["loss"] == pytest.approx(want, rel=1e-9, abs=0)


def test_preempted_job_checkpoints_at_the_signal_and_resumes_there(slurm_cluster, state_dir, specs, tmp_path):
    import re

    import submitit

    from orch.runtime.checkpoint import checkpoint_root, latest_step, step_name

    workdir = tmp_path / "run"
    steps = 10
    # No --checkpoint-every: the only checkpoint is the one saved at the warning signal.
    cfg = RunConfig(steps=steps, seed=SEED, dtype="float64")
    record = submit(_plan(specs, HOMOGENEOUS), specs[1], cfg, SlurmOptions(time="10"), workdir=workdir)
    _wait(record.job_id, lambda s: s.step is not None and s.step >= 1, poll_s=0.2)
    # submitit's test hook: SIGTERM then the warning signal (USR2), as Slurm does on preemption.
    submitit.SlurmJob(Path(record.log_folder), record.job_id)._interrupt()
    _release_requeued(record.job_id)
    st = _wait(record.job_id, lambda s: s.done)
    assert st.state == "COMPLETED", st
    log = (Path(record.log_folder) / f"{record.job_id}_0_log.err").read_text()
    assert "SIGUSR2" in log and "REQUEUE" in log
    saved = [int(n) for n in re.findall(r"orch: warning signal: saved checkpoint step (\d+)", log)]
    assert len(saved) == 1 and 1 < saved[0] < steps, log
    at = saved[0]
    # The checkpoint saved at the signal is the one the requeued job resumed from (and the only one).
    assert latest_step(workdir) == at
    assert sorted(p.name for p in checkpoint_root(workdir).glob("step_*")) == [step_name(at)]
    records = _metrics(workdir)
    # Every step exactly once: the requeued job recomputed nothing, and its first step is the saved one.
    assert [r["step"] for r in records] == list(range(steps))
    assert [r["step"] for r in records if r["setup_s"] > 0] == [0, at]
    for r, want in zip(records, _reference(specs, steps), strict=True):
        assert r["loss"] == pytest.approx(want, rel=1e-9, abs=0)


def test_scancel_is_reported_cancelled(slurm_cluster, state_dir, specs, tmp_path, cli):
    workdir = tmp_path / "run"
    cfg = RunConfig(steps=500, seed=SEED, dtype="float64")
    record = submit(_plan(specs, HOMOGENEOUS), specs[1], cfg, SlurmOptions(time="5"), workdir=workdir)
    _wait(record.job_id, lambda s: s.state == "RUNNING" or s.done)
    result = cli("cancel", record.job_id)
    assert result.exit_code == 0, result.output
    t0 = time.monotonic()
    st = _wait(record.job_id, lambda s: s.done, timeout_s=60)
    assert st.state == "CANCELLED" and time.monotonic() - t0 < 60


def test_failing_rank_is_reported_and_wait_fails(slurm_cluster, state_dir, specs, tmp_path, cli):
    from orch.cli.jobs_cmd import launch_slurm

    workdir = tmp_path / "run"
    cfg = RunConfig(steps=3, seed=SEED, dtype="float64", fail_at=(2, 1))
    t0 = time.monotonic()
    with pytest.raises(OrchError, match=r"rank 2 failed: RuntimeError: injected failure at step 1") as exc:
        launch_slurm(
            _plan(specs, HOMOGENEOUS),
            specs[1],
            cfg,
            SlurmOptions(time="5"),
            workdir=str(workdir),
            dry_run=False,
            wait=True,
        )
    assert time.monotonic() - t0 < JOB_TIMEOUT_S
    (record,) = state_dir.glob("*.json")
    st = job_status(record.stem)
    assert st.state == "FAILED" and st.failure is not None and st.failure.rank == 2
    assert st.failure.log.endswith(f"{record.stem}_2_log.err") and Path(st.failure.log).exists()
    assert "injected failure at step 1" in Path(st.failure.log).read_text()
    assert st.failure.log in str(exc.value)
    status = cli("status", record.stem)
    assert status.exit_code == 0 and "rank 2 failed" in status.output


def test_status_of_unknown_job_is_one_line(state_dir, cli):
    result = cli("status", "999999")
    assert result.exit_code == 1 and result.output.startswith("error: job 999999: no record in")
    result = cli("cancel", "12; rm -rf /")
    assert result.exit_code == 1 and "is not a Slurm job id" in result.output
