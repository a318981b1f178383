"""`orch launch --executor torchrun`: ranks started by real torchrun (torch's standard environment) run the
rank-start path the local launcher's run, so their losses are the local launcher's; bad input is one line."""

import hashlib
import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orch.planner.errors import OrchError
from orch.runtime.launch.rank import TORCH_ENV, RankEnv
from orch.runtime.launch.torchrun import ENTRY, read_task, torchrun_command


def _losses(workdir):
    return [json.loads(line)["loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_torchrun_ranks_train_as_the_local_launchers_do(cli, plan_file, tmp_path, train_config):
    path, _, _ = plan_file
    config = train_config(optimizer="sgd", lr=0.1)  # SGD at 0.1: every step's loss shows the last gradient
    args = ["launch", str(path), "--steps", "3", "--seed", "2", "--dtype", "float64", "--device", "cpu"]
    local = cli(*args, "--config", config, "--workdir", str(tmp_path / "local"))
    assert local.exit_code == 0, local.output
    run = cli(*args, "--config", config, "--executor", "torchrun", "--workdir", str(tmp_path / "torchrun"))
    assert run.exit_code == 0, run.output
    assert "under torchrun: 1 node(s) x 2 ranks" in run.output
    want, got = _losses(tmp_path / "local"), _losses(tmp_path / "torchrun")
    print("local   ", want)
    print("torchrun", got)
    assert len(got) == 3 and got == want  # the same float64 ops in the same order: equal, not close
    kept = yaml.safe_load((tmp_path / "torchrun" / "train.json").read_text())
    assert (kept["optimizer"], kept["steps"], kept["device"]) == ("sgd", 3, "cpu")


def test_dry_run_prints_the_torchrun_command_and_writes_the_task(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    workdir = tmp_path / "run"
    result = cli("launch", str(path), "--executor", "torchrun", "--dry-run", "--steps", "2", "--workdir", str(workdir))
    assert result.exit_code == 0, result.output
    command = result.stdout.strip().split()
    task_file = str(workdir.absolute() / "task.pkl")
    sha256 = hashlib.sha256(Path(task_file).read_bytes()).hexdigest()
    assert command[-5:] == ["-m", ENTRY, "--sha256", sha256, task_file]
    assert " --nnodes 1 --nproc-per-node 2 --standalone " in result.stdout
    task = read_task(task_file, sha256)
    assert (task.world_size, task.cfg.steps, task.workdir) == (2, 2, str(workdir))
    assert not (workdir / "metrics.jsonl").exists()  # nothing ran
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700  # created private: only its owner can plant a file


def test_the_command_of_several_nodes_needs_a_rendezvous():
    cmd = torchrun_command(
        "/w/task.pkl", sha256="ab", nodes=2, per_node=4, endpoint="head:29400", run_id="r", program=["torchrun"]
    )
    assert cmd == [
        "torchrun", "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        "head:29400", "--rdzv-id", "r", "--max-restarts", "0", "-m", ENTRY, "--sha256", "ab", "/w/task.pkl",
    ]  # fmt: skip
    with pytest.raises(OrchError, match="--rdzv-endpoint"):
        torchrun_command("/w/task.pkl", sha256="ab", nodes=2, per_node=4)


def test_rank_env_from_torchs_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
           "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}  # fmt: skip
    got = RankEnv.from_torch_env("cpu", env)
    assert got == RankEnv(3, 4, 1, 2, "h", 29500, "abc", "cpu", init_method="env://")
    with pytest.raises(OrchError, match="^LOCAL_RANK is not set: start this with torchrun"):
        RankEnv.from_torch_env("cpu", {k: v for k, v in env.items() if k != "LOCAL_RANK"})
    with pytest.raises(OrchError, match="^MASTER_PORT='x': expected a non-negative integer"):
        RankEnv.from_torch_env("cpu", {**env, "MASTER_PORT": "x"})


def _rank(args, env):
    return subprocess.run([sys.executable, "-m", ENTRY, *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_rank_entry_point_refuses_bad_input_in_one_line(cli, plan_file, tmp_path):
    bare = {k: v for k, v in os.environ.items() if k not in TORCH_ENV}
    ranked = {**bare, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": "1"}  # fmt: skip
    missing = tmp_path / "nope.pkl"
    done = _rank(["--sha256", "ab", str(missing)], ranked)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: {missing}: no such task file (`orch launch --executor torchrun` writes " \
        "WORKDIR/task.pkl)"  # fmt: skip
    done = _rank([str(missing)], ranked)  # no sha256: a task file is never unpickled unchecked
    assert done.returncode == 2 and done.stderr.startswith(
        "usage: python -m orch.runtime.launch.torchrun_rank --sha256"
    )

    path, _, _ = plan_file
    result = cli("launch", str(path), "--executor", "torchrun", "--dry-run", "--workdir", str(tmp_path))
    assert result.exit_code == 0
    sha256, task_file = result.stdout.split()[-2:]
    done = _rank(["--sha256", sha256, task_file], bare)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: RANK is not set: start this with torchrun (or a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, "
        "MASTER_ADDR, MASTER_PORT)"
    ]
    done = _rank(["--sha256", sha256, task_file], {**ranked, "WORLD_SIZE": "3"})
    assert done.returncode != 0 and done.stderr.strip() == f"error: WORLD_SIZE=3: the task in {task_file} needs 2 ranks"
    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    junk = hashlib.sha256(b"not a pickle").hexdigest()
    done = _rank(["--sha256", junk, str(tmp_path / "junk.pkl")], ranked)
    assert done.returncode != 0 and "Traceback" not in done.stderr and "not a task file" in done.stderr


class _Payload:
    """Pickles as a call that writes `marker`: what an attacker puts in a file a rank unpickles."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_a_task_file_rewritten_after_the_launch_runs_nothing_and_is_refused_in_one_line(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    workdir = tmp_path / "run"
    result = cli("launch", str(path), "--executor", "torchrun", "--dry-run", "--workdir", str(workdir))
    assert result.exit_code == 0, result.output
    sha256, task_file = result.stdout.split()[-2:]
    marker = tmp_path / "marker"
    Path(task_file).write_bytes(pickle.dumps(_Payload(marker)))  # whoever can write the workdir
    env = {k: v for k, v in os.environ.items() if k not in TORCH_ENV}
    env.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    done = _rank(["--sha256", sha256, task_file], env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {task_file}: not the task file this command was made for (its sha256 differs: rewritten since "
        "`orch launch` wrote it); not loaded: launch again"
    ]
    assert not marker.exists()


def test_a_plan_of_several_nodes_without_a_rendezvous_is_one_line(cli, plan_file, tmp_path):
    path, _, _ = plan_file
    doc = yaml.safe_load(path.read_text())
    doc["ranks_per_node"] = 1  # two nodes of one rank each
    path.write_text(yaml.safe_dump(doc))
    result = cli("launch", str(path), "--executor", "torchrun", "--workdir", str(tmp_path / "run"))
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: the plan needs 2 nodes: give --rdzv-endpoint HOST:PORT (a host every node reaches)"
    )


@pytest.mark.slow
def test_a_failing_rank_under_torchrun_is_named(plan_file, tmp_path):
    from orch.planner.plan import Plan
    from orch.runtime.launch.base import LaunchError
    from orch.runtime.launch.torchrun import TorchrunLauncher
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.debug import DebugConfig
    from orch.runtime.train.trainer import TrainTask

    path, _, data = plan_file
    plan = Plan.model_validate(yaml.safe_load(path.read_text()))
    cfg = TrainConfig(steps=2, dtype="float64", device="cpu")
    task = TrainTask(plan, data, cfg, str(tmp_path / "run"), DebugConfig(fail_at=(1, 0)))
    handle = TorchrunLauncher(1, 2).submit(task)
    with pytest.raises(LaunchError, match="^rank 1 failed: RuntimeError: injected failure at step 0") as info:
        handle.wait()
    assert info.value.rank == 1 and handle.state() == "FAILED"


@pytest.mark.slow
def test_a_stop_signal_under_torchrun_saves_and_exits_zero_with_one_line(plan_file, tmp_path):
    """SIGTERM to `orch launch --executor torchrun` (a scheduler ending it): every rank saves the same step and
    ends cleanly, so torchrun's agent does too; the command exits 0 with one line, and the relaunch resumes."""
    import re
    import signal

    from launching import launch_in_background

    path, _, _ = plan_file
    workdir = tmp_path / "run"
    metrics = workdir / "metrics.jsonl"
    proc = launch_in_background(
        str(path), "--executor", "torchrun", "--steps", "500", "--device", "cpu", workdir=workdir
    )
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    stops = re.findall(r"stopped at step (\d+) by SIGTERM; checkpoint step_(\d+); relaunch the same command", out + err)
    assert len(stops) == 1 and stops[0][0] == str(int(stops[0][1])), out + err
    step = int(stops[0][0])
    assert 2 <= step < 500 and (workdir / "checkpoints" / f"step_{step:08d}").is_dir()
    assert f"orch: stop signal: saved checkpoint step {step}" in err
    assert "Traceback" not in out + err, err
    assert len(metrics.read_text().splitlines()) == step


@pytest.mark.slow
def test_the_watchdog_under_torchrun_names_the_stopped_rank(plan_file, tmp_path):
    from orch.planner.plan import Plan
    from orch.runtime.launch.base import RankStalled
    from orch.runtime.launch.torchrun import TorchrunLauncher
    from orch.runtime.train.config import TrainConfig
    from orch.runtime.train.debug import DebugConfig
    from orch.runtime.train.trainer import TrainTask

    path, _, data = plan_file
    plan = Plan.model_validate(yaml.safe_load(path.read_text()))
    cfg = TrainConfig(steps=6, device="cpu", watchdog_s=5)
    task = TrainTask(plan, data, cfg, str(tmp_path / "run"), DebugConfig(stop_at=(1, 2, "llm backward")), 60.0)
    handle = TorchrunLauncher(1, 2).submit(task)
    with pytest.raises(RankStalled) as info:
        handle.wait()
    assert info.value.rank == 1
    assert "rank 1 made no progress for" in str(info.value) and "(last: llm backward, step 2)" in str(info.value)
