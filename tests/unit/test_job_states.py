"""`orch status` over recorded sacct answers: Slurm's own end of a job (cancelled, time limit, node failure,
memory, preemption) is named from sacct's state first; the ranks' records only when the job failed on its own."""

import json
import time

import pytest

import orch.runtime.launch.diagnose as diagnose_mod
import orch.runtime.launch.jobs as jobs_mod
from orch.runtime.launch.failures import failure_dir
from orch.runtime.launch.heartbeat import heartbeat_dir
from orch.runtime.launch.job_status import job_status
from orch.runtime.launch.jobs import JobRecord, save_record

JOB = "4242"
WHEN = "2026-12-04T04:40:01|2026-12-04T04:40:15"


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A recorded 4-rank job whose sacct line the test sets; `answer(line)` records sacct's answer."""
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "state"))
    workdir = tmp_path / "run"
    workdir.mkdir()
    record = JobRecord(job_id=JOB, workdir=str(workdir), log_folder=str(workdir / "slurm" / JOB), world_size=4,
                       steps=10, tasks_per_node=2)  # fmt: skip
    save_record(record)
    answers = {}

    def run_command(cmd, timeout=20):
        if cmd[0] == "sacct" and "-X" in cmd:
            return answers.get("sacct", "")
        return ""  # squeue, sinfo, sacctmgr, scontrol, per-step sacct: nothing recorded

    monkeypatch.setattr(jobs_mod, "run_command", run_command)
    monkeypatch.setattr(diagnose_mod, "run_command", run_command)

    def answer(line: str):
        answers["sacct"] = line + "\n"
        return record

    return answer


def _failed(workdir, rank, error, at):
    folder = failure_dir(workdir)
    folder.mkdir(exist_ok=True)
    (folder / f"rank{rank}.json").write_text(json.dumps({"time": at, "rank": rank, "error": error, "kind": "error"}))


RESET = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection reset by peer [127.0.0.1]:4242"


def test_scancel_is_a_cancellation_not_the_reset_connections_it_caused(job):
    record = job(f"CANCELLED by 0|00:00:14|0:15|node[1-2]|{WHEN}|00:05:00")
    _failed(record.workdir, 2, RESET, 100.0)
    _failed(record.workdir, 0, RESET, 100.1)
    st = job_status(JOB)
    assert st.state == "CANCELLED" and st.failure is not None
    assert (st.failure.kind, st.failure.by_rank) == ("cancelled", False)
    assert st.failure.summary == "cancelled by root (scancel) after 00:00:14"


def test_a_time_limit_says_so_and_how_to_go_on(job):
    job(f"TIMEOUT|00:05:08|0:0|node1|{WHEN}|00:05:00")
    st = job_status(JOB)
    assert st.failure.kind == "timeout"
    assert st.failure.summary == (
        "reached its time limit (00:05:00) after 00:05:08; relaunch the same command to resume from the newest "
        "checkpoint (or raise --time)"
    )


def test_preemption_and_boot_failure_are_slurm_own(job):
    job(f"PREEMPTED|00:01:00|0:0|node1|{WHEN}|00:05:00")
    assert job_status(JOB).failure.kind == "preempted"
    job(f"BOOT_FAIL|00:00:00|0:0|node1|{WHEN}|00:05:00")
    assert job_status(JOB).failure.summary.startswith("a node of the allocation failed to boot (BOOT_FAIL)")


def test_a_node_failure_is_a_node_failure(job):
    record = job(f"NODE_FAIL|00:01:02|0:0|node[1-2]|{WHEN}|00:05:00")
    _failed(record.workdir, 0, RESET, 100.0)
    st = job_status(JOB)
    assert st.failure.kind == "node_fail" and "(NODE_FAIL)" in st.failure.summary


