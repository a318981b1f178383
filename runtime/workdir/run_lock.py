"""A run directory's one owner: WORKDIR/run.lock, flock'ed by the process that prepares the run, for its life.

The lock is an exclusive `flock` on an open descriptor, so the kernel releases it when the holder exits in
any way (a crash, SIGKILL, a node's reboot). The file also says who holds it (`Holder`: host, pid, job id,
Slurm restart count, start time), in place: replacing the file would give a new inode that a second
process could lock while the first still holds the old one. It is never opened through a symbolic link (one
line: runtime/workdir/files.py `open_own`): truncating it would truncate whatever the link points to. A clean
release empties it; a file still naming a holder when the lock is free is a stale lock of a process that died,
taken over with a note.

A requeued Slurm job (the same job id, a higher restart count) takes the lock from its previous
incarnation: if that one still holds it (a shared filesystem's lock lease outliving the process), it
waits up to `requeue_wait_s` for it. Anything else holding the lock refuses the launch with one line.
Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from orch.planner.errors import OrchError
from orch.runtime.workdir.files import make_workdir, open_own

LOCK_FILE = "run.lock"


class RunLocked(OrchError):
    """The run directory belongs to another live launch."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    job_id: str  # SLURM_JOB_ID, torchrun's run id, or "local"
    restart: int  # SLURM_RESTART_COUNT: which incarnation of a requeued job
    started: float  # time.time() when the lock was taken

    @classmethod
    def here(cls) -> Holder:
        job = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or "local"
        restart = os.environ.get("SLURM_RESTART_COUNT", "0")
        return cls(socket.gethostname(), os.getpid(), job, int(restart) if restart.isdigit() else 0, time.time())

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return f"pid {self.pid} on {self.host} (job {self.job_id}, since {since})"

    def alive_here(self) -> bool:
        """A live process of this host (another host's cannot be checked: False)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def is_earlier_incarnation_of(self, other: Holder) -> bool:
        """The same Slurm job before a requeue."""
        return self.job_id == other.job_id and self.job_id.isdigit() and self.restart < other.restart


def lock_path(workdir: str | Path) -> Path:
    return Path(workdir) / LOCK_FILE


def read_holder(path: Path) -> Holder | None:
    """Who the file says holds it, or None (empty: released cleanly; unreadable: treated as no one)."""
    try:
        raw = json.loads(path.read_text() or "null")
        return Holder(**raw) if isinstance(raw, dict) else None
    except (OSError, ValueError, TypeError):
        return None


class RunLock:
    """The lock of one run directory, held from `acquire` until `release` or the process's exit."""

    def __init__(self, workdir: str | Path, *, requeue_wait_s: float = 120.0, poll_s: float = 1.0) -> None:
        self.path = lock_path(workdir)
        self.requeue_wait_s, self.poll_s = requeue_wait_s, poll_s
        self._fd: int | None = None
        self.notes: list[str] = []  # what acquiring found (a stale lock taken over, a requeue), for the caller

    def acquire(self) -> None:
        """Take the lock or raise RunLocked naming its holder."""
        if self._fd is not None:
            return
        me = Holder.here()
        make_workdir(self.path.parent)
        fd = open_own(self.path, os.O_RDWR | os.O_CREAT)  # a link would be truncated wherever it points: refused
        try:
            self._lock(fd, me)
            previous = read_holder(self.path)
            if previous is not None and previous.is_earlier_incarnation_of(me):
                self.notes.append(f"{self.path}: taken over from job {me.job_id}'s previous incarnation (requeued)")
            elif previous is not None:
                self.notes.append(f"{self.path}: stale lock of {previous.describe()}, which is gone: taken over")
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(asdict(me)) + "\n").encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _lock(self, fd: int, me: Holder) -> None:
        deadline = time.monotonic() + self.requeue_wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    # A filesystem without flock (ENOLCK, EOPNOTSUPP): the file's words are all there is.
                    holder = read_holder(self.path)
                    if holder is not None and holder.alive_here():
                        raise in_use(self.path, holder) from None
                    print(
                        f"orch: {self.path}: cannot lock ({exc.strerror}): guarded by its words only", file=sys.stderr
                    )
                    return
            holder = read_holder(self.path)
            if holder is None or not holder.is_earlier_incarnation_of(me) or time.monotonic() > deadline:
                raise in_use(self.path, holder)
            time.sleep(self.poll_s)

    def release(self) -> None:
        """Empty the file (a clean end leaves no stale holder) and unlock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor releases the flock


def in_use(path: Path, holder: Holder | None) -> RunLocked:
    who = holder.describe() if holder is not None else "another process"
    return RunLocked(
        f"{path.parent}: in use by {who} ({path}); wait for it to end, stop it, or choose another --workdir"
    )


def probe(workdir: str | Path) -> None:
    """RunLocked if a live process holds the run directory's lock (for launchers that submit and return:
    refuse before submitting); takes nothing."""
    if is_held(workdir):
        path = lock_path(workdir)
        raise in_use(path, read_holder(path))


def is_held(workdir: str | Path) -> bool:
    """Whether a live process holds the run directory's lock now; takes nothing."""
    path = lock_path(workdir)
    if not path.exists() and not path.is_symlink():
        return False
    fd = open_own(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)
    return False
