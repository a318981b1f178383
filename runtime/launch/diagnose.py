"""Why a Slurm job failed, most specific first: a rank out of memory (its allocator, or Slurm's --mem), a
node that died, else the first rank that raised. Reads sacct, sacctmgr's node events, sinfo, the task logs
and what each rank recorded (its node at start: `record_node`; its failure: runtime/launch/failures.py).
Torch-free.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from orch.planner.io import write_text_atomic
from orch.runtime.launch.base import TERMINAL
from orch.runtime.launch.failures import first_failure_record, is_peer_error
from orch.runtime.launch.heartbeat import blame, read_beats
from orch.runtime.launch.jobs import Accounting, Failure, JobRecord, log_path, run_command


def ranks_dir(workdir: Path) -> Path:
    return workdir / ".ranks"


def record_node(workdir: Path, job_id: str, rank: int) -> None:
    """Each task records the node it runs on: the job's real task layout, for `orch status` after a node dies."""
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    write_text_atomic(ranks_dir(workdir) / f"rank{rank}.json", json.dumps({"job_id": job_id, "node": node}))


def diagnose_failure(record: JobRecord, acct: Accounting) -> Failure | None:
    """The root cause, most specific first: a rank whose allocator refused memory or that the watchdog found
    stopped (runtime/launch/slurm.py cancels the job then), Slurm's memory limit, a failed
    node, Slurm's own end of the job (sacct's state: cancelled, time limit, preempted, ...), then the first rank
    that raised (peers of a dead rank fail after it, with connection errors), or the rank that stopped, when the
    first one only failed waiting for it (the heartbeats: runtime/launch/heartbeat.py)."""
    first = first_failure_record(Path(record.workdir))
    if first is not None and first.get("kind") in ("oom", "hang"):  # a hang: the watchdog cancelled the job
        rank, kind = int(str(first["rank"])), str(first["kind"])
        return Failure(rank=rank, error=str(first["error"]), log=str(log_path(record, rank, "err")), kind=kind)
    if acct.state in TERMINAL:
        oom = _memory_limit_failure(record, acct)
        if oom is not None:
            return oom
    if acct.state == "NODE_FAIL":
        return _node_failure(record, acct)
    ended = ended_by_slurm(acct)
    if ended is not None:
        kind, error = ended
        return Failure(rank=0, error=error, log=str(log_path(record, 0, "err")), kind=kind)
    if first is not None:
        rank, error = int(str(first["rank"])), str(first["error"])
        if is_peer_error(error):
            culprit = blame(read_beats(record.workdir), time.time(), rank)
            if culprit is not None:
                error = f"{culprit.summary}; rank {rank} failed waiting for it: {error}"
                log = str(log_path(record, culprit.rank, "err"))
                return Failure(rank=culprit.rank, error=error, log=log, kind="hang")
        kind = "diverged" if first.get("kind") == "diverged" else "error"
        return Failure(rank=rank, error=error, log=str(log_path(record, rank, "err")), kind=kind)
    refused = _refusal(record)
    if refused is not None:
        return Failure(rank=0, error=refused, log=str(log_path(record, 0, "err")))
    return None


REFUSED = "orch: refused: "  # rank 0's line when its prepare refused the run (runtime/launch/slurm.py)


def _refusal(record: JobRecord) -> str | None:
    """Rank 0's refusal of the run (a workdir of another model, or in use), from its log: it records nothing in
    the workdir, which may be another live run's."""
    lines = [ln for ln in _tail(log_path(record, 0, "err")).splitlines() if ln.startswith(REFUSED)]
    return lines[-1][len(REFUSED) :].strip() if lines else None


def ended_by_slurm(acct: Accounting) -> tuple[str, str] | None:
    """(kind, one line) when Slurm itself ended the job (sacct's state), whatever its ranks said as they were
    killed; None for a job that failed (or still runs) on its own."""
    resume = "relaunch the same command to resume from the newest checkpoint"
    if acct.state == "CANCELLED":
        who = f" by {acct.by}" if acct.by else ""
        return "cancelled", f"cancelled{who} (scancel) after {acct.elapsed or '?'}"
    if acct.state == "TIMEOUT":
        limit = f" ({acct.time_limit})" if acct.time_limit else ""
        return "timeout", f"reached its time limit{limit} after {acct.elapsed or '?'}; {resume} (or raise --time)"
    if acct.state == "PREEMPTED":
        return "preempted", f"preempted by a higher-priority job after {acct.elapsed or '?'}; {resume}"
    if acct.state == "BOOT_FAIL":
        return "boot_fail", "a node of the allocation failed to boot (BOOT_FAIL): the job never ran; relaunch it"
    if acct.state == "DEADLINE":
        return "deadline", f"passed its deadline (--deadline) after {acct.elapsed or '?'}"
    return None


# slurmstepd's line when jobacct_gather's OverMemoryKill (or a job-level limit) kills a step, in the task logs.
_MEM_KILL = re.compile(
    r"slurmstepd-(\S+): error: (?:StepId=|Step |Job )?\S* ?exceeded (?:job )?memory limit \((\d+) > (\d+)\)"
)


