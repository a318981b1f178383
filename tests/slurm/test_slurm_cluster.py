"""`orch launch --executor slurm` against the real local Slurm cluster (`make slurm-up`), never a mock.

Skipped with a reason when no cluster answers, except under CI=true, where they must run. Every wait is
bounded; a job still alive at the end of a test is cancelled.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from orch.planner.errors import OrchError
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.launch.job_status import job_status
from orch.runtime.launch.jobs import log_path
from orch.runtime.launch.sbatch import SlurmOptions
from orch.runtime.launch.slurm import submit_train
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.single_process import run_reference

JOB_TIMEOUT_S = 150
POLL_S = 0.5  # squeue/sacct per poll: cheap next to a job's start-up
SEED = 3
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-cluster.sh"
# `orch` in a subprocess, from the same checkout as this test (the job's python resolves orch the same way).
ORCH = [sys.executable, "-c", "from orch.cli.app import main; main()"]


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


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    """`orch launch --wait` and `orch logs --follow` run in this process poll the job every 0.5 s, not 2 s: each
    test's last poll ends that much sooner after its job does (the same states are seen)."""
    import orch.cli.jobs_cmd

    monkeypatch.setattr(orch.cli.jobs_cmd, "_POLL_S", POLL_S)


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


def _wait(job_id: str, until, timeout_s: float = JOB_TIMEOUT_S, poll_s: float = POLL_S):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        st = job_status(job_id)
        if until(st):
            return st
        time.sleep(poll_s)
    subprocess.run(["scancel", job_id], check=False)
    raise AssertionError(f"job {job_id} still {st.state} after {timeout_s} s")


CREDENTIAL_S = 3.0  # slurmd revokes the killed run's job credential by time, to the second


def _release_requeued(job_id: str, timeout_s: float = 60) -> None:
    """Slurm holds a requeued job for about two minutes (PENDING, Reason=BeginTime); start it sooner, but not
    within a few seconds of the requeue: slurmd revokes the old run's credential by time, and a new run started
    in the same second is killed as non-startable ("Job credential revoked"), which the hold exists to avoid."""
    end = time.monotonic() + timeout_s
    pending_since: float | None = None
    while time.monotonic() < end:
        queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=False)
        state = queued.stdout.strip()
        if state == "PENDING":
            pending_since = pending_since or time.monotonic()
            nodes = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, check=False)
            if time.monotonic() - pending_since >= CREDENTIAL_S and "completing" not in nodes.stdout:
                subprocess.run(
                    ["scontrol", "update", f"jobid={job_id}", "StartTime=now"], capture_output=True, check=False
                )
        elif pending_since is not None and state != "PENDING":
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} was not requeued and restarted within {timeout_s} s")


def _metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


_references: dict[int, list[float]] = {}


def _reference(specs, steps):
    """The single-process losses of `steps` steps (the module's specs), computed once per step count."""
    if steps not in _references:
        model, data = specs
        _references[steps] = run_reference(model, data, seed=SEED, steps=steps).losses
    return _references[steps]


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
    # --wait's view (not a terminal here: one line per change of state or step): the states it went through,
    # then the final state with the elapsed time and the last step and loss of metrics.jsonl.
    views = re.findall(r"^job (\d+)\s+(\w+)\s+elapsed (\S+)\s+step (\S+)\s+loss (\S+)$", result.output, re.M)
    assert views and {v[0] for v in views} == {job_id}, result.output
    assert views[-1][1:2] + views[-1][3:] == ("COMPLETED", "1", f"{records[-1]['loss']:.6f}"), result.output
    assert re.fullmatch(r"\d\d:\d\d:\d\d", views[-1][2]), views[-1]
    assert all(v[1] in ("PENDING", "RUNNING", "COMPLETED") for v in views) and "RUNNING" in {v[1] for v in views}
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
    cfg = TrainConfig(steps=2, seed=SEED, dtype="float64", balance="none")
    record = submit_train(plan, specs[1], cfg, SlurmOptions(time="5"), workdir=workdir).record
    st = _wait(record.job_id, lambda s: s.done)
    assert st.state == "COMPLETED", st
    records = _metrics(workdir)
    assert all(set(r["ranks"]) == {"0", "1", "2", "3"} for r in records)
    for r, want in zip(records, _reference(specs, 2), strict=True):
        assert r["loss"] == pytest.approx(want, rel=1e-9, abs=0)


