"""Spec and config files read within a size limit, and written atomically: a reader never sees half a plan,
profile or metrics file."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError

# The most a spec or config file orch reads may hold (a plan for 100,000 GPUs is about 2 MB): a larger one is
# refused before it is parsed (PyYAML took 70-90 s to reject a 50 MB line; a model spec took one of 1.2 GB).
MAX_SPEC_BYTES = 16 * 2**20


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
            raise  # a full disk: the caller knows how many bytes its file needs (runtime/workdir/disk.py)
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


def read_spec_text(path: str | Path) -> str:
    """The text of a spec or config file (YAML or JSON): what every one orch reads goes through, so that one larger
    than MAX_SPEC_BYTES is one line naming it and the limit, before any parsing."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            str(path),
            "",
            f"{_size(p)}: more than a spec or config file may hold ({MAX_SPEC_BYTES >> 20} MiB, {MAX_SPEC_BYTES:,} "
            "bytes; is it a data file?)",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), "", f"not UTF-8 text (byte {exc.start})") from None


def _size(path: Path) -> str:
    try:
        return f"{path.stat().st_size:,} bytes"
    except OSError:
        return "over the limit"
