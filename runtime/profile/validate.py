"""`orch validate`: a plan's predicted step and phases beside what a run measured (metrics.jsonl).

Measured step time is the median over steps of the slowest rank's step (the runtime's
`step_time_s`), leaving out each run's first step (allocator, autograd and DTensor warm-up) when
there are more; several runs of a plan pool their steps (on a shared machine, runs interleaved
with other plans' cancel the load's drift). Each row compares one of the plan's `predicted.terms` with the same part of
the runtime's timings, a median over steps of:
- a module's forward+backward: the slowest of its ranks (the next collective waits for it; the
  planner prices that rank too, planner/imbalance.py);
- a collective (boundary moves, the step's parameter gather and gradient sync, the orchestrator's
  dispatch and routes): the
  rank that spent least in it, the last to arrive, whose time is the collective's own and not a
  wait for the others;
- the rest of the step (the slowest rank's step less the rows above): batch bookkeeping, the
  waits no row names, Python; predicted as the profile's measured bookkeeping.
Under graph_1f1b an island's waits for the other island fall inside its module rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from orch.planner.plan import Plan
from orch.runtime.workdir.metrics import StepRecord


class PhaseRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: str
    predicted_s: float | None = None
    measured_s: float | None = None
    relative_error: float | None = None


class MemoryRow(BaseModel):
    """The ranks that hold one set of modules: the planner's memory per GPU for them against the largest peak
    and training state any of them measured (the last step's record)."""

    model_config = ConfigDict(extra="forbid")

    modules: str
    ranks: int
    predicted_gb: float
    measured_peak_gb: float | None = None
    measured_state_gb: float | None = None
    relative_error: float | None = None


class Validation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    placement: str
    predicted_step_time_s: float
    measured_step_time_s: float
    relative_error: float = Field(description="(predicted - measured) / measured")
    steps_used: int
    runs: int = Field(default=1, description="runs of the plan whose steps were pooled")
    phases: list[PhaseRow] = Field(default_factory=list)
    memory: list[MemoryRow] = Field(default_factory=list)


def _rel(pred: float, meas: float) -> float:
    return (pred - meas) / meas if meas > 0 else 0.0


def _ranks_of(records: list[StepRecord]) -> list[dict[str, dict[str, float]]]:
    """Per step: rank -> its phase seconds."""
    return [dict(rec.ranks) for rec in records if rec.ranks]


def _over_ranks(
    steps: list[dict[str, dict[str, float]]],
    ranks: list[str],
    value: Callable[[dict[str, float]], float],
    how: Callable[[list[float]], float],
) -> list[float]:
    """Per step: how(value(rank's phases) for rank in ranks)."""
    return [how([value(s.get(r, {})) for r in ranks]) for s in steps] if ranks else []


def validate(plan: Plan, *runs: list[StepRecord]) -> Validation:
    """Compare the plan's prediction with one or more runs of it (their steps pooled)."""
    used = [rec for records in runs for rec in (records[1:] if len(records) > 1 else records)]
    step_times = [r.step_time_s for r in used]
    measured = statistics.median(step_times)
    predicted = plan.predicted.step_time_s
    terms = plan.predicted.terms
    encs = plan.model.encoder_names
    llm = plan.model.llm_name
    steps = _ranks_of(used)
    rows: list[PhaseRow] = []

    def add(phase: str, p: float | None, m: float | None) -> None:
        err = _rel(p, m) if p is not None and m is not None else None
        rows.append(PhaseRow(phase=phase, predicted_s=p, measured_s=m, relative_error=err))

    def module_s(name: str) -> Callable[[dict[str, float]], float]:
        if name == llm:
            return lambda ph: ph.get(f"{llm}.fwd_bwd", 0.0)
        return lambda ph: ph.get(f"{name}.fwd", 0.0) + ph.get(f"{name}.bwd", 0.0)

    def key_s(key: str) -> Callable[[dict[str, float]], float]:
        return lambda ph: ph.get(key, 0.0)

    def routes_s(ph: dict[str, float]) -> float:
        return sum(v for k, v in ph.items() if k == "route" or k.endswith(".route"))

    if steps and len(steps) == len(step_times):
        everyone = sorted({r for s in steps for r in s}, key=int)
        parts: list[list[float]] = []

        def row(phase: str, pred: float | None, per_step: list[float]) -> None:
            parts.append(per_step)
            add(phase, pred, statistics.median(per_step))

        # compute: the slowest of the module's ranks (the next collective waits for it)
        for name in plan.modules:
            ranks = [str(r) for r in plan.modules[name].ranks]
            row(f"{name} fwd+bwd", terms.get(f"{name} fwd+bwd"), _over_ranks(steps, ranks, module_s(name), max))
        # collectives: the last rank to arrive waits least; its time is the collective's own
        if any(f"{e}.boundary" in ph for s in steps for ph in s.values() for e in encs):
            per = [0.0] * len(steps)
            for e in encs:
                for key in (f"{e}.boundary", f"{e}.boundary_bwd"):
                    per = [a + b for a, b in zip(per, _over_ranks(steps, everyone, key_s(key), min), strict=True)]
            row("boundaries", terms.get("boundaries"), per)
        else:
            add("boundaries", terms.get("boundaries"), None)
        sync = [
            a + b + c
            for a, b, c in zip(
                _over_ranks(steps, everyone, key_s("gather"), min),
                _over_ranks(steps, everyone, key_s("grad_sync"), min),
                _over_ranks(steps, everyone, key_s("optimizer"), max),
                strict=True,
            )
        ]
        row("grad sync+optimizer", terms.get("grad sync+optimizer"), sync)
        orch = [
            a + b
            for a, b in zip(
                _over_ranks(steps, everyone, key_s("dispatch"), min),
                _over_ranks(steps, everyone, routes_s, min),
                strict=True,
            )
        ]
        row("orchestrator (dispatch, routes)", terms.get("orchestrator"), orch)
        rest = [max(t - sum(p[i] for p in parts), 0.0) for i, t in enumerate(step_times)]
        add("bookkeeping, waits, python", terms.get("step bookkeeping"), statistics.median(rest))
        if "fill" in plan.predicted.phases:
            add("fill", plan.predicted.phases["fill"], None)
    add("step", predicted, measured)
    return Validation(
        memory=memory_rows(plan, runs[-1][-1] if runs and runs[-1] else None),
        placement=str(plan.placement),
        predicted_step_time_s=predicted,
        measured_step_time_s=measured,
        relative_error=_rel(predicted, measured),
        steps_used=len(used),
        runs=len(runs),
        phases=rows,
    )


def memory_rows(plan: Plan, last: StepRecord | None) -> list[MemoryRow]:
    """Per set of co-located modules: predicted GB per GPU (the sum of their modules' `memory_gb`) and the
    largest measured peak and state of those ranks."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank in range(plan.world_size):
        names = tuple(n for n, m in plan.modules.items() if rank in m.ranks)
        groups.setdefault(names, []).append(rank)
    rows = []
    for names, ranks in groups.items():
        predicted = sum(plan.modules[n].memory_gb for n in names)
        measured = [last.memory[str(r)] for r in ranks if last is not None and str(r) in last.memory]
        peak = max((m["peak_bytes"] for m in measured), default=None)
        state = max((m["state_bytes"] for m in measured), default=None)
        peak_gb = peak / 1e9 if peak is not None else None
        rows.append(
            MemoryRow(
                modules="+".join(names),
                ranks=len(ranks),
                predicted_gb=predicted,
                measured_peak_gb=peak_gb,
                measured_state_gb=state / 1e9 if state is not None else None,
                relative_error=_rel(predicted, peak_gb) if peak_gb else None,
            )
        )
    return rows


__all__ = ["MemoryRow", "PhaseRow", "Validation", "validate"]
