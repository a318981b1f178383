"""`orch analyze`: how much time imbalance wastes on a dataset, without balancing and with each mode.

Draws K global batches of dp × micro_batch samples from a manifest of per-sample lengths (rows
land on ranks at random, as DP sampling does), balances each with every mode and averages per
phase the max and mean rank cost. Wasted = 1 - mean / max: the fraction of a phase's step the
average rank spends waiting for the slowest. Speed-up = Σ phases max cost without balancing /
Σ phases max cost with the mode (phases run one after another, so their times add). An encoder whose
samples' items the manifest lists (`items`, planner/data.py `read_manifest_items`: a native-resolution
tower's images and runs of its videos' frame groups) is balanced by item, as the runtime balances it.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from orch.planner.balance.batch import LLM_PHASE, PhaseSpec
from orch.planner.balance.cost import PhaseArrays, build_phase_arrays
from orch.planner.balance.dispatch import balance_arrays
from orch.planner.balance.items import Items, group_phase, item_costs, whole_groups
from orch.planner.balance.mode import Mode
from orch.planner.errors import SpecError

# Default cost per phase when the data carries none: cost = len + quadratic·len², with the
# quadratic term equal to the linear one at 4,096 vision tokens and 8,192 audio/LLM tokens
# (attention catches up with the MLP at about that length for ~1-8B-wide modules).
DEFAULT_PHASES: dict[str, PhaseSpec] = {
    "vision": PhaseSpec(linear=1.0, quadratic=1 / 4096),
    "audio": PhaseSpec(linear=1.0, quadratic=1 / 8192),
    LLM_PHASE: PhaseSpec(linear=1.0, quadratic=1 / 8192),
}
BYTES_PER_TOKEN = 2048  # one bf16 hidden state of width 1,024 per token; only ratios are reported
HISTOGRAM_BINS = 12


class ModeStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_cost: float = Field(description="mean over steps of the largest rank cost")
    mean_cost: float = Field(description="mean over steps of the mean rank cost")
    wasted: float = Field(description="1 - mean/max: fraction of the phase the average rank waits")
    inter_node_fraction: float = Field(description="bytes that cross nodes / all bytes of the phase")
    seconds: float = Field(description="mean dispatcher time per step for this phase")


class Histogram(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edges: list[float]
    counts: dict[str, list[int]] = Field(description="ranks per cost bin, per mode, for the first step")


class AnalyzeResult(BaseModel):
    # `orch analyze --json` keeps the name users know (the --ranks-per-node flag's), `ranks_per_node`
    model_config = ConfigDict(extra="forbid", validate_by_name=True, serialize_by_alias=True)

    dp: int
    dp_per_node: int = Field(alias="ranks_per_node", description="DP ranks per node (--ranks-per-node)")
    micro_batch: int
    steps: int
    phases: dict[str, dict[str, ModeStats]]
    speedup: dict[str, float] = Field(description="per mode: Σ max cost without balancing / Σ max cost with it")
    histograms: dict[str, Histogram]


def _draw(
    rows: tuple[tuple[tuple[str, int], ...], ...],
    names: list[str],
    phases: dict[str, PhaseSpec],
    dp: int,
    dpn: int,
    micro_batch: int,
    rng: np.random.Generator,
    items: tuple[dict[str, tuple[int, ...]], ...] | None = None,
) -> tuple[dict[str, PhaseArrays], np.ndarray, dict[str, Items]]:
    n = dp * micro_batch
    picks = rng.integers(0, len(rows), size=n)
    table = np.zeros((len(rows), len(names)), dtype=np.int64)
    col = {name: k for k, name in enumerate(names)}
    for r, row in enumerate(rows):
        for key, value in row:
            table[r, col[key]] = value
    lengths = table[picks]
    origin = rng.permutation(np.repeat(np.arange(dp), micro_batch))
    out, by_item = {}, {}
    for k, name in enumerate(names):
        ln = lengths[:, k]
        if items is not None and any(name in items[int(r)] for r in picks):  # its samples' items, by item
            per = [list(items[int(r)].get(name, (int(n),) if n else ())) for r, n in zip(picks, ln, strict=True)]
            its = Items.from_lists(per, [[v * BYTES_PER_TOKEN for v in x] for x in per])
            costs = item_costs(its, phases[name])
            out[name] = group_phase(name, phases[name], its, costs, whole_groups(its), origin, dp, dpn)
            by_item[name] = its
            continue
        out[name] = build_phase_arrays(name, phases[name], ln, origin, ln * BYTES_PER_TOKEN, dp, dpn)
    return out, origin, by_item


def analyze(
    rows: tuple[tuple[tuple[str, int], ...], ...],
    dp: int,
    dp_per_node: int,
    micro_batch: int,
    steps: int = 8,
    seed: int = 0,
    modes: tuple[Mode, ...] = (Mode.NONE, Mode.LPT, Mode.PAPER, Mode.ORCH),
    source: str = "manifest",
    items: tuple[dict[str, tuple[int, ...]], ...] | None = None,
) -> AnalyzeResult:
    for flag, value in (("--dp", dp), ("--ranks-per-node", dp_per_node), ("--micro-batch", micro_batch)):
        if value <= 0:
            raise SpecError(flag, "", f"expected a positive count, got {value}")
    if steps <= 0:
        raise SpecError("--steps", "", f"expected a positive count, got {steps}")
    if dp % dp_per_node:
        raise SpecError("--dp", "", f"expected a multiple of --ranks-per-node ({dp_per_node}), got {dp}")
    names = sorted({key for row in rows for key, _ in row})
    if not names:
        raise SpecError(source, "", "no phase lengths in the manifest")
    phases = {name: DEFAULT_PHASES.get(name, PhaseSpec()) for name in names}
    rng = np.random.default_rng(seed)
    acc: dict[str, dict[str, list[float]]] = {name: {m.value: [0.0] * 5 for m in modes} for name in names}
    first: dict[str, dict[str, np.ndarray]] = {name: {} for name in names}
    for step in range(steps):
        arrays, origin, by_item = _draw(rows, names, phases, dp, dp_per_node, micro_batch, rng, items)
        for mode in modes:
            outcomes = balance_arrays(arrays, origin, mode, by_item)
            for name, o in outcomes.items():
                ph = arrays[name]
                inter = o.inter_node_bytes
                total = float(ph.bytes.sum()) or 1.0
                a = acc[name][mode.value]
                a[0] += float(o.costs.max(initial=0.0))
                a[1] += float(o.costs.mean())
                a[2] += inter / total
                a[3] += o.seconds
                if step == 0 and mode in (Mode.NONE, Mode.ORCH):  # the histogram: before and after
                    first[name][mode.value] = o.costs
    histograms: dict[str, Histogram] = {}
    for name, per_mode in first.items():
        top = max((float(c.max(initial=0.0)) for c in per_mode.values()), default=0.0) or 1.0
        edges = np.linspace(0.0, top, HISTOGRAM_BINS + 1)
        histograms[name] = Histogram(
            edges=[float(e) for e in edges],
            counts={m: np.histogram(c, bins=edges)[0].astype(int).tolist() for m, c in per_mode.items()},
        )
    stats: dict[str, dict[str, ModeStats]] = {}
    for name in names:
        stats[name] = {}
        for mode in modes:
            a = acc[name][mode.value]
            mx, mean = a[0] / steps, a[1] / steps
            stats[name][mode.value] = ModeStats(
                max_cost=mx,
                mean_cost=mean,
                wasted=1 - mean / mx if mx > 0 else 0.0,
                inter_node_fraction=a[2] / steps,
                seconds=a[3] / steps,
            )
    base = sum(stats[name][Mode.NONE.value].max_cost for name in names) if Mode.NONE in modes else 0.0
    speedup = {}
    for mode in modes:
        total = sum(stats[name][mode.value].max_cost for name in names)
        speedup[mode.value] = base / total if total > 0 and base > 0 else 1.0
    return AnalyzeResult(
        dp=dp,
        dp_per_node=dp_per_node,
        micro_batch=micro_batch,
        steps=steps,
        phases=stats,
        speedup=speedup,
        histograms=histograms,
    )
