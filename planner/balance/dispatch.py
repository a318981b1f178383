"""The dispatcher's entry point: every phase of one global batch balanced, and the encoder→LLM routes.

`balance_batch` is what `orch balance` calls; `balance_arrays` is the same on numpy columns (the
runtime and the benchmark use it, skipping pydantic for 40,960 samples). A sample whose length is 0
in a phase takes no part in it: its destination is its origin and it moves no bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from orch.planner.balance.batch import LLM_PHASE, BalanceResult, Batch, PhaseResult
from orch.planner.balance.cost import (
    IntArray,
    PhaseArrays,
    batch_columns,
    build_phase_arrays,
    lower_bound,
    moved_bytes,
    rank_costs,
    rank_tokens,
)
from orch.planner.balance.greedy import exchange_under_cap, improve, lpt
from orch.planner.balance.mode import Mode
from orch.planner.balance.orch_padded import orch_padded
from orch.planner.balance.orch_unpadded import orch_unpadded
from orch.planner.balance.padded import optimal_cap, padded_runs
from orch.planner.balance.paper import paper
from orch.planner.errors import InfeasibleError, SpecError


@dataclass(frozen=True)
class PhaseOutcome:
    """One phase's destinations (one per batch sample) and their numbers, as numpy."""

    dest: IntArray
    costs: np.ndarray  # per rank
    lower_bound: float
    inter_node_bytes: int
    intra_node_bytes: int
    seconds: float

    def to_result(self) -> PhaseResult:
        return PhaseResult(
            dest=self.dest.tolist(),
            max_cost=float(self.costs.max(initial=0.0)),
            mean_cost=float(self.costs.mean()) if self.costs.size else 0.0,
            lower_bound=self.lower_bound,
            inter_node_bytes=self.inter_node_bytes,
            intra_node_bytes=self.intra_node_bytes,
            seconds=self.seconds,
        )


def dispatch_phase(ph: PhaseArrays, mode: Mode) -> IntArray:
    """Rank of each of the phase's samples (indexed like ph.ids) under `mode`.

    A token cap that the drawn placement meets can still dead-end the constructive heuristics
    (packing under a cap is bin packing: with 16 tokens of room in all, a greedy order runs out).
    Such a phase is balanced from where its samples are, by moves and swaps that keep every rank
    under the cap (greedy.improve, then greedy.exchange_under_cap: one long sample against several
    short ones); a padded one stays where it is. A cap the drawn placement does not meet either is
    the caller's error, raised as before.
    """
    if mode == Mode.NONE or ph.n == 0:
        return ph.origin.copy()
    try:
        return _heuristic(ph, mode)
    except InfeasibleError:
        cap = ph.spec.max_tokens
        if cap is None or rank_tokens(ph, ph.origin).max(initial=0) > cap:
            raise
        if ph.spec.padded:
            return ph.origin.copy()
        moved = improve(ph.costs, ph.origin, ph.num_ranks, ph.dp_per_node, lower_bound(ph), lengths=ph.lengths, cap=cap)
        return exchange_under_cap(ph.costs, ph.lengths, moved, ph.num_ranks, cap)


def _heuristic(ph: PhaseArrays, mode: Mode) -> IntArray:
    if mode == Mode.ORCH:
        return orch_padded(ph) if ph.spec.padded else orch_unpadded(ph)
    if mode == Mode.PAPER:
        return paper(ph)
    if ph.spec.padded:  # lpt on a padded phase: the binary-search runs, run k on rank k
        return padded_runs(ph.costs, ph.lengths, ph.num_ranks, ph.spec.max_tokens)
    return lpt(ph.costs, ph.num_ranks, ph.lengths, ph.spec.max_tokens)


def check_token_caps(ph: PhaseArrays, source: str) -> None:
    """Fail when no assignment at all can meet the phase's max_tokens."""
    cap = ph.spec.max_tokens
    if cap is None or ph.n == 0:
        return
    field = f"phases.{ph.name}.max_tokens"
    k = int(np.argmax(ph.lengths))
    if ph.lengths[k] > cap:
        raise SpecError(
            source,
            f"samples.{int(ph.ids[k])}.lengths.{ph.name}",
            f"{int(ph.lengths[k])} tokens exceed {field} ({cap}): no rank can hold this sample",
        )
    total = int(ph.lengths.sum())
    if not ph.spec.padded and total > ph.num_ranks * cap:
        raise SpecError(
            source, field, f"expected at least {-(-total // ph.num_ranks)}: {total} tokens over {ph.num_ranks} ranks"
        )
    if ph.spec.padded:
        order = np.lexsort((np.arange(ph.n), -ph.lengths))
        try:
            optimal_cap(ph.costs[order], ph.lengths[order], ph.num_ranks, cap)
        except InfeasibleError:
            raise SpecError(
                source, field, f"too small: padded samples need more than {ph.num_ranks} ranks of {cap} tokens"
            ) from None


def outcome(ph: PhaseArrays, local_dest: IntArray, origin: IntArray, seconds: float) -> PhaseOutcome:
    dest = origin.copy()
    dest[ph.ids] = local_dest
    moved = moved_bytes(ph.origin, local_dest, ph.bytes, ph.dp_per_node)
    return PhaseOutcome(dest, rank_costs(ph, local_dest), lower_bound(ph), moved.inter, moved.intra, seconds)


def balance_arrays(phases: dict[str, PhaseArrays], origin: IntArray, mode: Mode) -> dict[str, PhaseOutcome]:
    out = {}
    for name, ph in phases.items():
        start = time.perf_counter()
        local = dispatch_phase(ph, mode)
        out[name] = outcome(ph, local, origin, time.perf_counter() - start)
    return out


def routes(outcomes: dict[str, PhaseOutcome]) -> dict[str, np.ndarray]:
    """Per encoder phase, (encoder rank, LLM rank) of every sample: Π_llm ∘ Π_enc⁻¹ as two columns.

    routing.RouteTable(origin→enc).inverse().then(RouteTable(origin→llm)) is the same table
    (tests/unit/test_balance_props.py checks it); here it stays numpy.
    """
    if LLM_PHASE not in outcomes:
        return {}
    llm = outcomes[LLM_PHASE].dest
    return {name: np.stack([o.dest, llm], axis=1) for name, o in outcomes.items() if name != LLM_PHASE}


def batch_phase_arrays(batch: Batch) -> tuple[dict[str, PhaseArrays], IntArray]:
    phases = {}
    origin = np.zeros(0, dtype=np.int64)
    for name, spec in batch.phases.items():
        lengths, origin, bytes_ = batch_columns(batch, name)
        phases[name] = build_phase_arrays(name, spec, lengths, origin, bytes_, batch.num_ranks, batch.dp_per_node)
    if not batch.phases:
        origin = np.array([s.origin for s in batch.samples], dtype=np.int64)
    return phases, origin


def balance_batch(batch: Batch, mode: Mode = Mode.ORCH, source: str = "batch") -> BalanceResult:
    phases, origin = batch_phase_arrays(batch)
    for ph in phases.values():
        check_token_caps(ph, source)
    outcomes = balance_arrays(phases, origin, mode)
    return BalanceResult(
        phases={name: o.to_result() for name, o in outcomes.items()},
        routes={name: [(int(a), int(b)) for a, b in r.tolist()] for name, r in routes(outcomes).items()},
    )