def test_preempted_job_checkpoints_at_the_signal_and_resumes_there(slurm_cluster, state_dir, specs, tmp_path):
    import re

    import submitit

    from orch.runtime.workdir.checkpoint import checkpoint_root, step_name

    workdir = tmp_path / "run"
    steps = 10
    # No --checkpoint-every: the checkpoints are the one saved at the warning signal and the final one.
    cfg = TrainConfig(steps=steps, seed=SEED, dtype="float64", balance="none")
    record = submit_train(_plan(specs, HOMOGENEOUS), specs[1], cfg, SlurmOptions(time="10"), workdir=workdir).record
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
    # The checkpoint saved at the signal is the one the requeued job resumed from, taking the run directory's
    # lock over from its own first incarnation; the other checkpoint is the final one.
    assert f"orch: resuming from {step_name(at)} (verified)" in log
    assert f"taken over from job {record.job_id}'s previous incarnation (requeued)" in log
    assert sorted(p.name for p in checkpoint_root(workdir).glob("step_*")) == [step_name(at), step_name(steps)]
    records = _metrics(workdir)
    # Every step exactly once: the requeued job recomputed nothing, and its first step is the saved one.
    assert [r["step"] for r in records] == list(range(steps))
    assert [r["step"] for r in records if r["setup_s"] > 0] == [0, at]
    for r, want in zip(records, _reference(specs, steps), strict=True):
        assert r["loss"] == pytest.approx(want, rel=1e-9, abs=0)


def test_scancel_is_reported_cancelled(slurm_cluster, state_dir, specs, tmp_path, cli):
    workdir = tmp_path / "run"
    cfg = TrainConfig(steps=500, seed=SEED, dtype="float64", balance="none")
    record = submit_train(_plan(specs, HOMOGENEOUS), specs[1], cfg, SlurmOptions(time="5"), workdir=workdir).record
    _wait(record.job_id, lambda s: s.step is not None or s.done)  # training: the ranks are in their collectives
    result = cli("cancel", record.job_id)
    assert result.exit_code == 0, result.output
    t0 = time.monotonic()
    st = _wait(record.job_id, lambda s: s.done, timeout_s=60)
    assert st.state == "CANCELLED" and time.monotonic() - t0 < 60
    # sacct's state first: the ranks' reset connections as they were killed are not the cause
    assert st.failure is not None and st.failure.kind == "cancelled", st.failure
    assert re.fullmatch(r"cancelled by \S+ \(scancel\) after [\d:-]+", st.failure.summary), st.failure.summary
    shown = cli("status", record.job_id)
    assert shown.exit_code == 0 and st.failure.summary in shown.output and "Connection" not in shown.output


def test_a_stopped_rank_is_named_and_its_job_cancelled(slurm_cluster, state_dir, specs, tmp_path, cli):
    """Rank 2 (the second node) stops itself in its LLM backward at step 1; task 0's watchdog names it and cancels
    the job, which would otherwise run to its time limit."""
    workdir = tmp_path / "run"
    cfg = TrainConfig(steps=6, seed=SEED, dtype="float64", balance="none", watchdog_s=5)
    debug = DebugConfig(stop_at=(2, 1, "llm backward"))
    plan = _plan(specs, HOMOGENEOUS)
    record = submit_train(plan, specs[1], cfg, SlurmOptions(time="5"), workdir=workdir, debug=debug).record
    t0 = time.monotonic()
    st = _wait(record.job_id, lambda s: s.done)
    assert st.state == "CANCELLED" and time.monotonic() - t0 < 90, st
    assert st.failure is not None and (st.failure.kind, st.failure.rank) == ("hang", 2), st.failure
    assert re.fullmatch(
        r"rank 2 made no progress for \d+ s \(last: llm backward, step 1\); stopping the job", st.failure.summary
    )
    shown = cli("status", record.job_id)
    assert shown.exit_code == 0 and st.failure.summary in shown.output, shown.output


