"""`orch validate`: a plan's predicted step and phases beside what a run measured (metrics.jsonl).

Measured step time is the median over steps of the slowest rank's step (the runtime's
`step_time_s`), leaving out the first step (allocator, autograd and DTensor warm-up) when
there are more. Phases are medians over steps of the mean over ranks. The plan predicts per
module (compute, comms, grad sync and optimizer together) and per boundary; the measured
phases are grouped to match: encoders = their forwards + the encoder backwards.
"""

from __future__ import annotations

import json
import statistics
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


def _measured_phases(records: list[dict[str, object]]) -> dict[str, float]:
    per_step: list[dict[str, float]] = []
    for rec in records:
        ranks = rec.get("ranks")
        if not isinstance(ranks, dict) or not ranks:
            continue
        keys = {k for r in ranks.values() if isinstance(r, dict) for k in r}
        per_step.append(
            {k: statistics.fmean(float(r.get(k, 0.0)) for r in ranks.values() if isinstance(r, dict)) for k in keys}
        )
    if not per_step:
        return {}
    keys = set().union(*per_step)
    return {k: statistics.median(s.get(k, 0.0) for s in per_step) for k in keys}


def validate(plan: Plan, records: list[dict[str, object]]) -> Validation:
    used = records[1:] if len(records) > 1 else records
    measured = statistics.median(float(r["step_time_s"]) for r in used)  # type: ignore[arg-type]
    predicted = plan.predicted.step_time_s
    pred = plan.predicted.phases
    meas = _measured_phases(used)
    encs = plan.model.encoder_names
    llm = plan.model.llm_name
    rows: list[PhaseRow] = []

    def add(phase: str, p: float | None, m: float | None) -> None:
        err = _rel(p, m) if p is not None and m is not None else None
        rows.append(PhaseRow(phase=phase, predicted_s=p, measured_s=m, relative_error=err))

    if meas:
        enc_fwd = sum(meas.get(f"{e}.fwd", 0.0) for e in encs)
        bnd_fwd = sum(meas.get(f"{e}.boundary", 0.0) for e in encs)
        bnd_bwd = sum(meas.get(f"{e}.boundary_bwd", 0.0) for e in encs)
        if any(f"{e}.bwd" in meas for e in encs):
            enc_bwd = sum(meas.get(f"{e}.bwd", 0.0) for e in encs)
        else:  # older runtimes time the boundary and encoder backwards together
            enc_bwd = meas.get("encoders.bwd", 0.0) - bnd_bwd
        llm_s = meas.get(f"{llm}.fwd_bwd", 0.0)
        sync = meas.get("grad_sync", 0.0) + meas.get("optimizer", 0.0)
        for e in encs:
            add(e, pred.get(e), None)
        add("encoders (fwd+bwd)", sum(pred.get(e, 0.0) for e in encs), enc_fwd + enc_bwd)
        add("boundaries (fwd+bwd)", sum(pred.get(f"{e}->{llm}", 0.0) for e in encs), bnd_fwd + bnd_bwd)
        add(llm, pred.get(llm), llm_s)
        add("grad_sync+optimizer (in module rows)", None, sync)
        add(
            "modules incl. grad_sync+optimizer",
            sum(pred.get(e, 0.0) for e in encs) + pred.get(llm, 0.0),
            enc_fwd + enc_bwd + llm_s + sync,
        )
        phases_sum = meas.get("step", 0.0)
        known = enc_fwd + enc_bwd + bnd_fwd + bnd_bwd + llm_s + sync
        if phases_sum > known:
            add("other (dispatch, routing, python)", None, phases_sum - known)
        if "fill" in pred:
            add("fill", pred["fill"], None)
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
