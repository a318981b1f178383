"""Local runs under signals and hangs: a stop request saves one step on every rank, a second one kills them, and
the watchdog (or the blame after a collective timeout) names the rank that stopped, with its last phase."""

import contextlib
import os
import re
import signal
import threading
import time

import pytest
from launching import LAUNCHER, train_local

from orch.planner.errors import OrchError
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.launch.base import Aborted, LaunchError, RankStalled
from orch.runtime.launch.heartbeat import read_beats
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.trainer import TrainTask
from orch.runtime.workdir.checkpoint import checkpoint_root, step_name
from orch.runtime.workdir.metrics import metrics_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny():
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 32})
    plan = hand_plan(model, data, {"llm": (Layout(tp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1])})
    return plan, data


def _signal_after(workdir, records, *signums, gap_s=0.3):
    """A thread that sends `signums` to this process (the launcher) once `records` metrics lines are written."""

    def send():
        path = metrics_path(workdir)
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if path.exists() and len(path.read_text().splitlines()) >= records:
                break
            time.sleep(0.02)
        for s in signums:
            os.kill(os.getpid(), s)
            time.sleep(gap_s)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_stop_signal_saves_one_step_on_every_rank_and_the_resume_continues_exactly(tiny, tmp_path, harmless_signals):
    plan, data = tiny
    cfg = TrainConfig(steps=8, dtype="float64", optimizer="sgd", lr=0.1, seed=4, device="cpu")
    want = [r.loss for r in train_local(plan, data, cfg, tmp_path / "full")]

    run = tmp_path / "stopped"
    task = TrainTask(plan, data, cfg, str(run), DebugConfig(), 60.0)
    handle = LAUNCHER.submit(task)
    _signal_after(run, 2, signal.SIGTERM)
    handle.wait()
    stopped = handle.stopped_at
    records = task.result()
    assert handle.stopped_by == "SIGTERM" and stopped is not None and 2 <= stopped < cfg.steps
    assert [r.step for r in records] == list(range(stopped))  # every step before the stop, none after
    beats = read_beats(run)
    assert {r: (b.phase, b.step) for r, b in beats.items()} == {0: ("stopped", stopped), 1: ("stopped", stopped)}
    assert (checkpoint_root(run) / "latest").read_text().strip() == step_name(stopped)
    assert all(not p.is_alive() for p in handle.context.processes)

    resumed = train_local(plan, data, cfg, run)  # the same command again: it continues from the saved step
    assert [r.step for r in resumed] == list(range(cfg.steps))
    for got, expected in zip([r.loss for r in resumed], want, strict=True):
        assert got == pytest.approx(expected, rel=1e-12, abs=0)


def test_a_second_signal_kills_the_ranks_at_once(tiny, tmp_path, harmless_signals):
    plan, data = tiny
    cfg = TrainConfig(steps=200, device="cpu")
    # rank 1 stops itself at step 1: the first request can never reach a step boundary, the second must end it
    task = TrainTask(plan, data, cfg, str(tmp_path), DebugConfig(stop_at=(1, 1, "dispatch")), 60.0)
    handle = LAUNCHER.submit(task)
    _signal_after(tmp_path, 1, signal.SIGINT, signal.SIGINT)
    t = time.monotonic()
    with pytest.raises(Aborted, match=r"^aborted by a second SIGINT: the ranks were killed without saving"):
        handle.wait()
    assert time.monotonic() - t < 30
    assert all(not p.is_alive() for p in handle.context.processes)


def test_the_watchdog_names_the_stopped_rank_and_its_phase(tiny, tmp_path):
    plan, data = tiny
    cfg = TrainConfig(steps=6, device="cpu", watchdog_s=5)
    task = TrainTask(plan, data, cfg, str(tmp_path), DebugConfig(stop_at=(1, 2, "llm backward")), 60.0)
    handle = LAUNCHER.submit(task)
    with pytest.raises(RankStalled) as info:
        handle.wait()
    assert re.fullmatch(
        r"rank 1 made no progress for \d+ s \(last: llm backward, step 2\); stopping the job", str(info.value)
    )
    assert info.value.rank == 1
    assert all(not p.is_alive() for p in handle.context.processes)


