"""Residual imbalance after post-balancing: the slowest rank of a phase over the mean rank.

Every module's forward and backward end at a collective (a boundary move, the gradient sync), so
a step waits for the phase's slowest rank, not its mean one. Post-balancing narrows the gap but
cannot close it: samples are indivisible, and a few long ones among dp ranks cannot be split
evenly (with 4 samples per rank the gap is tens of percent). Estimated the way the runtime gets
there: global batches drawn from the DataSpec, balanced by the dispatcher's `orch` mode over the
module's DP ranks, costs from the module's per-sample cost (planner/sample_cost.py).

An encoder whose items the spec knows is priced balanced by item, as the runtime balances it by default
(`encoder_balance: item`): a Hugging Face tower of fixed-size images (`image_tokens`), each drawn sample's
tokens its images, each costing the per-sample polynomial on its own tokens. A native-resolution tower's
images and video frame groups are not in a DataSpec (a drawn length is a sample's patches): priced whole.
"""

from __future__ import annotations

from functools import lru_cache

from orch.planner.data import sample_lengths
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import DataSpec, ModuleSpec

BATCHES = 16  # global batches drawn per estimate (the mean of their max/mean)


def item_tokens(spec: ModuleSpec) -> int | None:
    """Tokens of one item of an encoder balanced by item, where the spec knows them (module docstring)."""
    return spec.image_tokens if spec.hf is not None and spec.image_tokens else None


def residual_imbalance(
    data: DataSpec, module: str, llm: str, dp: int, dp_per_node: int, cost: SampleCost, items: int | None = None
) -> float:
    """Mean over drawn global batches of (slowest DP rank's cost) / (mean DP rank's cost), >= 1, with the
    module's per-sample `cost` (its per-call term plays no part: the same for every placement); `items`: the
    tokens of one of its items (`item_tokens`), balanced by item."""
    if dp <= 1:
        return 1.0
    terms = (cost.constant, cost.linear, cost.quadratic)
    return _imbalance(data.model_dump_json(), module, llm, dp, dp_per_node, terms, items)


@lru_cache(maxsize=256)
def _imbalance(
    data_json: str, module: str, llm: str, dp: int, dpn: int, terms: tuple[float, float, float], items: int | None
) -> float:
    import numpy as np

    from orch.planner.balance.batch import PhaseSpec
    from orch.planner.balance.cost import build_phase_arrays, rank_costs
    from orch.planner.balance.dispatch import balance_arrays, dispatch_phase
    from orch.planner.balance.items import Items, group_phase, item_costs, whole_groups
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
        if items is not None:  # whole images of `items` tokens each (a partial last one counted as one)
            per = [[items] * (int(n) // items) + ([int(n) % items] if n % items else []) for n in lengths]
            its = Items.from_lists(per, per)
            ph = group_phase(module, spec, its, item_costs(its, spec), whole_groups(its), origin, dp, dpn)
            if ph.n == 0:
                continue
            costs = balance_arrays({module: ph}, origin, Mode.ORCH, {module: its})[module].costs
        else:
            ph = build_phase_arrays(module, spec, lengths, origin, lengths, dp, dpn)
            if ph.n == 0:
                continue
            costs = rank_costs(ph, dispatch_phase(ph, Mode.ORCH))
        mean = float(costs.sum()) / dp
        if mean > 0:
            ratios.append(float(costs.max()) / mean)
    return float(np.mean(ratios)) if ratios else 1.0
