"""The metrics file of a run: WORKDIR/metrics.jsonl, one StepRecord per line, written by rank 0.

A versioned pydantic model like every other file orch writes (`orch schema metrics`); `orch validate`,
`orch status` and the launchers read lines back through `read_metrics`. Torch-free.

A crash while a line is written leaves it torn: the file's last line, without its newline and not JSON. Every
reader drops such a line (saying so once on stderr); a bad line anywhere else is an error naming it. A full
disk while appending is one line naming the file and the bytes the record needed (runtime/workdir/disk.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orch.planner.errors import SpecError
from orch.planner.io import write_text_atomic
from orch.runtime.workdir.disk import no_space_guard
from orch.runtime.workdir.files import open_own

METRICS_FILE = "metrics.jsonl"


class StepRecord(BaseModel):
    """One training step as the ranks measured it (the slowest rank's time is the step's).

    A diverging step's loss and gradient norm are kept as they were, NaN or infinite: written as JSON's
    common extension `NaN` / `Infinity` (Python's json and pandas read them), so the record of the step that
    stopped the run says what went wrong (runtime/train/divergence.py)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    version: Literal[1] = 1
    step: int = Field(ge=0, description="the step's index (0-based)")
    loss: float = Field(
        description="the global loss: summed over the LLM's label tokens / their count (NaN or Infinity: diverged)"
    )
    tokens: int = Field(ge=0, description="label tokens of the global batch")
    step_time_s: float = Field(ge=0, description="the slowest rank's step time")
    setup_s: float = Field(default=0.0, ge=0, description="building the modules (first step of a launch only)")
    ranks: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="rank -> phase -> seconds ('step': the rank's whole step)"
    )
    balance: dict[str, Any] = Field(
        default_factory=dict, description="post-balancing: mode, per-phase costs and bytes, dispatcher seconds"
    )
    grad_norm: float | None = Field(
        default=None, description="the whole model's gradient norm, before clipping (NaN or Infinity: diverged)"
    )
    lr: float | None = Field(default=None, ge=0, description="the step's learning rate (before per-module factors)")
    aux_loss: float | None = Field(
        default=None,
        description="a Mixture-of-Experts LLM's router auxiliary loss (runtime/train/aux_loss.py: per micro-batch, "
        "weighted by its share of the step's LLM rows), not in `loss`; the step trained loss + coef x aux_loss",
    )
    memory: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="rank -> state_bytes (parameters, gradients, optimizer state) and peak_bytes (CUDA: "
        "max_memory_allocated; CPU: state + the most saved activations held at once, which a CPU rank also "
        "records as activation_bytes; runtime/memory.py)",
    )
    data: dict[str, int] | None = Field(
        default=None,
        description="with a data file: samples, skipped (no longer parse, or media gone), truncated (to seq_len), "
        "failed (media that did not decode: the sample trained nothing), decoded ((sample, encoder) inputs built); "
        "the last two summed over ranks; the media named in data_problems.jsonl",
    )
    processed: dict[str, dict[str, dict[str, int]]] | None = Field(
        default=None, description="rank -> module -> sample id -> tokens (tests' token counts; absent otherwise)"
    )

    @field_validator("grad_norm")
    @classmethod
    def _not_negative(cls, value: float | None) -> float | None:
        if value is not None and value < 0:  # NaN and +inf pass: a diverged step's norm, recorded as it was
            raise ValueError(f"expected a norm >= 0, got {value}")
        return value


def phase_imbalance(record: StepRecord, *, before: bool = False) -> dict[str, float]:
    """Each post-balanced phase's imbalance: the slowest rank's cost over the mean rank's (1: balanced), after
    balancing, or before it."""
    when, out = "_before" if before else "", {}
    for phase, st in record.balance.items():
        if isinstance(st, dict) and f"max_cost{when}" in st:
            mean = st.get(f"mean_cost{when}", 0.0)
            out[phase] = st[f"max_cost{when}"] / mean if mean else 1.0
    return out


def metrics_path(workdir: str | Path) -> Path:
    return Path(workdir) / METRICS_FILE


def read_metrics(path: str | Path, *, missing_ok: bool = False) -> list[StepRecord]:
    """Every record of a metrics file (at least one unless `missing_ok`); a torn last line is dropped with a
    note on stderr; any other bad line is a SpecError naming the file, the line and the field."""
    p = Path(path)
    if not p.is_file():
        if missing_ok:
            return []
        raise SpecError(str(path), "", "no such metrics file (expected WORKDIR/metrics.jsonl from `orch launch`)")
    records = []
    for i, line in complete_lines(p):
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(str(path), f"line {i}", f"not JSON ({exc.msg})") from None
        try:
            records.append(StepRecord.model_validate(raw))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            what = f"{where}: {err['msg'].lower()}" if where else err["msg"].lower()
            raise SpecError(
                str(path), f"line {i}", f"expected a metrics record (`orch schema metrics`): {what}"
            ) from None
    if not records and not missing_ok:
        raise SpecError(str(path), "", "no metrics records")
    return records


def complete_lines(path: Path, *, quiet: bool = False) -> list[tuple[int, str]]:
    """(1-based line number, text) of the file's non-blank lines, a torn last line left out (said on stderr
    unless `quiet`: a reader polling a file being written sees lines in progress)."""
    text = path.read_text()
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
    if lines and not text.endswith("\n") and not _is_json(lines[-1][1]):
        i, torn = lines.pop()
        if not quiet:
            print(
                f"orch: {path}: line {i} is torn ({len(torn)} bytes without a newline: a crash while writing it); "
                "dropped",
                file=sys.stderr,
            )
    return lines


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def last_record(path: str | Path) -> StepRecord | None:
    """The newest complete record, or None when the file is missing, empty or its last line is not a record."""
    p = Path(path)
    try:
        lines = complete_lines(p, quiet=True)
    except OSError:
        return None
    if not lines:
        return None
    try:
        return StepRecord.model_validate_json(lines[-1][1])
    except ValidationError:
        return None


def append_record(path: str | Path, record: StepRecord) -> None:
    """One line appended (rank 0 only; a line is written whole by one write call)."""
    line = record.model_dump_json(exclude_none=True) + "\n"
    with no_space_guard(path, len(line.encode()), "a step's record"):
        fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # appended in place: never through a link
        try:
            data = memoryview(line.encode())
            while data:  # a short write (a disk filling up) goes on until it fails with ENOSPC
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)


def truncate_after(path: str | Path, start: int) -> None:
    """Keep the records of steps before `start` (a resumed run continues after its checkpoint); 0: remove.
    A torn last line is dropped (a later append would otherwise continue it)."""
    p = Path(path)
    if start == 0:
        p.unlink(missing_ok=True)
        return
    if not p.exists():
        return
    kept = []
    for i, line in complete_lines(p):
        try:
            step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise SpecError(str(p), f"line {i}", "expected a metrics record (`orch schema metrics`)") from None
        if step < start:
            kept.append(line)
    with no_space_guard(p, sum(len(ln) + 1 for ln in kept), "the kept records"):
        write_text_atomic(p, "".join(ln + "\n" for ln in kept))
