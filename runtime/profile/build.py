"""The profile the planner reads, built from rank 0's raw record: each number found through its case.

The raw record (runtime/profile/bench.py `profile_rank`, WORKDIR/profile-raw.json) holds the medians
over ranks by case key (`times`), the peak block cases' activation bytes per token (`memory`), the
ranks of each link kind's groups, the device and the core sharing. The compute fits and the
alpha-beta fits of the links and the boundary are runtime/profile/fit.py's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from orch.planner.profile import BoundaryFit, CollectiveRow, ComputeFit, CoreSharing, LinkFit, ModuleProfile, Profile
from orch.planner.specs import ModelSpec
from orch.runtime.profile.cases import (
    LINKS,
    BlockCase,
    CommCase,
    Link,
    OverheadCase,
    ProfileConfig,
    RestCase,
    RuntimeCase,
    StepCase,
    build_cases,
    tp_degrees,
)
from orch.runtime.profile.fit import bandwidths, fit_alpha_beta, fit_compute


def build_profile(raw: dict[str, Any], model: ModelSpec, cfg: ProfileConfig, world: int, backend: str) -> Profile:
    """Fit the raw medians into the profile the planner reads (each number found by its case)."""
    import torch

    times: dict[str, float] = raw["times"]
    memory: dict[str, float] = raw["memory"]
    cases = build_cases(cfg, model, world)
    modules: dict[str, ModuleProfile] = {}
    for n in model.modules:
        fits: dict[int, ComputeFit] = {}
        for t in tp_degrees(model, n, world, cfg.ranks_per_node):
            blocks = [c for c in cases if isinstance(c, BlockCase) and c.module == n and c.tp == t]
            pts = _points(blocks, times)
            if pts:
                mem = next((memory[c.key] for c in blocks if c.peak and c.key in memory), 0.0)
                fits[t] = _fit(pts, mem)
        if not fits:
            continue
        rest_pts = _points([c for c in cases if isinstance(c, RestCase) and c.module == n], times)
        modules[n] = ModuleProfile(
            block=fits,
            rest=_fit(rest_pts, 0.0) if rest_pts else None,
            step_overhead_s=times.get(OverheadCase(n).key, 0.0),
            step_overhead_alone_s=times.get(OverheadCase(n, alone=True).key),
        )
    rows: list[CollectiveRow] = []
    links: dict[Link, LinkFit] = {}
    sizes: dict[str, int] = raw["group_sizes"]
    comms = sorted((c for c in cases if isinstance(c, CommCase)), key=lambda c: (c.link, c.op, c.nbytes))
    for c in comms:
        secs = times.get(c.key, 0.0)
        if secs <= 0:  # not measured, or the backend lacks the op
            continue
        ranks = sizes[c.link]
        algbw, busbw = bandwidths(c.op, ranks, c.nbytes, secs)
        rows.append(
            CollectiveRow(
                op=c.op, link=c.link, ranks=ranks, bytes=c.nbytes, time_s=secs, algbw_gbps=algbw, busbw_gbps=busbw
            )
        )
    for link in (link for link in LINKS if link in sizes):
        sendrecv = [(r.bytes, r.time_s) for r in rows if r.link == link and r.op == "send_recv"]
        if len(sendrecv) >= 2:
            alpha, gbps = fit_alpha_beta(sendrecv)
            links[link] = LinkFit(alpha_s=alpha, gbps=gbps)
    boundary = None
    runtime = next(c for c in cases if isinstance(c, RuntimeCase))
    bpts = [(times[p.bytes_key], times[p.key]) for p in runtime.boundaries if p.key in times]
    if len({b for b, _ in bpts}) >= 2:
        alpha, gbps = fit_alpha_beta(sorted(bpts))
        boundary = BoundaryFit(alpha_s=alpha, gbps=gbps, elem_bytes=cfg.elem_bytes)
    return Profile(
        cluster=f"local x{world}",
        device=raw["device"],
        backend=backend,
        torch_version=torch.__version__,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        dtype=cfg.dtype,
        model=model.name,
        modules=modules,
        links=links,
        collectives=rows,
        nproc=world,
        ranks_per_node=cfg.ranks_per_node,
        quick=cfg.quick,
        boundary=boundary,
        balance_step_s=times.get(runtime.key, 0.0),
        step_bookkeeping_s=times.get(StepCase().key, 0.0),
        sharing=CoreSharing(**raw["sharing"]) if raw.get("sharing") else None,
        steal_share=raw.get("steal", {}).get("share"),
        passes_repeated=raw.get("steal", {}).get("repeated", 0),
    )


def _points(cases: list[BlockCase] | list[RestCase], times: dict[str, float]) -> list[tuple[int, int, float]]:
    """(k, length, seconds) of the measured `cases`, sorted."""
    return sorted((c.k, c.length, times[c.key]) for c in cases if c.key in times)


def _fit(points: list[tuple[int, int, float]], mem_per_token: float) -> ComputeFit:
    quadratic = len({length for _, length, _ in points}) >= 3
    cost, rel_error = fit_compute(points, quadratic=quadratic)
    return ComputeFit(**cost.model_dump(), rel_error=rel_error, memory_bytes_per_token=mem_per_token)


__all__ = ["build_profile"]
