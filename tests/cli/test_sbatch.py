"""The sbatch text and its validation: pure functions, no cluster (golden file: tests/cli/golden/sbatch_tiny.txt)."""

from pathlib import Path

import pytest
import yaml

from orch.planner.errors import SpecError
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.launch.sbatch import (
    SlurmOptions,
    allocation,
    default_setup_text,
    executor_parameters,
    parse_time,
    render_setup,
    sbatch_text,
)
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan

GOLDEN = Path(__file__).parent / "golden" / "sbatch_tiny.txt"
WORKDIR = "/runs/tiny"


@pytest.fixture(scope="module")
def plan4():
    """4 ranks of the tiny model on 2 nodes x 2 tasks (the local-cpu cluster has 2 GPUs per node)."""
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 64})
    return hand_plan(model, data, {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "vision": (Layout(dp=4), [0, 1, 2, 3])})


def _script(plan, **opts) -> str:
    params = executor_parameters(plan, SlurmOptions(**opts), WORKDIR, default_setup_text())
    return sbatch_text(params, f"{WORKDIR}/slurm/%j", "python3")


def test_sbatch_matches_golden(plan4):
    text = _script(plan4, partition="debug", account="proj1", qos="normal", time="0:30:00")
    if not GOLDEN.exists():  # first run records it; review the diff like any other change
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_sbatch_fields(plan4):
    lines = _script(plan4, partition="gpu", account="a1", qos="high", time="1-02:00:00").splitlines()
    flags = dict(
        line[len("#SBATCH --") :].split("=", 1) for line in lines if line.startswith("#SBATCH --") and "=" in line
    )
    assert flags["nodes"] == "2" and flags["ntasks-per-node"] == "2" and flags["gpus-per-node"] == "2"
    assert flags["cpus-per-task"] == "1"  # local-cpu: cpus_per_gpu 1
    assert flags["partition"] == "gpu" and flags["account"] == "a1" and flags["qos"] == "high"
    assert flags["time"] == str(26 * 60)
    assert flags["signal"] == "USR2@90"
    assert flags["job-name"] == "orch-tiny"
    assert flags["output"] == f"{WORKDIR}/slurm/%j/%j_0_log.out"
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in srun and srun.endswith(f"python3 -u -m submitit.core._submit {WORKDIR}/slurm/%j")
    assert "export OMP_NUM_THREADS=1" in lines and f"mkdir -p {WORKDIR}" in lines
    # A node failure ends the job instead of requeueing it (orch re-enables requeue for its own checkpoint).
    assert "#SBATCH --no-requeue" in lines
    assert "mem" not in flags  # the cluster's default unless --mem


@pytest.mark.parametrize(("value", "flag"), [("1500m", "1500M"), ("64G", "64G"), ("4096", "4096"), (" 2t ", "2T")])
def test_mem_is_one_sbatch_field(plan4, value, flag):
    lines = _script(plan4, mem=value).splitlines()
    assert [line for line in lines if line.startswith("#SBATCH --mem")] == [f"#SBATCH --mem={flag}"]


@pytest.mark.parametrize("value", ["", "1.5G", "-1", "0", "1G; rm -rf /", "$(id)", "1G\n#SBATCH --uid=0", "1GB", "G"])
def test_hostile_or_malformed_mem_is_rejected(plan4, value):
    with pytest.raises(SpecError, match="--mem: expected a memory size"):
        _script(plan4, mem=value)


def test_allocation_follows_plan_and_cluster(plan4):
    assert allocation(plan4) == (2, 2)
    assert allocation(plan4.model_copy(update={"ranks_per_node": 1})) == (4, 1)


def test_short_time_limit_signals_early_enough(plan4):
    params = executor_parameters(plan4, SlurmOptions(time="2"), WORKDIR, "")
    assert params["time"] == 2 and params["signal_delay_s"] == 30


@pytest.mark.parametrize(
    ("value", "minutes"), [("90", 90), ("4:00:00", 240), ("1-00:00:00", 1440), ("2-3", 51 * 60), ("0:30", 1)]
)
def test_parse_time(value, minutes):
    assert parse_time(value) == minutes


@pytest.mark.parametrize("value", ["", "soon", "1h", "4:00:00; rm -rf /", "0", "$(reboot)"])
def test_parse_time_rejects(value):
    with pytest.raises(SpecError, match="--time"):
        parse_time(value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("partition", "gpu; rm -rf /"),
        ("partition", "gpu\n#SBATCH --uid=0"),
        ("account", "$(id)"),
        ("qos", "a`b`"),
        ("job_name", "x' ; touch /tmp/pwned; '"),
        ("job_name", 'my "job"'),
        ("partition", "-gpu"),
    ],
)
def test_hostile_flag_values_are_rejected(plan4, field, value):
    with pytest.raises(SpecError, match="expected a Slurm name"):
        _script(plan4, **{field: value})