def _memory_limit_failure(record: JobRecord, acct: Accounting) -> Failure | None:
    """Slurm killed ranks over the job's --mem: the job ends OUT_OF_MEMORY (cgroup enforcement) or, with
    jobacct_gather's OverMemoryKill (no cgroups), FAILED/CANCELLED with slurmstepd's "exceeded memory limit" in
    the logs. The limit is per node: the rank named is the one sacct saw largest (MaxRSSTask) on that node."""
    found, where_logged = None, None
    for path in sorted(Path(record.log_folder).glob(f"{record.job_id}_*_log.err")):
        m = _MEM_KILL.search(_tail(path))
        if m:
            found, where_logged = m, path
            break
    if found is None and acct.state != "OUT_OF_MEMORY":
        return None
    node, used, limit = (found.group(1), int(found.group(2)), int(found.group(3))) if found else (None, 0, 0)
    rank, peak, peak_node = _largest_task(record.job_id)
    node = node or peak_node
    if rank is None:
        layout = _rank_layout(record, _hostnames(acct.nodes))
        on_node = sorted(r for r, n in layout.items() if n == node)
        rank = on_node[0] if on_node else 0
    where = f" on {node}" if node else ""
    detail = f" ({_mib(used)} > {_mib(limit)} per node)" if found else ""
    error = f"out of memory: Slurm killed the ranks{where} over the job's memory limit{detail}"
    if peak:
        error += f"; rank {rank} had the largest resident size ({_mib(_slurm_bytes(peak))})"
    if where_logged is not None and where_logged != log_path(record, rank, "err"):
        error += f"; slurmstepd's message is in {where_logged.name}"
    return Failure(rank=rank, error=error, log=str(log_path(record, rank, "err")), kind="oom", node=node)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _slurm_bytes(size: str) -> int:
    """sacct's sizes: 1652668K, 1.5G, 512M, 1024 (bytes)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    try:
        if size and size[-1].upper() in units:
            return int(float(size[:-1]) * units[size[-1].upper()])
        return int(float(size))
    except ValueError:
        return 0


def _largest_task(job_id: str) -> tuple[int | None, str, str | None]:
    """(rank, MaxRSS, node) of the ranks' step's largest task, from sacct (jobacct_gather); (None, "", None)."""
    lines = run_command(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,MaxRSS,MaxRSSNode,MaxRSSTask"]).splitlines()
    for line in lines:
        step, rss, node, task = [*line.split("|"), "", "", ""][:4]
        if step.startswith(f"{job_id}.") and step.split(".", 1)[1].isdigit() and task.isdigit():
            return int(task), rss, node or None
    return None, "", None


def _node_failure(record: JobRecord, acct: Accounting) -> Failure:
    """NODE_FAIL: which node died (accounting's node events during the job, else srun's "Node failure on X" in
    the batch log, else a node of the allocation that is down now) and which ranks were on it."""
    hosts = _hostnames(acct.nodes)
    failed = _down_events(hosts, acct.start, acct.end) or _srun_node_failures(record) or _down_now(hosts)
    layout = _rank_layout(record, hosts)
    ranks = sorted(r for r, n in layout.items() if n in failed)
    names = ", ".join(failed) if failed else "of the allocation"
    on = f"ranks {', '.join(map(str, ranks))} were on it" if ranks else "its ranks are unknown"
    rank = ranks[0] if ranks else 0
    log = str(log_path(record, rank, "err"))
    error = f"node {names} failed ({acct.state}): {on}"
    return Failure(rank=rank, error=error, log=log, kind="node_fail", node=failed[0] if failed else None, ranks=ranks)


def _hostnames(nodelist: str) -> list[str]:
    if not nodelist:
        return []
    return run_command(["scontrol", "show", "hostnames", nodelist]).split()


def _rank_layout(record: JobRecord, hosts: list[str]) -> dict[int, str]:
    """rank -> node: what each task recorded at its start, else Slurm's block distribution over `hosts`."""
    layout: dict[int, str] = {}
    per_node = record.tasks_per_node or (record.world_size // len(hosts) if hosts else 0)
    for rank in range(record.world_size):
        if per_node and rank // per_node < len(hosts):
            layout[rank] = hosts[rank // per_node]
    for path in ranks_dir(Path(record.workdir)).glob("rank*.json"):
        try:
            seen = json.loads(path.read_text())
            rank = int(path.stem[len("rank") :])
        except (OSError, ValueError):
            continue
        if str(seen.get("job_id")) == record.job_id and 0 <= rank < record.world_size:
            layout[rank] = str(seen["node"])
    return layout


def _down_events(hosts: list[str], start: str, end: str) -> list[str]:
    """Nodes of `hosts` that accounting saw go down between the job's start and a minute after its end."""
    from datetime import datetime, timedelta

    if not hosts or not start or start == "Unknown":
        return []
    try:
        t0 = datetime.fromisoformat(start)
        t1 = datetime.fromisoformat(end) + timedelta(minutes=1) if end and end != "Unknown" else datetime.max
    except ValueError:
        return []
    nodes = ",".join(hosts)
    out = run_command(
        ["sacctmgr", "-n", "-P", "list", "event", f"nodes={nodes}", f"start={start}", "format=NodeName,TimeStart,State"]
    )
    failed = []
    for line in out.splitlines():
        node, when, state = [*line.split("|"), "", ""][:3]
        try:
            at = datetime.fromisoformat(when)
        except ValueError:
            continue
        if node in hosts and t0 <= at <= t1 and "DOWN" in state.upper() and node not in failed:
            failed.append(node)
    return failed


def _srun_node_failures(record: JobRecord) -> list[str]:
    batch = log_path(record, 0, "err")  # the batch script's stderr (submitit's %j_0_log.err)
    found = re.findall(r"srun: error: Node failure on (\S+)", _tail(batch)) if batch.exists() else []
    return list(dict.fromkeys(found))


def _down_now(hosts: list[str]) -> list[str]:
    if not hosts:
        return []
    out = run_command(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N|%t"])
    return [n for n, st in (ln.split("|", 1) for ln in out.splitlines() if "|" in ln) if st.startswith("down")]


def _tail(path: Path, limit: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
