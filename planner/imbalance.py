"""Residual imbalance after post-balancing: the slowest rank of a phase over the mean rank.

Every module's forward and backward end at a collective (a boundary move, the gradient sync), so
a step waits for the phase's slowest rank, not its mean one. Post-balancing narrows the gap but
cannot close it: samples are indivisible, and a few long ones among dp ranks cannot be split
evenly (with 4 samples per rank the gap is tens of percent). Estimated the way the runtime gets
there: global batches drawn from the DataSpec, balanced by the dispatcher's `orch` mode over the
module's DP ranks, costs from the module's per-sample cost (planner/sample_cost.py).
"""

from __future__ import annotations

from functools import lru_cache

from orch.planner.data import sample_lengths
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import DataSpec

BATCHES = 16  # global batches drawn per estimate (the mean of their max/mean)


def residual_imbalance(data: DataSpec, module: str, llm: str, dp: int, dp_per_node: int, cost: SampleCost) -> float:
    """Mean over drawn global batches of (slowest DP rank's cost) / (mean DP rank's cost), >= 1, with the
    module's per-sample `cost` (its per-call term plays no part: the same for every placement)."""
    if dp <= 1:
        return 1.0
    terms = (cost.constant, cost.linear, cost.quadratic)
    return _imbalance(data.model_dump_json(), module, llm, dp, dp_per_node, terms)


@lru_cache(maxsize=256)
def _imbalance(data_json: str, module: str, llm: str, dp: int, dpn: int, terms: tuple[float, float, float]) -> float:
    import numpy as np

    from orch.planner.balance.batch import PhaseSpec
    from orch.planner.balance.cost import build_phase_arrays, rank_costs
    from orch.planner.balance.dispatch import dispatch_phase
    from orch.planner.balance.mode import Mode

    data = DataSpec.model_validate_json(data_json)
    constant, linear, quadratic = terms
    if constant <= 0 and linear <= 0 and quadratic <= 0:
        linear = 1.0  # no measured cost: tokens alone
    spec = PhaseSpec(constant=constant, linear=linear, quadratic=quadratic)
    batch = data.global_batch
    dpn = dpn if dp % dpn == 0 else dp  # DP ranks that straddle nodes unevenly: one node, as the runtime does
    ratios = []
    for step in range(BATCHES):
        drawn = sample_lengths(data, batch, seed=10_000 + step)
        lengths = np.array(
            [min(d.get(module, 0), data.seq_len) if module == llm else d.get(module, 0) for d in drawn],
            dtype=np.int64,
        )
        # floor or ceil of batch/dp samples per rank, as the runtime deals them (in rank order here)
        origin = np.sort(np.arange(batch, dtype=np.int64) % dp)
        ph = build_phase_arrays(module, spec, lengths, origin, lengths, dp, dpn)
        if ph.n == 0:
            continue
        costs = rank_costs(ph, dispatch_phase(ph, Mode.ORCH))
        mean = float(costs.sum()) / dp
        if mean > 0:
            ratios.append(float(costs.max()) / mean)
    return float(np.mean(ratios)) if ratios else 1.0
