"""What `orch launch --executor slurm` asks Slurm for: validated submitit parameters and the sbatch text.

Pure functions (no cluster, no submission), tested against tests/cli/golden/sbatch_tiny.txt. Every value
that reaches the sbatch script is checked against a strict pattern, or shell-quoted when it is
substituted into a setup line, so neither a plan nor a flag can inject shell: `#SBATCH` lines are
parsed by sbatch, not by a shell, so quoting alone would not make a partition like "gpu; rm" safe.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from orch.planner.errors import SpecError
from orch.planner.plan import Plan

# Slurm partition/account/QOS names: letters, digits and a few separators, nothing a shell or sbatch reads.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
# Slurm memory sizes as sbatch --mem takes them: an integer and an optional unit (K, M, G, T; default M).
_MEM = re.compile(r"^([1-9][0-9]{0,9})([KMGT]?)$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\}\}")
# Cap the warning before the time limit at a quarter of it: submitit's default 90 s on a 2-minute job
# would signal (and checkpoint) at once; a 1-minute job fails as "timed-out and not checkpointable".
_MAX_SIGNAL_DELAY_S = 90


@dataclass(frozen=True)
class SlurmOptions:
    """The launch flags that shape the allocation (all validated by `check_options`)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "4:00:00"
    job_name: str | None = None  # None: orch-<model name>
    setup: str | None = None  # path of a setup file; None: templates/slurm/default-setup.sh
    mem: str | None = None  # memory per node (sbatch --mem, e.g. 64G); None: the cluster's default


def default_setup_text() -> str:
    return (files("orch.templates") / "slurm" / "default-setup.sh").read_text()


def check_name(flag: str, value: str | None) -> str | None:
    if value is not None and not _NAME.match(value):
        raise SpecError(flag, "", f"expected a Slurm name ([A-Za-z0-9_.+-], at most 64), got {value!r}")
    return value


def check_mem(value: str | None) -> str | None:
    """`--mem`: a Slurm memory size per node (`4096`, `1500M`, `64G`); normalised to upper-case units."""
    if value is None:
        return None
    m = _MEM.match(value.strip().upper())
    if not m:
        raise SpecError("--mem", "", f"expected a memory size per node such as 4096, 1500M or 64G, got {value!r}")
    return m.group(1) + m.group(2)


def parse_time(value: str) -> int:
    """Slurm time (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH[:MM[:SS]]`) in whole minutes (at least 1)."""
    m = _TIME.match(value.strip())
    if not m:
        raise SpecError("--time", "", f"expected MM, HH:MM:SS or D-HH:MM:SS, got {value!r}")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    parts = [p for p in (a, b, c) if p is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, sec = [*parts, 0, 0][:3]
        seconds = h * 3600 + mi * 60 + sec
    elif len(parts) == 1:  # MM
        seconds = parts[0] * 60
    elif len(parts) == 2:  # MM:SS
        seconds = parts[0] * 60 + parts[1]
    else:  # HH:MM:SS
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    seconds += (days or 0) * 86400
    minutes = -(-seconds // 60)
    if minutes < 1:
        raise SpecError("--time", "", f"expected at least one minute, got {value!r}")
    return minutes


def allocation(plan: Plan) -> tuple[int, int]:
    """(nodes, tasks per node): one task per GPU, at most the cluster's GPUs per node on a node."""
    per_node = min(plan.ranks_per_node, plan.cluster.gpus_per_node, plan.world_size)
    if plan.world_size % per_node:
        raise SpecError("plan", "world_size", f"{plan.world_size} ranks do not fill nodes of {per_node} tasks")
    return plan.world_size // per_node, per_node


def render_setup(text: str, values: dict[str, str | int]) -> list[str]:
    """The setup file's lines with {{name}} replaced by the shell-quoted value; comments and blanks dropped."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise SpecError("--setup", "", f"unknown placeholder {{{{{name}}}}}; expected one of {', '.join(values)}")
        return shlex.quote(str(values[name]))

    lines = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        lines.append(_PLACEHOLDER.sub(sub, line))
    return lines


def executor_parameters(plan: Plan, opts: SlurmOptions, workdir: str, setup_text: str) -> dict[str, object]:
    """submitit SlurmExecutor parameters for one allocation of the plan (keys of `update_parameters`)."""
    nodes, per_node = allocation(plan)
    name = f"orch-{plan.model.name}"
    return allocation_parameters(name, nodes, per_node, plan.cluster.cpus_per_gpu, opts, workdir, setup_text)


def allocation_parameters(
    default_name: str,
    nodes: int,
    per_node: int,
    cpus_per_task: int | None,
    opts: SlurmOptions,
    workdir: str,
    setup_text: str,
) -> dict[str, object]:
    """submitit parameters of one allocation: `nodes` x `per_node` tasks, one GPU each (a plan's, a profile's).

    `cpus_per_task` None: left for runtime/launch/partition.py to take from the partition."""
    for flag, value in (("--partition", opts.partition), ("--account", opts.account), ("--qos", opts.qos)):
        check_name(flag, value)
    job_name = opts.job_name if opts.job_name is not None else default_name
    check_name("job name", job_name)
    if any(c in workdir for c in "\n\r\0"):
        raise SpecError("--workdir", "", "must not contain newlines or NUL")
    minutes = parse_time(opts.time)
    values: dict[str, str | int] = {
        "workdir": workdir,
        "job_name": job_name,
        "partition": opts.partition or "",
        "nodes": nodes,
        "tasks_per_node": per_node,
    }
    params: dict[str, object] = {
        "job_name": job_name,
        "time": minutes,
        "nodes": nodes,
        "ntasks_per_node": per_node,
        "gpus_per_node": per_node,
        "cpus_per_task": cpus_per_task,
        "signal_delay_s": min(_MAX_SIGNAL_DELAY_S, minutes * 60 // 4),
        "setup": render_setup(setup_text, values),
        # One rank failing ends the step: the peers do not wait in a collective until their timeout.
        "srun_args": ["--kill-on-bad-exit=1"],
        # A node failure ends the job (NODE_FAIL) instead of requeueing it to wait for nodes that may never
        # come back; orch's own checkpoint/requeue at the warning signal turns requeue on just before it
        # requeues (runtime/launch/slurm.py `_StopOnSignal.requeue`).
        "additional_parameters": {"no_requeue": True},
    }
    mem = check_mem(opts.mem)
    if mem is not None:
        params["mem"] = mem
    for key, value in (("partition", opts.partition), ("account", opts.account), ("qos", opts.qos)):
        if value is not None:
            params[key] = value
    return params


def submitit_command(python: str, folder: str) -> str:
    """The command submitit puts after `srun` (submitit.slurm.slurm.SlurmExecutor._submit_command)."""
    return " ".join([python, "-u -m submitit.core._submit", shlex.quote(folder)])


def sbatch_text(params: dict[str, object], folder: str | Path, python: str) -> str:
    """The sbatch script submitit would write for `params` (submitit's own `_make_sbatch_string`)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command=submitit_command(python, str(folder)), folder=folder, **params)  # type: ignore[arg-type]


__all__ = [
    "SlurmOptions",
    "allocation",
    "check_mem",
    "executor_parameters",
    "parse_time",
    "render_setup",
    "sbatch_text",
]