def test_out_of_memory_is_named_before_the_rank_errors(job):
    record = job(f"OUT_OF_MEMORY|00:00:40|0:125|node1|{WHEN}|00:05:00")
    _failed(record.workdir, 1, RESET, 100.0)
    st = job_status(JOB)
    assert st.failure.kind == "oom"
    assert st.failure.summary.startswith("rank 0 failed: out of memory: Slurm killed the ranks")


def test_a_failed_job_names_the_rank_that_failed_first(job):
    record = job(f"FAILED|00:00:30|1:0|node[1-2]|{WHEN}|00:05:00")
    _failed(record.workdir, 2, "RuntimeError: injected failure at step 1", 100.0)
    _failed(record.workdir, 0, RESET, 100.2)
    st = job_status(JOB)
    assert (st.failure.kind, st.failure.rank) == ("error", 2)
    assert st.failure.summary == "rank 2 failed: RuntimeError: injected failure at step 1"


def test_a_diverged_run_is_said_in_its_own_line_not_as_one_ranks_failure(job):
    from orch.runtime.launch.failures import record_failure
    from orch.runtime.train.divergence import divergence

    record = job(f"FAILED|00:00:30|1:0|node[1-2]|{WHEN}|00:05:00")
    diverged = divergence(2, float("nan"), 1.0, 0.1, 10, record.workdir)
    for rank in (3, 1, 0, 2):  # every rank raises the same line; the earliest record speaks
        record_failure(record.workdir, rank, diverged)
    st = job_status(JOB)
    assert (st.failure.kind, st.failure.rank, st.failure.by_rank) == ("diverged", 3, True)
    assert st.failure.summary == str(diverged)
    assert st.failure.summary.startswith("step 3/10: loss is nan (grad norm 1): the run diverged; lower lr (now 0.1)")


def test_a_timeout_on_a_healthy_rank_is_blamed_on_the_rank_that_stopped(job):
    record = job(f"FAILED|00:02:30|1:0|node[1-2]|{WHEN}|00:05:00")
    _failed(record.workdir, 0, "RuntimeError: [../unbound_buffer.cc:78] Timed out waiting 120000ms for recv", 300.0)
    folder = heartbeat_dir(record.workdir)
    folder.mkdir()
    beats = {0: (7, 5, "llm backward", 170.0, 299.0), 1: (7, 5, "llm backward", 170.2, 299.0),
             2: (7, 5, "llm backward", 170.1, 299.0), 3: (7, 4, "vision backward", 169.0, 169.5)}  # fmt: skip
    for rank, (step, seq, phase, progress, alive) in beats.items():
        raw = {"rank": rank, "pid": 1, "step": step, "seq": seq, "phase": phase, "progress": progress, "alive": alive}
        (folder / f"rank{rank}.json").write_text(json.dumps(raw))
    st = job_status(JOB)
    assert (st.failure.kind, st.failure.rank, st.failure.by_rank) == ("hang", 3, True)
    assert st.failure.summary.startswith(
        "rank 3 made no progress for 130 s (last: vision backward, step 7); rank 0 failed waiting for it: "
    )
    assert st.failure.log.endswith(f"{JOB}_3_log.err")


def test_status_shows_the_cancellation_in_one_line_without_a_rank_log(job, cli):
    record = job(f"CANCELLED by 0|00:00:14|0:15|node[1-2]|{WHEN}|00:05:00")
    _failed(record.workdir, 1, RESET, time.time())
    result = cli("status", JOB)
    assert result.exit_code == 0, result.output
    assert "cancelled by root (scancel) after 00:00:14" in result.output
    assert "Connection reset" not in result.output and "log:" not in result.output


def test_ctrl_c_while_following_a_job_leaves_it_running_with_one_line(job, monkeypatch):
    import orch.cli.jobs_cmd as jobs_cmd
    from orch.planner.errors import OrchError

    def interrupted(job_id):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs_cmd, "_watch", interrupted)
    with pytest.raises(OrchError) as info:
        jobs_cmd._watch_or_detach(JOB)
    assert str(info.value) == f"stopped following job {JOB}; it keeps running: orch status {JOB}, orch cancel {JOB}"