def test_hostile_model_name_is_rejected(plan4):
    evil = plan4.model_copy(update={"model": plan4.model.model_copy(update={"name": "tiny'$(reboot)"})})
    with pytest.raises(SpecError, match="job name"):
        _script(evil)


def test_hostile_values_in_setup_are_quoted():
    lines = render_setup(
        "cd {{workdir}}\necho {{ job_name }}\n# {{ignored}}\n", {"workdir": "/x/$(rm -rf /)", "job_name": "a'b"}
    )
    assert lines == ["cd '/x/$(rm -rf /)'", "echo 'a'\"'\"'b'"]


def test_hostile_workdir_is_quoted_in_the_script(plan4):
    params = executor_parameters(plan4, SlurmOptions(), "/tmp/$(touch pwned) x", default_setup_text())
    assert "mkdir -p '/tmp/$(touch pwned) x'" in params["setup"]
    with pytest.raises(SpecError, match="newlines"):
        executor_parameters(plan4, SlurmOptions(), "/tmp/a\nreboot", default_setup_text())


def test_unknown_setup_placeholder_names_the_valid_ones():
    with pytest.raises(SpecError, match="unknown placeholder.*expected one of workdir"):
        render_setup("echo {{secret}}", {"workdir": "/w"})


def test_dry_run_prints_the_script_and_submits_nothing(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    setup = tmp_path / "setup.sh"
    setup.write_text("module load cuda\nexport RUN_DIR={{workdir}}\n")
    workdir = tmp_path / "run"
    result = cli(
        "launch",
        str(path),
        "--executor",
        "slurm",
        "--dry-run",
        "--time",
        "10",
        "--setup",
        str(setup),
        "--partition",
        "debug",
        "--workdir",
        str(workdir),
    )
    assert result.exit_code == 0, result.output
    assert "#SBATCH --partition=debug" in result.output and "#SBATCH --time=10" in result.output
    assert "module load cuda" in result.output and f"export RUN_DIR={workdir.absolute()}" in result.output
    assert "homogeneous" in result.output or "colocated" in result.output
    assert "nothing submitted" in result.output
    assert not workdir.exists()


def test_launch_mem_reaches_the_script_and_is_validated(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    args = ["launch", str(path), "--executor", "slurm", "--dry-run", "--workdir", str(tmp_path / "run")]
    result = cli(*args, "--mem", "3G")
    assert result.exit_code == 0, result.output
    assert "#SBATCH --mem=3G" in result.output.splitlines()
    bad = cli(*args, "--mem", "3G --uid=0")
    assert bad.exit_code == 1 and bad.output.startswith("error: --mem: expected a memory size")


def test_out_of_memory_errors_are_recognised():
    import torch

    from orch.runtime.launch.failures import is_out_of_memory

    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9"))
    assert not is_out_of_memory(RuntimeError("injected failure at step 1"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_launch_rejects_hostile_partition(cli, plan_file):
    path, _, _ = plan_file
    result = cli("launch", str(path), "--executor", "slurm", "--dry-run", "--partition", "gpu; rm -rf /")
    assert result.exit_code == 1
    assert result.output.startswith("error: --partition: expected a Slurm name")


def test_plan_file_round_trip_keeps_allocation(plan_file):
    path, _, _ = plan_file
    from orch.planner.plan import Plan

    plan = Plan.model_validate(yaml.safe_load(path.read_text()))
    assert allocation(plan) == (1, 2)


def test_warning_signal_only_flags_and_late_steps_still_requeue(monkeypatch):
    """The tasks' USR2 handler sets the stop flag only; if no step boundary comes within the grace
    time, task 0 runs submitit's requeue handler anyway (once) and exits."""
    import os
    import signal
    import time

    from orch.runtime.launch import slurm

    calls: list[int] = []
    exits: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    monkeypatch.setattr(slurm.os, "_exit", exits.append)
    try:
        stop = slurm._StopOnSignal(0, grace_s=0.2)
        assert stop.preemption.armed
        os.kill(os.getpid(), signal.SIGUSR2)
        end = time.monotonic() + 5
        while not stop.preemption.requested and time.monotonic() < end:
            time.sleep(0.01)
        assert stop.preemption.requested and calls == []  # flagged, submitit's handler not run yet
        assert stop._timer is not None
        stop._timer.join(5)
        assert calls == [signal.SIGUSR2] and exits == [1]
        stop.requeue()
        assert calls == [signal.SIGUSR2]  # never twice
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_stop_flag_is_never_checked_unarmed():
    from orch.runtime.preemption import Preemption

    stop = Preemption()
    stop.request()
    assert stop.agreed() is False  # the local launcher's: no collective, never stops
