"""Running plans in the tests the way users do: the local launcher running the trainer's task."""

import subprocess
import sys
import time
from pathlib import Path

from orch.runtime.launch.base import TaskSequence
from orch.runtime.launch.local import LocalLauncher
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.trainer import TrainTask

# Ranks forked from one forkserver that imported torch and the trainer once: seconds less per launch, the
# same code on each rank (tests/cli's `orch launch` runs keep covering spawn, what users run).
LAUNCHER = LocalLauncher(start_method="forkserver")


def train_local(plan, data, cfg, workdir, *, debug=None, timeout_s=60.0):
    """`orch launch --executor local`'s path: one launch of `plan`; its StepRecords."""
    task = TrainTask(plan, data, cfg, str(workdir), debug or DebugConfig(), timeout_s)
    return LAUNCHER.submit(task).result()


def train_tasks(plans: dict, data, cfg, out: Path, *, debug=None, extra=()):
    """One TrainTask per (name, plan) in out/<name>, each dumping its tensors there, plus `extra` tasks,
    all in ONE launch (a TaskSequence: one process group); name -> StepRecords. `data` and `cfg` are one
    for all plans, or a dict by name (plans of one world size on different batches share the launch too).

    Process start-up and the gloo rendezvous, not the plans, dominated the time when every plan was
    a launch of its own.
    """
    debug = debug or DebugConfig()
    tasks = {}
    for name, plan in plans.items():
        workdir = Path(out) / name
        workdir.mkdir(parents=True, exist_ok=True)
        dump = DebugConfig(dump_dir=str(workdir), count_tokens=debug.count_tokens)
        c = cfg[name] if isinstance(cfg, dict) else cfg
        d = data[name] if isinstance(data, dict) else data
        tasks[name] = TrainTask(plan, d, c, str(workdir), dump, timeout_s=120.0)
    results = LAUNCHER.submit(TaskSequence([*tasks.values(), *extra])).result()
    return dict(zip(tasks, results, strict=False))


def train_runs(runs: dict, *, timeout_s=60.0, launcher=None):
    """name -> (plan, data, cfg, workdir), as `orch launch` runs them (no tensor dumps), all in ONE launch (one
    world size); name -> StepRecords. Each run has its own workdir; a run that resumes another's checkpoint
    belongs in a later launch (a resumed run is a new process). `launcher`: another than the shared forkserver
    one (a spawned rank writes to the test's stderr, which capfd reads; the forkserver's to where it started)."""
    tasks = {
        name: TrainTask(plan, data, cfg, str(workdir), DebugConfig(), timeout_s)
        for name, (plan, data, cfg, workdir) in runs.items()
    }
    results = (launcher or LAUNCHER).submit(TaskSequence(list(tasks.values()))).result()
    return dict(zip(tasks, results, strict=True))


def launch_in_background(*args: str, workdir: Path, records: int = 2) -> subprocess.Popen[str]:
    """`orch launch ARGS --workdir WORKDIR` as a user's terminal starts it (its own session), once its metrics hold
    `records` steps: what a signal test then signals."""
    cmd = [sys.executable, "-c", "from orch.cli.app import main; main()", "launch", *args, "--workdir", str(workdir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = Path(workdir) / "metrics.jsonl"
    end = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= records) and time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return proc
