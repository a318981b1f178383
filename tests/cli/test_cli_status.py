"""`orch status WORKDIR`: a local run's state from its run directory (runtime/launch/run_status.py): running,
finished, failed with the first failure record, stopped by a signal with its checkpoint; anything that is
neither a Slurm job id nor a run directory is one line and exit 1."""

import json
import os
import signal
import threading
import time

import pytest
from launching import LAUNCHER, train_local

from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.launch.base import LaunchError
from orch.runtime.launch.run_status import run_status
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.trainer import TrainTask
from orch.runtime.workdir.metrics import metrics_path, read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny():
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 32})
    plan = hand_plan(model, data, {"llm": (Layout(tp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
    return plan, data


def _status(cli, workdir):
    """`orch status WORKDIR --json` and the text lines of `orch status WORKDIR`."""
    as_json = cli("status", str(workdir), "--json")
    assert as_json.exit_code == 0, as_json.output
    text = cli("status", str(workdir))
    assert text.exit_code == 0, text.output
    return json.loads(as_json.stdout), [" ".join(line.split()) for line in text.output.splitlines()]


def test_a_finished_run(tiny, tmp_path, cli):
    plan, data = tiny
    records = train_local(plan, data, TrainConfig(steps=2, device="cpu"), tmp_path)
    st, lines = _status(cli, tmp_path)
    assert st["state"] == "finished" and st["steps"] == 2 and st["world_size"] == 2
    assert st["step"] == 1 and st["loss"] == records[-1].loss
    assert st["holder"] is None  # released cleanly: the file names no one
    assert [(r["rank"], r["phase"], r["step"]) for r in st["ranks"]] == [(0, "done", 1), (1, "done", 1)]
    assert lines[0] == f"run {tmp_path} finished step 1 of 2 loss {records[-1].loss:.6f}"
    assert lines[1] == "lock: free"
    assert lines[2].startswith("rank 0 pid ") and "step 1 done" in lines[2]


def test_a_failed_run_names_the_first_failure(tiny, tmp_path, cli):
    plan, data = tiny
    with pytest.raises(LaunchError, match="rank 1 failed"):
        train_local(plan, data, TrainConfig(steps=3, device="cpu"), tmp_path, debug=DebugConfig(fail_at=(1, 1)))
    st, lines = _status(cli, tmp_path)
    assert st["state"] == "failed" and st["step"] == 0  # step 0 recorded, step 1 failed on rank 1
    failure = st["failure"]
    assert failure["rank"] == 1 and failure["kind"] == "error"
    assert failure["error"] == "RuntimeError: injected failure at step 1"
    assert failure["log"] == str(tmp_path / ".failures" / "rank1.json")
    assert "rank 1 failed: RuntimeError: injected failure at step 1" in lines
    assert f"record: {tmp_path / '.failures' / 'rank1.json'}" in lines


def test_a_run_in_progress_then_stopped_by_sigterm(tiny, tmp_path, cli, harmless_signals):
    plan, data = tiny
    task = TrainTask(plan, data, TrainConfig(steps=200, device="cpu"), str(tmp_path), DebugConfig(), 60.0)
    handle = LAUNCHER.submit(task)
    seen = {}

    def look_then_stop():  # while the launcher waits (its SIGTERM handler installed): read the run, then stop it
        end = time.monotonic() + 120
        while time.monotonic() < end and len(read_metrics(metrics_path(tmp_path), missing_ok=True)) < 2:
            time.sleep(0.02)
        seen["running"] = run_status(tmp_path)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=look_then_stop, daemon=True)
    thread.start()
    handle.wait()
    thread.join()
    running = seen["running"]
    assert running.state == "running" and running.step is not None and running.step >= 1
    assert running.holder is not None and running.holder.held and running.holder.alive
    assert running.holder.pid == os.getpid() and running.holder.job_id == "local"  # the launcher holds the run
    assert [b.rank for b in running.ranks] == [0, 1] and all(b.step is not None for b in running.ranks)

    at = handle.stopped_at
    assert handle.stopped_by == "SIGTERM" and at is not None
    st, lines = _status(cli, tmp_path)
    assert st["state"] == "stopped" and st["stopped_at"] == at and st["step"] == at - 1
    assert st["checkpoint"] == str(tmp_path / "checkpoints" / f"step_{at:08d}")
    assert (tmp_path / "checkpoints" / f"step_{at:08d}").is_dir()
    assert st["failure"] is None and st["holder"] is None
    assert f"stopped at step {at} by a signal; checkpoint {st['checkpoint']}; relaunch the same command to resume" in (
        lines
    )


def test_neither_a_job_id_nor_a_run_directory_is_one_line(cli, tmp_path):
    for arg in (str(tmp_path / "missing"), "run-1"):
        r = cli("status", arg)
        assert r.exit_code == 1
        assert r.output == f"error: {arg}: neither a Slurm job id nor a run directory (`orch launch --workdir`)\n"
    empty = cli("status", str(tmp_path))  # a directory, but no run was ever prepared in it
    assert empty.exit_code == 1 and len(empty.output.splitlines()) == 1
    assert empty.output.startswith(f"error: {tmp_path}: not a run directory")
