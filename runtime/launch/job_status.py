"""A Slurm job's status as `orch status` / `orch jobs` show it: its accounting (runtime/launch/jobs.py), its last
metrics line and, once it ended other than COMPLETED, why (runtime/launch/diagnose.py). Torch-free."""

from __future__ import annotations

from orch.runtime.launch.diagnose import diagnose_failure
from orch.runtime.launch.jobs import JobStatus, accounting, load_record
from orch.runtime.workdir.metrics import last_record, metrics_path


def job_status(job_id: str) -> JobStatus:
    record = load_record(job_id)
    acct = accounting(job_id)
    status = JobStatus(
        job_id=job_id,
        state=acct.state,
        elapsed=acct.elapsed,
        exit_code=acct.exit_code,
        nodes=acct.nodes,
        reason=acct.reason,
        workdir=record.workdir,
        log_folder=record.log_folder,
    )
    last = last_record(metrics_path(record.workdir))
    if last is not None:
        status.step, status.loss = last.step, last.loss
    if acct.state != "COMPLETED":
        status.failure = diagnose_failure(record, acct)
    return status