def _launch_and_wait(specs, cfg, workdir, opts=None, debug=None):
    """`orch launch --executor slurm --wait` of the homogeneous plan, as the CLI calls it."""
    from orch.cli.jobs_cmd import launch_slurm

    opts = opts or SlurmOptions(time="5")
    launch_slurm(
        _plan(specs, HOMOGENEOUS), specs[1], cfg, opts, workdir=str(workdir), dry_run=False, wait=True, debug=debug
    )


def test_failing_rank_is_reported_and_wait_fails(slurm_cluster, state_dir, specs, tmp_path, cli):

    workdir = tmp_path / "run"
    cfg = TrainConfig(steps=3, seed=SEED, dtype="float64", balance="none")
    t0 = time.monotonic()
    with pytest.raises(OrchError, match=r"rank 2 failed: RuntimeError: injected failure at step 1") as exc:
        _launch_and_wait(specs, cfg, workdir, debug=DebugConfig(fail_at=(2, 1)))
    assert time.monotonic() - t0 < JOB_TIMEOUT_S
    (record,) = state_dir.glob("*.json")
    st = job_status(record.stem)
    assert st.state == "FAILED" and st.failure is not None and st.failure.rank == 2
    assert st.failure.log.endswith(f"{record.stem}_2_log.err") and Path(st.failure.log).exists()
    assert "injected failure at step 1" in Path(st.failure.log).read_text()
    assert st.failure.log in str(exc.value)
    status = cli("status", record.stem)
    assert status.exit_code == 0 and "rank 2 failed" in status.output


def test_a_run_rank_0_refuses_ends_every_rank_at_once(slurm_cluster, state_dir, specs, tmp_path, cli):
    """Rank 0 prepares the run before the rendezvous; a workdir in use refuses it. The other ranks used to wait at
    the rendezvous for its timeout (6 minutes with the default watchdog); now they meet, hear the refusal and
    end, and `orch status` says it. Nothing is written into the workdir the live run owns."""
    from orch.runtime.workdir.run_lock import RunLock

    workdir = tmp_path / "run"
    workdir.mkdir()
    held = RunLock(workdir)
    held.acquire()
    try:
        cfg = TrainConfig(steps=3, seed=SEED, dtype="float64", balance="none")
        t0 = time.monotonic()
        with pytest.raises(OrchError, match=r"rank 0 failed: .*: in use by pid \d+"):
            _launch_and_wait(specs, cfg, workdir)
        assert time.monotonic() - t0 < 60
    finally:
        held.release()
    (record,) = state_dir.glob("*.json")
    status = cli("status", record.stem)
    assert status.exit_code == 0 and "in use by pid" in status.output, status.output
    assert not (workdir / ".failures").exists() and not (workdir / "plan.json").exists()


