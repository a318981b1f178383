"""One rank under torchrun (or a Kubernetes PyTorchJob): `python -m orch.runtime.launch.torchrun_rank TASKFILE`.

Reads the task `orch launch --executor torchrun` pickled (runtime/launch/torchrun.py) and torch's standard
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: `RankEnv.from_torch_env`), then runs
the rank-start path of every launcher (runtime/launch/rank.py `run_rank`). Rank 0 prepares the task before
the rendezvous (the others wait in it), as a Slurm job's task 0 does. A missing or bad task file, or a
variable absent, is one line on stderr and exit code 2: no traceback, no process group.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from orch.planner.errors import OrchError
from orch.runtime.launch.rank import RankEnv, run_rank
from orch.runtime.launch.torchrun import read_task

USAGE = "usage: python -m orch.runtime.launch.torchrun_rank TASKFILE (under torchrun)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        env = RankEnv.from_torch_env("auto")
        task = read_task(args[0])
        if env.world != task.world_size:
            raise OrchError(f"WORLD_SIZE={env.world}: the task in {args[0]} needs {task.world_size} ranks")
        env = replace(env, device=task.device)  # "auto" is chosen on this rank's node (runtime/device.py)
        if env.rank == 0:
            task.prepare()  # before the rendezvous: no rank has started its body yet (a workdir in use: refused)
    except OrchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_rank(task, env)
    # As a local rank does (runtime/launch/local.py): done, files written, group destroyed; leave without the
    # interpreter's teardown, where a finished gloo rank now and then aborts on a joinable C++ thread.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
