"""`orch validate`: a plan's predicted step and phases beside what a run measured (metrics.jsonl).

Measured step time is the median over steps of the slowest rank's step (the runtime's
`step_time_s`), leaving out the first step (allocator, autograd and DTensor warm-up) when
there are more. Each row compares one of the plan's `predicted.terms` with the same part of
the runtime's timings (medians over steps of the mean over the ranks that do the work): a
module's forward+backward over its own ranks, the boundary moves, gradient sync + optimizer
and the orchestrator over all ranks; "other" is what no row names (waits at collectives,
Python). Under graph_1f1b an island's waits for the other island fall inside its module rows.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from orch.planner.errors import SpecError
from orch.planner.plan import Plan


class PhaseRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: str
    predicted_s: float | None = None
    measured_s: float | None = None
    relative_error: float | None = None


class Validation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    placement: str
    predicted_step_time_s: float
    measured_step_time_s: float
    relative_error: float = Field(description="(predicted - measured) / measured")
    steps_used: int
    phases: list[PhaseRow] = Field(default_factory=list)


def read_metrics(path: str | Path) -> list[dict[str, object]]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(str(path), "", "no such metrics file (expected WORKDIR/metrics.jsonl from `orch launch`)")
    records = []
    for i, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(str(path), f"line {i}", f"not JSON ({exc.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step_time_s"), int | float):
            raise SpecError(str(path), f"line {i}", "expected a metrics record with a numeric step_time_s")
        records.append(rec)
    if not records:
        raise SpecError(str(path), "", "no metrics records")
    return records


def _rel(pred: float, meas: float) -> float:
    return (pred - meas) / meas if meas > 0 else 0.0


def _ranks_of(records: list[dict[str, object]]) -> list[dict[str, dict[str, float]]]:
    """Per step: rank -> its phase seconds."""
    out = []
    for rec in records:
        ranks = rec.get("ranks")
        if isinstance(ranks, dict) and ranks:
            out.append({str(r): v for r, v in ranks.items() if isinstance(v, dict)})
    return out


def _median_mean(
    steps: list[dict[str, dict[str, float]]], ranks: list[str], value: Callable[[dict[str, float]], float]
) -> float:
    """Median over steps of the mean over `ranks` of value(rank's phases)."""
    per_step = [statistics.fmean(value(s.get(r, {})) for r in ranks) for s in steps if ranks]
    return statistics.median(per_step) if per_step else 0.0


def validate(plan: Plan, records: list[dict[str, object]]) -> Validation:
    used = records[1:] if len(records) > 1 else records
    measured = statistics.median(float(r["step_time_s"]) for r in used)  # type: ignore[arg-type]
    predicted = plan.predicted.step_time_s
    terms = plan.predicted.terms
    encs = plan.model.encoder_names
    llm = plan.model.llm_name
    steps = _ranks_of(used)
    rows: list[PhaseRow] = []

    def add(phase: str, p: float | None, m: float | None) -> None:
        err = _rel(p, m) if p is not None and m is not None else None
        rows.append(PhaseRow(phase=phase, predicted_s=p, measured_s=m, relative_error=err))

    def module_s(name: str, ph: dict[str, float]) -> float:
        if name == llm:
            return ph.get(f"{llm}.fwd_bwd", 0.0)
        return ph.get(f"{name}.fwd", 0.0) + ph.get(f"{name}.bwd", 0.0)

    def boundary_s(ph: dict[str, float]) -> float:
        return sum(ph.get(f"{e}.boundary", 0.0) + ph.get(f"{e}.boundary_bwd", 0.0) for e in encs)

    def sync_s(ph: dict[str, float]) -> float:
        return ph.get("grad_sync", 0.0) + ph.get("optimizer", 0.0)

    def orchestrator_s(ph: dict[str, float]) -> float:
        return ph.get("dispatch", 0.0) + sum(v for k, v in ph.items() if k == "route" or k.endswith(".route"))

    if steps:
        everyone = sorted({r for s in steps for r in s}, key=int)
        for name in plan.modules:
            ranks = [str(r) for r in plan.modules[name].ranks]
            add(
                f"{name} fwd+bwd",
                terms.get(f"{name} fwd+bwd"),
                _median_mean(steps, ranks, lambda ph, n=name: module_s(n, ph)),
            )
        has_boundary = any(f"{e}.boundary" in ph for s in steps for ph in s.values() for e in encs)
        add("boundaries", terms.get("boundaries"), _median_mean(steps, everyone, boundary_s) if has_boundary else None)
        add("grad sync+optimizer", terms.get("grad sync+optimizer"), _median_mean(steps, everyone, sync_s))
        add("orchestrator (dispatch, routes)", terms.get("orchestrator"), _median_mean(steps, everyone, orchestrator_s))

        def rest(ph: dict[str, float]) -> float:
            known = sum(module_s(n, ph) for n in plan.modules) + boundary_s(ph) + sync_s(ph) + orchestrator_s(ph)
            return max(ph.get("step", 0.0) - known, 0.0)

        add("other (waits, python)", None, _median_mean(steps, everyone, rest))
        if "fill" in plan.predicted.phases:
            add("fill", plan.predicted.phases["fill"], None)
    add("step", predicted, measured)
    return Validation(
        placement=str(plan.placement),
        predicted_step_time_s=predicted,
        measured_step_time_s=measured,
        relative_error=_rel(predicted, measured),
        steps_used=len(used),
        phases=rows,
    )


__all__ = ["PhaseRow", "Validation", "read_metrics", "validate"]