def test_logs_follow_streams_a_running_job_and_returns_when_it_ends(slurm_cluster, state_dir, specs, tmp_path):
    steps = 12
    cfg = TrainConfig(steps=steps, seed=SEED, dtype="float64", balance="none")
    record = submit_train(
        _plan(specs, HOMOGENEOUS), specs[1], cfg, SlurmOptions(time="5"), workdir=tmp_path / "run"
    ).record
    follow = subprocess.Popen(
        [*ORCH, "logs", record.job_id, "--rank", "0", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for ln in follow.stdout:
            lines.append((time.monotonic(), ln))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # Streamed: the first step's line arrives while the job still runs.
        first = _wait(record.job_id, lambda s: any(f"orch: step 1/{steps} " in ln for _, ln in lines), poll_s=0.2)
        assert not first.done, first
        done = _wait(record.job_id, lambda s: s.done)
        assert done.state == "COMPLETED", done
        t_done = time.monotonic()
        follow.wait(timeout=30)  # it returns by itself, soon after the job ends
        reader.join(10)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, follow.stderr.read()
    assert time.monotonic() - t_done < 30
    logged = [int(m.group(1)) for _, ln in lines if (m := re.match(rf"orch: step (\d+)/{steps}  loss ", ln))]
    assert logged == list(range(1, steps + 1))  # the progress line of each step (runtime/progress.py)
    text = "".join(ln for _, ln in lines)
    assert text == log_path(record, 0).read_text()  # everything, once, in order


def _node_processes(node: str, job_id: str) -> set[int]:
    """PIDs of the job's tasks on `node` (SLURMD_NODENAME in their environment) and of their slurmstepd."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()}
    found: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = set((proc / "environ").read_bytes().split(b"\0"))
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent = Path(f"/proc/{ppid}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue
        if want <= env:
            found.add(int(proc.name))
            if parent.startswith("slurmstepd"):
                found.add(ppid)
    return found


def _job_processes(job_id: str) -> set[int]:
    tag = f"SLURM_JOB_ID={job_id}".encode()
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and tag in (proc / "environ").read_bytes().split(b"\0"):
                found.add(int(proc.name))
        except OSError:
            continue
    return found


def _slurm_dir() -> Path:
    return Path(os.environ.get("ORCH_SLURM_DIR") or "/tmp/orch-slurm-cluster")


def _until_alone_on(node: str, job_id: str, timeout_s: float = 60) -> None:
    """On a shared cluster, give other jobs on `node` a bounded time to end: the node's death would end them too."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        queued = subprocess.run(["squeue", "-h", "-w", node, "-o", "%i"], capture_output=True, text=True)
        if set(queued.stdout.split()) <= {job_id}:
            return
        time.sleep(1)


@pytest.fixture
def node2_comes_back(slurm_cluster):
    """Whatever the test does to node2, it is back (slurmd restarted, state resumed, idle) afterwards."""
    if os.geteuid() != 0 or not (_slurm_dir() / "run" / "slurmd-node2.pid").exists():
        pytest.skip("needs root and the cluster of scripts/slurm-cluster.sh (it kills and restarts node2's slurmd)")
    yield "node2"
    subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, timeout=180, check=False)
    subprocess.run(["scontrol", "update", "nodename=node2", "state=resume"], capture_output=True, check=False)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        state = subprocess.run(["sinfo", "-h", "-N", "-n", "node2", "-o", "%t"], capture_output=True, text=True)
        if state.stdout.strip() in ("idle", "mix", "alloc"):
            return
        time.sleep(1)
    raise AssertionError(f"node2 did not come back: {state.stdout.strip()}")


def test_node_death_is_reported_and_wait_fails(node2_comes_back, state_dir, specs, tmp_path, cli):
    """node2 dies mid-run: its slurmd and the job's processes on it are killed at once (a node that loses
    power). slurmctld declares it down when it stops answering (SlurmdTimeout) and ends the job NODE_FAIL
    (orch submits --no-requeue: no requeue to wait for a node). `--wait` exits non-zero naming the node and
    its ranks; the ranks that survived do not outlive the job.

    Why not `scontrol update nodename=node2 state=down`: Slurm ends the job NODE_FAIL the same way (same
    code path, at once), but node2's slurmd is alive and kills the tasks itself, so neither a node that stops
    answering (SlurmdTimeout) nor peers that lose their ranks mid-collective would be exercised. Killing
    only slurmd is not a dead node either: its slurmstepd and ranks keep running (and training) until
    slurmctld gives up on the node."""
    node = node2_comes_back
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(_plan(specs, HOMOGENEOUS).model_dump(mode="json")))
    workdir = tmp_path / "run"
    args = ["launch", str(plan_path), "--executor", "slurm", "--steps", "1000", "--dtype", "float64"]
    launch = subprocess.Popen(
        [*ORCH, *args, "--time", "5", "--workdir", str(workdir), "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    job_id = ""
    try:
        end = time.monotonic() + 60
        while not job_id and time.monotonic() < end:
            job_id = next((p.stem for p in state_dir.glob("*.json")), "") if state_dir.exists() else ""
            time.sleep(0.2)
        assert job_id, "no job record"
        _wait(job_id, lambda s: s.step is not None and s.step >= 1, poll_s=0.5)
        _until_alone_on(node, job_id)
        slurmd = int((_slurm_dir() / "run" / f"slurmd-{node}.pid").read_text())
        os.kill(slurmd, signal.SIGKILL)
        victims = _node_processes(node, job_id)
        assert len(victims) >= 3, victims  # its two ranks and their slurmstepd
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        output, _ = launch.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if launch.poll() is None:
            launch.kill()
        if job_id:
            subprocess.run(["scancel", job_id], check=False)
    assert launch.returncode == 1, output
    log = f"{workdir.absolute()}/slurm/{job_id}/{job_id}_2_log.err"
    assert f"job {job_id} NODE_FAIL: node {node} failed (NODE_FAIL): ranks 2, 3 were on it (log: {log})" in output
    st = json.loads(cli("status", job_id, "--json").stdout)
    assert st["state"] == "NODE_FAIL"
    assert st["failure"]["kind"] == "node_fail" and st["failure"]["node"] == node
    assert st["failure"]["ranks"] == [2, 3] and st["failure"]["log"] == log
    shown = cli("status", job_id)
    assert f"node {node} failed (NODE_FAIL): ranks 2, 3 were on it" in shown.output and f"log: {log}" in shown.output
    # The surviving ranks (node1) end with the job: nothing of it is left running.
    end = time.monotonic() + 60
    while _job_processes(job_id) and time.monotonic() < end:
        time.sleep(1)
    assert not _job_processes(job_id)


def test_rank_over_the_memory_limit_is_reported_out_of_memory(slurm_cluster, state_dir, specs, tmp_path, cli):
    """Slurm's --mem, enforced without cgroups (jobacct_gather/linux + OverMemoryKill in the test cluster):
    rank 3 grows past its node's limit at step 1 and is killed (with rank 2, its node's other rank); status names
    rank 3 (sacct's MaxRSSTask), out of memory, with its log."""

    workdir = tmp_path / "run"
    # A tiny rank is ~0.4 GB resident: two fit in 1500M; rank 3 then allocates up to 6 GiB at step 1.
    cfg = TrainConfig(steps=3, seed=SEED, dtype="float64", balance="none")
    with pytest.raises(OrchError, match=r"rank 3 failed: out of memory: Slurm killed the ranks on node2") as exc:
        _launch_and_wait(specs, cfg, workdir, SlurmOptions(time="5", mem="1500M"), DebugConfig(oom_at=(3, 1, 6144)))
    (record,) = state_dir.glob("*.json")
    st = job_status(record.stem)
    assert st.done and st.state != "COMPLETED" and st.failure is not None
    assert st.failure.kind == "oom" and st.failure.rank == 3 and st.failure.node == "node2"
    assert st.failure.log.endswith(f"{record.stem}_3_log.err") and st.failure.log in str(exc.value)
    assert "exceeded memory limit" in "".join(p.read_text() for p in Path(st.log_folder).glob("*_log.err"))
    assert _metrics(workdir)[-1]["step"] == 0  # killed during step 1
    status = cli("status", record.stem)
    assert "rank 3 failed: out of memory" in status.output and f"log: {st.failure.log}" in status.output


def test_allocation_refused_in_a_rank_is_reported_out_of_memory(slurm_cluster, state_dir, specs, tmp_path):
    """The in-rank path (a CUDA OutOfMemoryError is the same): rank 1's allocator refuses a request larger
    than the machine; the rank records an out-of-memory failure and status names it, with its log."""

    workdir = tmp_path / "run"
    cfg = TrainConfig(steps=3, seed=SEED, dtype="float64", balance="none")
    with pytest.raises(OrchError, match=r"rank 1 failed: out of memory: RuntimeError: .*can't allocate memory"):
        _launch_and_wait(specs, cfg, workdir, debug=DebugConfig(oom_at=(1, 1, 1 << 30)))  # 1 PiB
    (record,) = state_dir.glob("*.json")
    st = job_status(record.stem)
    assert st.state == "FAILED" and st.failure is not None and st.failure.kind == "oom" and st.failure.rank == 1
    assert st.failure.log.endswith(f"{record.stem}_1_log.err")
    assert "can't allocate memory" in Path(st.failure.log).read_text()


def test_status_of_unknown_job_is_one_line(state_dir, cli):
    result = cli("status", "999999")
    assert result.exit_code == 1 and result.output.startswith("error: job 999999: no record in")
    result = cli("cancel", "12; rm -rf /")
    assert result.exit_code == 1 and "is not a Slurm job id" in result.output


def test_profile_runs_as_one_allocation_and_writes_the_profile(slurm_cluster, state_dir, tmp_path, cli):
    """`orch profile --executor slurm --nodes 2`: 2 nodes x 2 tasks benchmark the cluster they run on."""
    from orch.planner.profile import Profile

    out = tmp_path / "profile.json"
    args = ["profile", "-m", "tiny", "--executor", "slurm", "--nodes", "2", "--quick", "--passes", "1"]
    args += ["--max-bytes", "65536"]
    result = cli(*args, "--out", str(out), "--workdir", str(tmp_path / "w"), "--time", "0:10:00")
    assert result.exit_code == 0, result.output
    assert "COMPLETED" in result.output
    prof = Profile.model_validate_json(out.read_text())
    assert prof.nproc == 4 and prof.ranks_per_node == 2 and prof.backend == "gloo"
    assert set(prof.modules) == {"vision", "audio", "llm"}
    # The job is a known orch job: its record is where `orch status` looks.
    assert len(list(state_dir.glob("*.json"))) == 1


def test_the_request_is_fitted_to_the_partition_before_submitting(slurm_cluster, state_dir, specs, tmp_path, cli):
    """A cluster spec without cpus_per_gpu asked 8 CPUs a task of 8-CPU nodes (2 tasks: 16), and the job could
    never start; it now takes the node's CPUs over its tasks, a --mem of what the ranks need, and a request
    over the nodes' figures is one line before anything is submitted."""
    plan = _plan(specs, HOMOGENEOUS)
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    unset = plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"cpus_per_gpu": None})})
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(unset.model_dump(mode="json")))
    dry = cli("launch", str(path), "--executor", "slurm", "--dry-run", "--workdir", str(tmp_path / "run"))
    assert dry.exit_code == 0, dry.output
    lines = dry.output.splitlines()
    assert f"#SBATCH --cpus-per-task={cpus // 2}" in lines
    mem = [ln for ln in lines if ln.startswith("#SBATCH --mem=")]
    assert len(mem) == 1 and int(mem[0].split("=")[1].rstrip("M")) >= 2 * 1024  # two ranks' host memory
    greedy = plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"cpus_per_gpu": cpus})})
    path.write_text(yaml.safe_dump(greedy.model_dump(mode="json")))
    refused = cli("launch", str(path), "--executor", "slurm", "--time", "5", "--workdir", str(tmp_path / "run"))
    assert refused.exit_code == 1
    assert refused.output.strip().splitlines() == [
        f"error: {path}: cluster.cpus_per_gpu: {cpus} CPUs x 2 tasks = {2 * cpus} per node; partition debug's "
        f"nodes have {cpus} CPUs (set cpus_per_gpu to at most {cpus // 2}, or leave it out to take it from the "
        "partition)"
    ]
    assert not list(state_dir.glob("*.json"))  # nothing submitted
