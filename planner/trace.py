"""Predicted schedule of one step as a Chrome trace (Perfetto / chrome://tracing).

Form shared with the runtime's measured trace: complete events {"name", "ph": "X", "ts",
"dur"} in microseconds, `pid` = module name, `tid` = rank group (pipeline stage or island),
so the predicted and measured traces of one plan line up track by track.
"""

from __future__ import annotations

import json
from typing import Any

from orch.planner.plan import Placement, Plan


def one_f_one_b_order(stages: int, micro_batches: int) -> list[list[tuple[str, int]]]:
    """Non-interleaved 1F1B, per stage: ('F'|'B', micro-batch) in execution order.

    Stage s runs min(stages - s - 1, micro_batches) warm-up forwards, then alternates one
    forward and one backward, then drains the backwards. The runtime executes this order
    (runtime/parallel/pipeline.py); `one_f_one_b` simulates its timing.
    """
    order: list[list[tuple[str, int]]] = []
    for s in range(stages):
        warm = min(stages - s - 1, micro_batches)
        ops = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < micro_batches:
            if f < micro_batches:
                ops.append(("F", f))
                f += 1
            ops.append(("B", b))
            b += 1
        order.append(ops)
    return order


def one_f_one_b(
    stages: int, micro_batches: int, fwd: float, bwd: float, start: float = 0.0
) -> list[tuple[int, str, int, float, float]]:
    """Simulate non-interleaved 1F1B: (stage, 'F'|'B', micro-batch, start, end) per op."""
    order = one_f_one_b_order(stages, micro_batches)
    done: dict[tuple[int, str, int], float] = {}
    free = [start] * stages
    pos = [0] * stages
    out = []
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            while pos[s] < len(order[s]):
                kind, i = order[s][pos[s]]
                dep = (s - 1, "F", i) if kind == "F" else (s + 1, "B", i)
                if (kind == "F" and s == 0) or (kind == "B" and s == stages - 1):
                    ready = done.get((s, "F", i), start) if kind == "B" else start
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                t0 = max(free[s], ready)
                t1 = t0 + (fwd if kind == "F" else bwd)
                done[(s, kind, i)] = t1
                free[s] = t1
                out.append((s, kind, i, t0, t1))
                pos[s] += 1
                progress = True
    return out


def _event(name: str, pid: str, tid: str, t0: float, t1: float, **args: Any) -> dict[str, Any]:
    return {"name": name, "ph": "X", "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6, "pid": pid, "tid": tid, "args": args}


def predicted_trace(plan: Plan) -> dict[str, Any]:
    llm = plan.model.llm_name
    encoders = plan.model.encoder_names
    lp = plan.modules[llm]
    phases = plan.predicted.phases
    events: list[dict[str, Any]] = []
    t = 0.0
    mb = lp.num_micro_batches
    pp = lp.layout.pp
    llm_time = lp.time_s

    def pipeline(t0: float, stage_work: float, prefix: str = "") -> float:
        per = stage_work / mb
        end = t0
        for s, kind, i, a, b in one_f_one_b(pp, mb, per / 3, 2 * per / 3, t0):
            events.append(_event(f"{prefix}{kind}{i}", llm, f"stage {s}", a, b, micro_batch=i))
            end = max(end, b)
        return end

    work = llm_time / (1 + (pp - 1) / mb) if pp > 1 else llm_time
    if plan.placement == Placement.HOMOGENEOUS:
        enc_work = sum(phases.get(e, 0.0) for e in encoders)
        pipeline(t, work + enc_work, prefix="enc+llm ")
    elif plan.placement == Placement.COLOCATED:
        for e in encoders:
            d = phases.get(e, 0.0) / 3
            events.append(_event("forward", e, "all ranks", t, t + d))
            t += d
        for e in encoders:
            d = phases.get(f"{e}->{llm}", 0.0)
            events.append(_event(f"{e}->{llm}", "boundary", "all ranks", t, t + d))
            t += d
        t = pipeline(t, work)
        for e in reversed(encoders):
            d = 2 * phases.get(e, 0.0) / 3
            events.append(_event("backward", e, "all ranks", t, t + d))
            t += d
    else:
        fill = phases.get("fill", 0.0)
        # encoders on the same ranks share an island and take turns in each chunk; islands run side by side
        islands: dict[tuple[int, ...], list[str]] = {}
        for e in encoders:
            islands.setdefault(tuple(plan.modules[e].ranks), []).append(e)
        for i, members in enumerate(islands.values()):
            tid = "encoder island" if len(islands) == 1 else f"encoder island {i}"
            chunks = plan.modules[members[0]].num_micro_batches
            per = {e: phases.get(e, 0.0) / chunks for e in members}
            a = t
            for c in range(chunks):
                for e in members:
                    events.append(_event(f"chunk {c}", e, tid, a, a + per[e]))
                    a += per[e]
        pipeline(t + fill, work)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"kind": "predicted", "placement": plan.placement},
    }


def trace_json(plan: Plan) -> str:
    return json.dumps(predicted_trace(plan))
