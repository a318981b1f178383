"""A full disk as one line: the path being written, the bytes it needed and the bytes free.

`no_space_guard(path, needed, what)` turns an ENOSPC raised inside it (an OSError, or torch's DCP wrapping
one, or any error of a write after which the filesystem has less free than the write needs: torch's zip writer
reports a short write as `unexpected pos`) into `NoSpaceError`; `check_free(path, needed, what)` refuses
before writing when the filesystem holding `path` has less than `needed` free. Both say the same line, so a
relaunch onto a disk still full repeats the failure's words. Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from orch.planner.errors import OrchError

FULL_BELOW = 1 << 20  # a write failing with less than this free failed for want of space, whatever it raised


class NoSpaceError(OrchError):
    """No space left on the device holding a run's files."""


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def free_bytes(path: str | Path) -> int:
    """Bytes free to this user on the filesystem of `path` (its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def no_space_line(path: str | Path, needed: int, what: str) -> str:
    return (
        f"{path}: no space left on device: {what} needs about {human_bytes(needed)} ({needed} bytes), "
        f"{human_bytes(free_bytes(path))} free"
    )


def is_no_space(exc: BaseException) -> bool:
    """ENOSPC anywhere in the exception: raised, chained, or one of a DCP CheckpointException's rank failures."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(e):  # a rank's failure DCP carries as text
            return True
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            todo.extend(f for f in failures.values() if isinstance(f, BaseException))
            todo.extend(
                f[0] for f in failures.values() if isinstance(f, tuple) and f and isinstance(f[0], BaseException)
            )
    return False


@contextlib.contextmanager
def no_space_guard(
    path: str | Path, needed: int, what: str, cleanup: Callable[[], None] | None = None
) -> Iterator[None]:
    """Inside: an ENOSPC becomes NoSpaceError, one line naming `path` and the `needed` bytes. `cleanup` runs on
    any error, before the line counts what is free."""
    try:
        yield
    except (NoSpaceError, KeyboardInterrupt, SystemExit, GeneratorExit):
        if cleanup is not None:
            cleanup()
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        # Less free than the write needs also counts: another rank's cleanup (a discarded .tmp) may have given back
        # the space between the failure and this check, and torch's zip writer says `unexpected pos`, not ENOSPC.
        full = is_no_space(exc) or free_bytes(path) < max(FULL_BELOW, needed)
        if cleanup is not None:
            cleanup()
        if full:
            raise NoSpaceError(no_space_line(path, needed, what)) from None
        raise


def check_free(path: str | Path, needed: int, what: str) -> None:
    """NoSpaceError (the guard's line) unless the filesystem of `path` has `needed` bytes free."""
    if free_bytes(path) < needed:
        raise NoSpaceError(no_space_line(path, needed, what))
