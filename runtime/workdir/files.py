"""The files a run opens in place in its workdir (the lock, heartbeats, appended records), opened without following
a symbolic link, and the workdir itself created private.

An atomic write (planner/io.py `write_text_atomic`) renames a new file over the name, so a link there is replaced,
never followed; a file opened in place (locked, rewritten in place, appended to) would write through a link to
wherever it points: a `run.lock` linked to a file outside the workdir would get that file truncated. `open_own`
refuses a link in one line (O_NOFOLLOW), and its descriptor is not inherited by a child (O_CLOEXEC).

A workdir orch creates is 0700 (`make_workdir`): whoever can write it could plant files the run reads. Another mode
is asked for with ORCH_WORKDIR_MODE (octal, e.g. 0750 to let a group read the run; the umask still applies); a mode
that lets others write is refused, and a run in an existing workdir others can write says so in one line
(runtime/workdir/run_dir.py `open_run`): Slurm's task pickles (submitit's, in WORKDIR/slurm/) are loaded as they are.
Torch-free.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from orch.planner.errors import OrchError

WORKDIR_MODE = 0o700
MODE_VARIABLE = "ORCH_WORKDIR_MODE"


class LinkRefused(OrchError):
    """A file orch opens in place in its workdir is a symbolic link."""


def open_own(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """os.open of a file orch owns in the workdir, never through a link (LinkRefused, one line)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENXIO and os.path.islink(path)):
            raise LinkRefused(
                f"{path}: a symbolic link, where orch keeps its own file: not followed (remove the link)"
            ) from None
        raise


def workdir_mode(environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """The mode a new workdir is created with: ORCH_WORKDIR_MODE (octal) or 0700."""
    text = environ.get(MODE_VARIABLE, "").strip()
    if not text:
        return WORKDIR_MODE
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777 or mode & 0o700 != 0o700 or mode & 0o022:
        raise OrchError(
            f"{MODE_VARIABLE}={text}: expected an octal mode that lets its owner in and no one else write (0700, "
            "0750, 0755): whoever can write a workdir can plant what its ranks load"
        )
    return mode


def others_can_write(path: str | Path) -> bool:
    """Whether the directory's group or anyone else may write into it (its mode; ACLs aside)."""
    return bool(os.stat(path).st_mode & 0o022)


def make_workdir(path: str | Path) -> Path:
    """`path` created (with its parents) with `workdir_mode()` when it does not exist; an existing one is left as it
    is. A workdir that cannot be created or written is one line naming it (OrchError)."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True, mode=workdir_mode())
    except OSError as exc:
        raise OrchError(f"{p}: cannot create the workdir ({exc.strerror}): choose a --workdir you can write") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise OrchError(f"{p}: the workdir is not writable: a run writes its lock, checkpoints and metrics there; "
                        "make it writable or choose another --workdir")  # fmt: skip
    return p
