"""`orch launch --executor local` under a signal, as a user's terminal or a scheduler sends it: the ranks save at
one step, the command exits 0 with one line, and nothing runs on or prints a traceback after it returned."""

import os
import re
import signal
import time

import pytest
from launching import launch_in_background

from orch.runtime.launch.heartbeat import read_beats


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "group"), [(signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGTERM, True)])
def test_a_signal_to_launch_saves_and_exits_zero_with_one_line(plan_file, tmp_path, signum, group):
    path, _, _ = plan_file
    workdir = tmp_path / "run"
    proc = launch_in_background(str(path), "--nproc", "2", "--steps", "500", workdir=workdir)
    # group: Ctrl-C in a terminal, systemd's stop or `kill -TERM -PGID`, which reach the launcher and its ranks at once
    (os.killpg if group else os.kill)(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    name = signal.Signals(signum).name
    stops = [ln for ln in err.splitlines() if ln.startswith("stopped at step")]  # people's lines: stderr
    assert len(stops) == 1, (out, err)
    step = int(re.fullmatch(rf"stopped at step (\d+) by {name}; checkpoint step_(\d+); relaunch the same command to "
                            r"resume", stops[0]).group(1))  # fmt: skip
    assert stops[0].endswith(f"step_{step:08d}; relaunch the same command to resume")
    assert (workdir / "checkpoints" / f"step_{step:08d}").is_dir()
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err
    time.sleep(1.0)  # anything still running would still be printing or alive now
    for beat in read_beats(workdir).values():
        with pytest.raises(ProcessLookupError):
            os.kill(beat.pid, 0)
