"""A rank's stop request under signals as they arrive: a Ctrl-C reaches a rank together with the launcher's
forwarded SIGUSR1, so one signal's handler may run inside another's."""

import subprocess
import sys
import textwrap

# In a child process: the handler of SIGUSR1 is `request`; while the main thread runs `request` (the handler of
# the first signal), each line it executes, in it and in whatever it calls, raises SIGUSR1 again, so the nested
# handler runs at every point of the first one (where a lock it took would be held).
NESTED = textwrap.dedent(
    """
    import os, signal, sys
    from orch.runtime.preemption import Preemption

    stop = Preemption(armed=True)
    signal.signal(signal.SIGUSR1, stop.request)
    depth = [0]
    sent = [0]

    def lines(frame, event, arg):
        if event == "line" and depth[0] == 1:
            sent[0] += 1
            os.kill(os.getpid(), signal.SIGUSR1)
        return lines

    def calls(frame, event, arg):
        if frame.f_code.co_name == "request":
            depth[0] += 1
        return lines if depth[0] == 1 else None

    sys.settrace(calls)
    stop.request()
    sys.settrace(None)
    print("requested", stop.requested, "nested signals", sent[0] > 0, flush=True)
    """
)


def test_a_signal_landing_inside_the_stop_handler_neither_hangs_nor_loses_the_request():
    done = subprocess.run([sys.executable, "-c", NESTED], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["requested", "True", "nested", "signals", "True"]


def test_a_request_is_what_the_armed_ranks_agree_on_and_is_never_checked_unarmed():
    from orch.runtime.preemption import Preemption

    stop = Preemption(armed=False)
    assert not stop.requested
    stop.request(15, None)  # as a signal handler is called
    assert stop.requested
    assert stop.agreed() is False
