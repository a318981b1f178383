"""What a Slurm partition's nodes have (sinfo), and an allocation's request fitted to it before submitting.

A request no node can meet never starts: Slurm keeps it PENDING (Reason=PartitionConfig) for ever. So
before submitting, orch reads the partition's smallest node (CPUs, memory, GPUs, node count), takes the
figures the cluster spec leaves unset from it (CPUs per task: the node's CPUs over its tasks; memory:
what the ranks need), and refuses, with one line saying what to change, a request that asks for more
than any node has. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orch.planner.errors import OrchError, SpecError
from orch.runtime.launch.jobs import JobStatus, cancel, run_command

# Host memory of one rank beyond the plan's own memory: measured 0.35 GiB peak resident (VmHWM) for each
# gloo rank of the tiny model after 3 steps, at 2 and at 4 ranks (python, torch, gloo); a CUDA context
# adds host memory of its own. 1 GiB per rank leaves room for both.
HOST_OVERHEAD_MB = 1024
DEFAULT_CPUS_PER_TASK = 8  # what a cluster spec without cpus_per_gpu asked before partitions were read

# Pending reasons that never clear while the job and the partition stay as they are.
NEVER_STARTS = {
    "PartitionConfig": "the request exceeds what the partition's nodes have",
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "a time limit over the partition's",
    "BadConstraints": "constraints no node satisfies",
    "InvalidAccount": "an account Slurm does not know",
    "InvalidQOS": "a QOS Slurm does not know",
}


@dataclass(frozen=True)
class Partition:
    """The partition's nodes, as small as its smallest one (what any node of an allocation surely has)."""

    name: str
    nodes: int
    cpus: int
    mem_mb: int
    gpus: int | None  # GRES gpu count per node; None: the nodes list no GPUs


def _gpus(gres: str) -> int | None:
    """`gpu:4`, `gpu:h100:8(S:0-1)`, `gpu:a100:4,shard:8` -> the GPU count; None without a gpu GRES."""
    found = [int(m.group(1)) for m in re.finditer(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", gres)]
    return sum(found) if found else None


def read_partition(name: str | None) -> Partition | None:
    """The partition `name` (None: the default, marked `*` by sinfo); None when no Slurm answers here
    (a dry run on a machine without Slurm) or the partition has no nodes."""
    try:
        out = run_command(["sinfo", "-h", "-N", "-o", "%N|%c|%m|%G|%P"], timeout=20)
    except OrchError:  # no sinfo here, or it hangs: nothing to fit to
        return None
    rows = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[1].isdigit():
            continue
        node, cpus, mem, gres, part = parts
        default = part.endswith("*")
        part = part.rstrip("*")
        if (name is None and default) or part == name:
            rows.append((node, int(cpus), int(re.sub(r"\D", "", mem) or 0), _gpus(gres), part))
    if not rows:
        return None
    nodes = {r[0] for r in rows}
    gpus = [r[3] for r in rows]
    return Partition(
        name=rows[0][4],
        nodes=len(nodes),
        cpus=min(r[1] for r in rows),
        mem_mb=min(r[2] for r in rows),
        gpus=None if any(g is None for g in gpus) else min(g for g in gpus if g is not None),
    )


def _mem_mb(value: str) -> int:
    """A --mem value (4096, 1500M, 64G, 1T) in MB."""
    m = re.fullmatch(r"(\d+)([KMGT]?)", value.strip().upper())
    if m is None:
        return 0
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2)]
    return int(int(m.group(1)) * scale)


def fit_to_partition(
    params: dict[str, object],
    part: Partition | None,
    *,
    cpus_given: bool,
    memory_gb_per_rank: float,
    source: str = "plan",
) -> dict[str, object]:
    """`params` (submitit's) with the unset figures taken from `part` and a request no node meets refused.

    `cpus_given`: the cluster spec set cpus_per_gpu (else CPUs per task = the node's CPUs over its tasks);
    `memory_gb_per_rank`: the plan's memory per rank, to which HOST_OVERHEAD_MB is added for the default
    --mem (capped at the node's memory); `source`: the file whose cluster spec the errors name."""
    out = dict(params)
    nodes = int(out["nodes"])  # type: ignore[call-overload]
    tasks = int(out["ntasks_per_node"])  # type: ignore[call-overload]
    if part is None:
        if out.get("cpus_per_task") is None:
            out["cpus_per_task"] = DEFAULT_CPUS_PER_TASK
        return out
    where = f"partition {part.name}"
    if nodes > part.nodes:
        raise SpecError(
            "--nodes", "", f"the plan needs {nodes} nodes; {where} has {part.nodes} (plan for {part.nodes} or fewer)"
        )
    if part.gpus is not None and tasks > part.gpus:
        raise SpecError(
            source,
            "cluster.gpus_per_node",
            f"{tasks} tasks (one per GPU) per node; {where}'s nodes have {part.gpus} GPUs (set gpus_per_node: "
            f"{part.gpus} in the cluster spec and plan again)",
        )
    if not cpus_given or out.get("cpus_per_task") is None:
        out["cpus_per_task"] = max(1, part.cpus // tasks)
    cpus = int(out["cpus_per_task"])  # type: ignore[call-overload]
    if cpus * tasks > part.cpus:
        raise SpecError(
            source,
            "cluster.cpus_per_gpu",
            f"{cpus} CPUs x {tasks} tasks = {cpus * tasks} per node; {where}'s nodes have {part.cpus} CPUs (set "
            f"cpus_per_gpu to at most {max(1, part.cpus // tasks)}, or leave it out to take it from the partition)",
        )
    if "mem" in out:
        asked = _mem_mb(str(out["mem"]))
        if asked > part.mem_mb:
            raise SpecError("--mem", "", f"{out['mem']} per node; {where}'s nodes have {part.mem_mb}M")
    else:
        need = tasks * (HOST_OVERHEAD_MB + int(memory_gb_per_rank * 1024))
        out["mem"] = f"{min(need, part.mem_mb)}M"
    return out


def stuck_reason(status: JobStatus) -> None:
    """Cancel a job Slurm keeps PENDING for a reason that never clears, and raise an OrchError saying why."""
    if status.state != "PENDING" or status.reason not in NEVER_STARTS:
        return
    cancel(status.job_id)
    raise OrchError(
        f"job {status.job_id} can never start: Slurm keeps it PENDING (Reason={status.reason}: "
        f"{NEVER_STARTS[status.reason]}); cancelled it. Change the request (the cluster spec's gpus_per_node or "
        f"cpus_per_gpu, --mem, --time, --partition, --account, --qos) and launch again"
    )