def test_a_collective_timeout_is_blamed_on_the_rank_that_stopped(tiny, tmp_path):
    plan, data = tiny
    cfg = TrainConfig(steps=6, device="cpu", watchdog_s=0)  # no watchdog: the collective's timeout ends the job
    task = TrainTask(plan, data, cfg, str(tmp_path), DebugConfig(stop_at=(1, 2, "llm backward")), timeout_s=8.0)
    with pytest.raises(LaunchError) as info:
        LAUNCHER.submit(task).wait()
    message = str(info.value)
    assert info.value.rank == 1, message
    assert re.match(r"rank 1 made no progress for \d+ s \(last: llm backward, step 2\); rank 0 failed waiting", message)
    assert "Timed out" in message


def test_a_rank_own_error_is_still_its_own(tiny, tmp_path):
    plan, data = tiny
    task = TrainTask(plan, data, TrainConfig(steps=3, device="cpu"), str(tmp_path), DebugConfig(fail_at=(1, 1)), 30.0)
    with pytest.raises(OrchError, match=r"^rank 1 failed: RuntimeError: injected failure at step 1"):
        LAUNCHER.submit(task).wait()


def _signal_all_in_save(workdir, pids, launcher_signal=signal.SIGINT):
    """A thread that, once a rank enters its checkpoint phase, sends every rank SIGINT, SIGUSR1 and SIGTERM at once
    (a Ctrl-C or a systemd stop to the whole process group, with the launcher's forwarded request) and this process,
    the launcher, `launcher_signal`."""

    def send():
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if any(b.phase == "checkpoint" for b in read_beats(workdir).values()):
                break
            time.sleep(0.002)
        for signum in (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
        os.kill(os.getpid(), launcher_signal)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_signals_to_the_whole_group_during_saves_stop_cleanly_every_time(tiny, tmp_path, harmless_signals):
    """Ctrl-C or SIGTERM to the launcher and its ranks while they save: each time the ranks stop together at one step
    with a checkpoint (never a hang: the watchdog would name a rank that did; never a rank killed), and the run
    resumed through several such stops trains the same losses as one uninterrupted run."""
    plan, data = tiny
    cfg = TrainConfig(
        steps=6, dtype="float64", optimizer="sgd", lr=0.1, seed=4, device="cpu", checkpoint_every=1, watchdog_s=15
    )
    want = [r.loss for r in train_local(plan, data, cfg.model_copy(update={"checkpoint_every": 0}), tmp_path / "full")]

    run, stops = tmp_path / "stopped", []
    for launcher_signal in (signal.SIGINT, signal.SIGTERM):
        handle = LAUNCHER.submit(TrainTask(plan, data, cfg, str(run), DebugConfig(), 30.0))
        _signal_all_in_save(run, handle.context.pids(), launcher_signal)
        handle.wait()  # RankStalled if a rank hung in the save, LaunchError if one died
        stopped = handle.stopped_at
        assert handle.stopped_by == signal.Signals(launcher_signal).name and stopped is not None
        assert (checkpoint_root(run) / "latest").read_text().strip() == step_name(stopped)
        assert {b.phase for b in read_beats(run).values()} == {"stopped"}
        stops.append(stopped)
    assert stops == sorted(set(stops)) and stops[-1] < cfg.steps  # each launch resumed and got further

    resumed = train_local(plan, data, cfg, run)
    assert [r.step for r in resumed] == list(range(cfg.steps))
    for got, expected in zip([r.loss for r in resumed], want, strict=True):
        assert got == pytest.approx(expected, rel=1e-12, abs=0)


def test_a_stop_signal_to_the_group_as_the_ranks_start_is_a_stop_request(tiny, tmp_path, harmless_signals):
    """systemd's stop (SIGTERM to the launcher and its ranks) before the launcher waits and before the ranks' handlers
    are in place: neither lost nor a death; the ranks stop at their first step boundary."""
    plan, data = tiny
    cfg = TrainConfig(steps=20, device="cpu")
    handle = LAUNCHER.submit(TrainTask(plan, data, cfg, str(tmp_path), DebugConfig(), 60.0))
    for pid in handle.context.pids():
        os.kill(pid, signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    handle.wait()
    assert (handle.stopped_by, handle.stopped_at) == ("SIGTERM", 1)
    assert (checkpoint_root(tmp_path) / "latest").read_text().strip() == step_name(1)
