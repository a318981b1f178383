"""Atomic file writes: a reader never sees half a plan, profile or metrics file."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """`write_text_atomic` for bytes."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise  # a full disk: the caller knows how many bytes its file needs (runtime/disk.py)
        raise SpecError(str(p), "", f"cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_yaml(data: Any) -> str:
    """YAML with lists of scalars (rank lists) on one line and everything else in block style."""
    import yaml  # here, not at import: `orch status` writes files through this module and reads no YAML

    # libyaml's emitter when present (the same text, a third of the time: a 2,560-GPU plan's rank lists)
    class FlowListDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
        pass

    def represent_list(dumper: yaml.SafeDumper, items: list[Any]) -> yaml.Node:
        flow = all(not isinstance(x, (dict, list)) for x in items)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flow)

    FlowListDumper.add_representer(list, represent_list)
    return yaml.dump(data, Dumper=FlowListDumper, sort_keys=False, width=120)
