"""Fitting an allocation to the partition's nodes before submitting (runtime/launch/partition.py), no cluster."""

import pytest

from orch.planner.errors import OrchError, SpecError
from orch.runtime.launch import partition as part_mod
from orch.runtime.launch.jobs import JobStatus
from orch.runtime.launch.partition import HOST_OVERHEAD_MB, Partition, fit_to_partition, read_partition, stuck_reason

NODE = Partition(name="gpu", nodes=2, cpus=8, mem_mb=19284, gpus=4)


def _params(**kw):
    return {"nodes": 2, "ntasks_per_node": 2, "cpus_per_task": None, **kw}


def test_unset_figures_come_from_the_partition():
    out = fit_to_partition(_params(), NODE, cpus_given=False, memory_gb_per_rank=0.5)
    assert out["cpus_per_task"] == 4  # 8 CPUs over 2 tasks
    assert out["mem"] == f"{2 * (HOST_OVERHEAD_MB + 512)}M"  # what two ranks need, not the cluster's default
    big = fit_to_partition(_params(), NODE, cpus_given=False, memory_gb_per_rank=80.0)
    assert big["mem"] == "19284M"  # never more than a node has


def test_requests_no_node_can_meet_are_refused_with_what_to_change():
    with pytest.raises(
        SpecError, match=r"plan.yaml: cluster.cpus_per_gpu: 8 CPUs x 2 tasks = 16 per node; .*at most 4"
    ):
        fit_to_partition(_params(cpus_per_task=8), NODE, cpus_given=True, memory_gb_per_rank=0, source="plan.yaml")
    with pytest.raises(SpecError, match="needs 3 nodes; partition gpu has 2"):
        fit_to_partition(_params(nodes=3), NODE, cpus_given=False, memory_gb_per_rank=0)
    with pytest.raises(SpecError, match="8 tasks .* nodes have 4 GPUs"):
        fit_to_partition(_params(ntasks_per_node=8), NODE, cpus_given=False, memory_gb_per_rank=0)
    with pytest.raises(SpecError, match="--mem: 64G per node; partition gpu's nodes have 19284M"):
        fit_to_partition(_params(mem="64G"), NODE, cpus_given=False, memory_gb_per_rank=0)
    ok = fit_to_partition(_params(cpus_per_task=4, mem="16G"), NODE, cpus_given=True, memory_gb_per_rank=0)
    assert (ok["cpus_per_task"], ok["mem"]) == (4, "16G")


def test_without_slurm_the_request_is_left_as_the_spec_says():
    out = fit_to_partition(_params(), None, cpus_given=False, memory_gb_per_rank=1.0)
    assert out["cpus_per_task"] == 8 and "mem" not in out


def test_sinfo_is_read_as_the_smallest_node_of_the_partition(monkeypatch):
    lines = "node1|8|19284|gpu:4|debug*\nnode2|16|64000|gpu:h100:8(S:0-1)|debug*\nnode3|64|512000|(null)|cpu\n"
    monkeypatch.setattr(part_mod, "run_command", lambda cmd, timeout=20: lines)
    assert read_partition(None) == Partition(name="debug", nodes=2, cpus=8, mem_mb=19284, gpus=4)
    assert read_partition("cpu") == Partition(name="cpu", nodes=1, cpus=64, mem_mb=512000, gpus=None)
    assert read_partition("nope") is None


def test_a_job_that_can_never_start_is_cancelled_with_why(monkeypatch):
    cancelled = []
    monkeypatch.setattr(part_mod, "cancel", cancelled.append)
    waiting = JobStatus(job_id="42", state="PENDING", reason="Resources", workdir="w", log_folder="l")
    stuck_reason(waiting)  # waits for nodes: it will start
    assert cancelled == []
    stuck = waiting.model_copy(update={"reason": "PartitionConfig"})
    with pytest.raises(OrchError, match=r"job 42 can never start: .*Reason=PartitionConfig.*cancelled it"):
        stuck_reason(stuck)
    assert cancelled == ["42"]
