"""The launchers' pure parts: task sequences, the tests' fault injection, the rank environment."""

import pytest

from orch.planner.errors import OrchError
from orch.runtime.launch.base import FunctionTask, TaskSequence
from orch.runtime.launch.rank import rendezvous_port
from orch.runtime.train.debug import DebugConfig


def _noop(ctx) -> None:
    pass


def test_a_sequence_needs_one_world_size_and_device(tmp_path):
    seq = TaskSequence([FunctionTask(_noop, 2, str(tmp_path)), FunctionTask(_noop, 2, str(tmp_path), timeout_s=300)])
    assert (seq.world_size, seq.device, seq.timeout_s) == (2, "cpu", 300)
    with pytest.raises(OrchError, match="one world size"):
        TaskSequence([FunctionTask(_noop, 2, str(tmp_path)), FunctionTask(_noop, 4, str(tmp_path))])
    with pytest.raises(OrchError, match="one world size and device"):
        TaskSequence([FunctionTask(_noop, 2, str(tmp_path)), FunctionTask(_noop, 2, str(tmp_path), device="cuda")])


def test_fault_injection_hits_only_its_rank_and_step():
    debug = DebugConfig(fail_at=(2, 1))
    debug.inject(2, 0)
    debug.inject(1, 1)
    with pytest.raises(RuntimeError, match="injected failure at step 1"):
        debug.inject(2, 1)
    DebugConfig().inject(0, 0)  # a user's run: nothing injected


def test_counter_counts_on_dp_leaders_only():
    counter = DebugConfig(count_tokens=True).counter({"vision": True, "llm": False})
    counter.add("vision", {0: 3, 1: 2})
    counter.add("vision", {0: 1})
    counter.add("llm", {0: 9})
    assert counter.processed == {"vision": {0: 4, 1: 2}}
    off = DebugConfig().counter({"vision": True})
    off.add("vision", {0: 3})
    assert off.processed == {}


def test_rendezvous_port_differs_per_job_incarnation(monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    first = rendezvous_port("1234")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert rendezvous_port("1234") != first and 20000 <= first < 40000
