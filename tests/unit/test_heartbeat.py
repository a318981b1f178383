"""Heartbeats and the watchdog's rule (runtime/launch/heartbeat.py): pure, over written or made-up beats."""

import os

import pytest

from orch.runtime.launch.failures import is_peer_error
from orch.runtime.launch.heartbeat import FROZEN_AFTER_S, Beat, Heartbeat, blame, clear_heartbeats, read_beats, stalled


def _beat(rank, step, seq, phase, progress, alive):
    return Beat(rank, 100 + rank, step, seq, phase, progress, alive)


def test_a_rank_heartbeat_reads_back_its_step_phase_and_order(tmp_path):
    hb = Heartbeat(tmp_path, 3)
    try:
        first = read_beats(tmp_path)[3]
        assert (first.rank, first.pid, first.step, first.phase) == (3, os.getpid(), None, "setup")
        hb.beat("dispatch", 7)
        hb.beat("llm backward", 7)
        now = read_beats(tmp_path)[3]
        assert (now.step, now.seq, now.phase) == (7, 2, "llm backward")
        assert now.progress >= first.progress
        hb.beat("dispatch", 8)
        assert (read_beats(tmp_path)[3].step, read_beats(tmp_path)[3].seq) == (8, 1)  # a new step counts from 1
    finally:
        hb.close("stopped", 9)
    last = read_beats(tmp_path)[3]
    assert (last.phase, last.step) == ("stopped", 9)
    clear_heartbeats(tmp_path)
    assert read_beats(tmp_path) == {}


def test_a_half_written_record_is_left_out_of_the_poll(tmp_path):
    Heartbeat(tmp_path, 0).close()
    (tmp_path / ".heartbeat" / "rank1.json").write_text('{"rank":1,"pid":')
    assert set(read_beats(tmp_path)) == {0}


def test_the_watchdog_waits_until_a_training_rank_is_idle_past_the_limit():
    beats = {0: _beat(0, 4, 3, "grad_sync", 100.0, 159.5), 1: _beat(1, 4, 3, "grad_sync", 100.0, 159.5)}
    assert stalled(beats, 159.0, 60) is None
    assert stalled(beats, 161.0, 0) is None  # 0: off
    assert stalled(beats, 161.0, 60).rank == 0
    setting_up = {0: _beat(0, None, 0, "setup", 0.0, 500.0)}  # loading weights for minutes is not a hang
    assert stalled(setting_up, 500.0, 60) is None
    ended = {0: _beat(0, 9, 5, "done", 0.0, 0.0)}
    assert stalled(ended, 500.0, 60) is None


def test_the_watchdog_names_the_frozen_rank_not_the_ones_waiting_for_it():
    # rank 2 stopped in its backward; ranks 0, 1 and 3 wait in a collective later (their threads still beat)
    beats = {
        0: _beat(0, 7, 6, "grad_sync", 101.0, 170.0),
        1: _beat(1, 7, 6, "grad_sync", 101.0, 170.0),
        2: _beat(2, 7, 5, "llm backward", 100.5, 100.9),
        3: _beat(3, 7, 4, "llm backward", 99.0, 170.0),  # behind rank 2, but alive: waiting, not stopped
    }
    stall = stalled(beats, 170.4, 60)
    assert (stall.rank, stall.phase, stall.step, round(stall.idle_s)) == (2, "llm backward", 7, 70)
    assert stall.message == "rank 2 made no progress for 70 s (last: llm backward, step 7); stopping the job"


def test_without_a_frozen_rank_the_one_furthest_behind_is_named():
    beats = {
        0: _beat(0, 7, 6, "grad_sync", 101.0, 170.0),
        1: _beat(1, 7, 2, "vision forward", 102.0, 170.0),  # hung in a call that keeps the interpreter running
    }
    assert stalled(beats, 170.4, 60).rank == 1


def test_a_limit_under_the_frozen_threshold_waits_for_it():
    beats = {0: _beat(0, 1, 1, "dispatch", 100.0, 100.0)}
    assert stalled(beats, 100.0 + FROZEN_AFTER_S - 0.5, 1) is None
    assert stalled(beats, 100.0 + FROZEN_AFTER_S + 0.5, 1).rank == 0


def test_a_timeout_on_a_healthy_rank_is_blamed_on_the_rank_that_stopped():
    # rank 0 timed out waiting for rank 1, which had stopped (its liveness ended 60 s before rank 0 failed)
    beats = {
        0: _beat(0, 7, 5, "llm backward", 100.2, 161.0),
        1: _beat(1, 7, 5, "llm backward", 100.1, 100.4),
    }
    stall = blame(beats, 5000.0, reporter=0)  # read long after the job ended: the same verdict
    assert (stall.rank, stall.phase, stall.step, round(stall.idle_s)) == (1, "llm backward", 7, 61)
    assert stall.summary == "rank 1 made no progress for 61 s (last: llm backward, step 7)"
    assert blame(beats, 5000.0, reporter=1) is None  # the frozen rank itself reporting: nothing to add


def test_a_rank_that_raised_on_its_own_is_not_blamed_on_a_peer():
    beats = {0: _beat(0, 3, 4, "gather", 100.0, 100.5), 1: _beat(1, 3, 4, "gather", 100.1, 100.6)}
    assert blame(beats, 101.0, reporter=0) is None
    assert blame({}, 101.0, reporter=0) is None


@pytest.mark.parametrize(
    ("error", "peer"),
    [
        ("RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 60000ms for recv", True),
        ("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242", True),
        ("ConnectionResetError: [Errno 104] Connection reset by peer", True),
        ("RuntimeError: injected failure at step 1", False),
        ("out of memory: CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ],
)
def test_peer_errors_are_told_from_a_rank_own_error(error, peer):
    assert is_peer_error(error) is peer


def test_the_watchdog_thread_reports_one_stall_and_ends(tmp_path):
    import threading

    from orch.runtime.launch.heartbeat import Watchdog

    hb = Heartbeat(tmp_path, 0)
    hb.beat("grad_sync", 3)
    hb.close("stopped", 3)  # an ended rank is never a stall
    folder = tmp_path / ".heartbeat"
    (folder / "rank1.json").write_text(
        '{"rank":1,"pid":1,"step":3,"seq":2,"phase":"llm forward","progress":1.0,"alive":1.0}'
    )
    seen, done = [], threading.Event()
    dog = Watchdog(tmp_path, 5, lambda stall: (seen.append(stall), done.set()), poll_s=0.01).start()
    assert done.wait(10)
    dog.stop()
    assert [(s.rank, s.phase, s.step) for s in seen] == [(1, "llm forward", 3)]


def test_the_collective_timeout_leaves_the_watchdog_time_to_act():
    from types import SimpleNamespace

    from orch.runtime.launch.rank import WATCHDOG_FIRST_S, collective_timeout_s

    assert collective_timeout_s(SimpleNamespace(timeout_s=60.0, watchdog_s=300.0)) == 300.0 + WATCHDOG_FIRST_S
    assert collective_timeout_s(SimpleNamespace(timeout_s=600.0, watchdog_s=30.0)) == 600.0
    assert collective_timeout_s(SimpleNamespace(timeout_s=60.0, watchdog_s=0.0)) == 60.0
    assert collective_timeout_s(SimpleNamespace(timeout_s=60.0)) == 60.0  # a task without heartbeats
