"""The start-up calibration: what one sample of each module costs on this machine, timed before step 0.

The post-balancing dispatcher (runtime/train/post_balance.py) balances each phase by a per-sample cost,
`SampleCost` (planner/sample_cost.py: constant + linear·len + quadratic·len² for len > 0). A module whose
plan carries no profiled cost is timed here: FLOPs alone miss what the runtime really pays, a fixed cost per
sample (attention, the projector's padding and the LLM's embedding run once per sample in Python: a dozen
small kernels per layer, forward and backward) and a per-pair rate above the matmul rate (scores are
materialised, scaled, masked and soft-maxed element by element). So every rank times the module's real
forward+backward (`compute.encode` / `compute.text_loss`) on a few packed micro-batches of k samples of n
tokens and fits the model as `orch profile` fits a block (runtime/profile/fit.py, `fit_compute`: least squares
on relative error, non-negative terms), averaged over ranks so the tables stay identical
(`shared_calibration`). Its cost must stay a small fraction of a step at any length: the fixed shapes stop at
256 tokens, then single samples of doubling length climb towards the data's longest while their seconds,
warm-ups included, stay within CALIBRATION_BUDGET of what the fit so far predicts one longest sample costs
(each rung refits: the per-pair rate is measured as far up as the budget reaches, the rest extrapolated). The
whole module runs on one rank here: under TP its per-token and per-pair work split over tp ranks, its
per-sample kernels do not (`post_balance.dispatch_costs` splits them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.distributed as dist

from orch.planner.plan import Plan
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.data.batch import encoder_order

# (samples k, tokens n each) timed by calibrate_module: small and large k at short n separate the
# per-sample cost from the per-token one; n up to 256 at k = 1 brings in the per-pair term.
CALIBRATION_SHAPES = ((1, 2), (16, 2), (1, 64), (4, 64), (1, 256), (8, 16))
CALIBRATION_REPEATS = 3  # the minimum of these (after one warm-up) is kept: this machine is shared
# The longer rungs (one sample each, one warm-up and one timed call) may spend this fraction of one longest
# sample's predicted forward+backward, a lower bound on the step that holds it.
CALIBRATION_BUDGET = 0.1


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously; the CPU needs nothing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_module(
    model: ModelSpec,
    name: str,
    module: torch.nn.Module,
    k: int,
    n: int,
    dtype: torch.dtype,
    device: torch.device = torch.device("cpu"),
) -> float:
    """Seconds of one forward+backward of `module` on k samples of n tokens, as the executor runs it on `device`."""
    from orch.runtime.data.batch import Sample
    from orch.runtime.train.compute import encode, join_prefix, text_loss

    spec = model.modules[name]
    gen = torch.Generator().manual_seed(k * 100_003 + n)  # inputs drawn on the CPU, then moved
    if name == model.llm_name:
        vocab = spec.vocab or 1
        samples = [Sample(i, {}, *torch.randint(0, vocab, (2, n), generator=gen).to(device)) for i in range(k)]
        # text-only samples' prefixes as every executor joins them: the rows the LLM takes from the encoders are
        # prefix_width wide (Qwen3-VL's carry its deepstack features beside its hidden width)
        prefixes = [join_prefix([], model.prefix_width, dtype, device) for _ in range(k)]
        _sync(device)
        t = time.perf_counter()
        text_loss(module, prefixes, samples, k * n).backward()
        _sync(device)
        return time.perf_counter() - t
    frames = model.modality(name).frames_per_token
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    samples = [
        Sample(
            i, {name: torch.randn(n * frames, spec.input_dim or 1, generator=gen, dtype=dtype).to(device)}, empty, empty
        )
        for i in range(k)
    ]
    _sync(device)
    t = time.perf_counter()
    encode(module, name, samples, dtype, model.modality(name).frames_per_token).sum().backward()
    _sync(device)
    return time.perf_counter() - t


def longest_sample(data: DataSpec, model: ModelSpec, module: str) -> int:
    """The longest sample the data gives a module (of 8,192 drawn; the LLM's capped at seq_len)."""
    from orch.planner.data import token_stats

    return token_stats(data, module, model.llm_name).max


def calibration_ladder(max_len: int) -> tuple[int, ...]:
    """The single-sample lengths timed beyond CALIBRATION_SHAPES, while the budget lasts: doubling from the
    fixed shapes' longest up to the data's longest sample `max_len` (the last rung), none when it is no longer."""
    rungs, n = [], max(n for _, n in CALIBRATION_SHAPES)
    while n < max_len:
        n = min(2 * n, max_len)
        rungs.append(n)
    return tuple(rungs)


@dataclass(frozen=True)
class Timing:
    """One shape as calibrated: `n` tokens as the module took them, `seconds` of one call (the best timed),
    `spent` the seconds it took, warm-up included."""

    n: int
    seconds: float
    spent: float


TimeAt = Callable[[int, int, int], Timing]  # (samples k, tokens, timed repeats after one warm-up) -> Timing


@dataclass(frozen=True)
class Calibration:
    """One module's start-up calibration: its fit (None: degenerate), the (k, n, seconds) points it was fitted
    to, and the seconds it took."""

    cost: SampleCost | None
    points: tuple[tuple[int, int, float], ...]
    seconds: float

    @property
    def longest(self) -> int:
        return max(n for _, n, _ in self.points)


def calibrate_points(time_at: TimeAt, max_len: int, budget: float = CALIBRATION_BUDGET) -> Calibration:
    """Time CALIBRATION_SHAPES, then climb `calibration_ladder(max_len)` one sample at a time while the
    rungs' seconds, warm-ups included, stay within `budget` x the fit's prediction of one `max_len` sample
    (refitted after each rung), and fit the cost model to every point. Its seconds are bounded by the fixed
    shapes plus that fraction, whatever the data's lengths."""
    from orch.runtime.profile.fit import fit_compute

    timings = [(k, time_at(k, n, CALIBRATION_REPEATS)) for k, n in CALIBRATION_SHAPES]
    points = [(k, t.n, t.seconds) for k, t in timings]
    spent, climbed = sum(t.spent for _, t in timings), 0.0
    for length in calibration_ladder(max_len):
        cost, _ = fit_compute(points)
        whole = cost.per_call(1, max_len)
        if not whole > 0 or climbed + 2 * cost.per_call(1, length) > budget * whole:
            break  # a degenerate fit cannot say what a rung costs: the fixed shapes' fit is extrapolated
        t = time_at(1, length, 1)
        points.append((1, t.n, t.seconds))
        climbed += t.spent
    cost, _ = fit_compute(points)
    fitted = cost if cost.constant > 0 or cost.linear > 0 or cost.quadratic > 0 else None  # too noisy to time
    return Calibration(fitted, tuple(points), spent + climbed)


@lru_cache(maxsize=16)
def _calibrate(model_json: str, name: str, dtype_name: str, device_name: str = "cpu", max_len: int = 0) -> Calibration:
    model = ModelSpec.model_validate_json(model_json)
    dtype = getattr(torch, dtype_name)
    device = torch.device(device_name)
    module = whole_module(model, name, dtype, device)

    def time_at(k: int, length: int, repeats: int) -> Timing:
        n = model.modules[name].round_length(length)  # as the module takes it (whole merge windows, images)
        t = time.perf_counter()
        _time_module(model, name, module, k, n, dtype, device)  # warm-up: first-touch allocations
        seconds = min(_time_module(model, name, module, k, n, dtype, device) for _ in range(repeats))
        return Timing(n, seconds, time.perf_counter() - t)

    return calibrate_points(time_at, max_len)


def whole_module(model: ModelSpec, name: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """Module `name` whole on this rank, weights drawn from a seed, as the calibration times it: a Hugging Face
    module as its family builds it (its own attention: Qwen2.5-VL's windows, a tower's whole images), orch's
    reference module otherwise."""
    if model.modules[name].hf is not None:
        from orch.runtime.models.hf.parts import build_part

        return build_part(model, name, model.modules[name].layers, dtype, device, 0, None)
    from orch.runtime.models.reference import build_module

    return build_module(name, model).to(device, dtype)


def calibrate_module(
    model: ModelSpec, name: str, dtype: torch.dtype, device: torch.device | str = "cpu", max_len: int = 0
) -> Calibration:
    """Seconds of one module's forward+backward per sample on this machine's `device`, the whole module on
    one rank (module docstring); its cost None where the fit was degenerate. `max_len`: the longest sample the
    data gives the module (the rungs climb towards it within the budget). Cached per process."""
    dtype_name = str(dtype).removeprefix("torch.")
    return _calibrate(model.model_dump_json(), name, dtype_name, str(torch.device(device)), max_len)


def warm_up(model: ModelSpec, names: list[str], dtype: torch.dtype, device: torch.device | str) -> None:
    """One untimed forward+backward of each of `names` at every fixed calibration shape, for the modules the
    plan's profiled costs spare the calibration: every rank's kernels and heap meet a module before step 0,
    as the calibration's do (`shared_calibration`). A quarter of the fixed shapes' work (no repeats, no fit,
    no rungs); no collective."""
    dev = torch.device(device)
    for name in names:
        module = whole_module(model, name, dtype, dev)
        for k, n in CALIBRATION_SHAPES:
            _time_module(model, name, module, k, model.modules[name].round_length(n), dtype, dev)


def modules_to_calibrate(plan: Plan) -> list[str]:
    """The modules the start-up calibration times: those whose plan carries no profiled cost, in phase order."""
    return [m for m in (*encoder_order(plan.model), plan.model.llm_name) if plan.modules[m].sample_cost is None]


_TERMS = ("call", "constant", "linear", "quadratic")


def shared_calibration(
    model: ModelSpec,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    max_lens: dict[str, int] | None = None,
    modules: list[str] | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, SampleCost]:
    """Every rank calibrates `modules` (default: every module) on its `device`, all at once, and the terms
    are averaged over the ranks whose fit was not degenerate (an all_reduce from that device: NCCL takes
    CUDA tensors only), so every rank's dispatcher agrees; a module no rank could fit is left out (the FLOP
    model). Every rank must pass the same `modules`. All ranks, not one: the timings are taken while every
    rank computes, as in a step, and every rank's allocator has met the module's longer shapes before step 0.
    `say`: where one line per module tells what was timed (rank 0's progress lines), and one before them."""
    names = [*encoder_order(model), model.llm_name] if modules is None else modules
    lengths = max_lens or {}
    if say is not None:
        say(f"calibrating the dispatcher's costs: timing {', '.join(names)} (`calibrate: false` skips it)")
    values = torch.zeros(len(names), len(_TERMS) + 1, dtype=torch.float64)  # the terms, then 1 where fitted
    for j, m in enumerate(names):
        timed = calibrate_module(model, m, dtype, device, lengths.get(m, 0))
        if say is not None:
            say(calibration_line(m, timed, lengths.get(m, 0), j, len(names)))
        if timed.cost is not None:
            values[j] = torch.tensor([*(getattr(timed.cost, t) for t in _TERMS), 1.0], dtype=torch.float64)
    values = values.to(device)
    dist.all_reduce(values)
    values = values.cpu()
    out = {}
    for j, m in enumerate(names):
        fitted = float(values[j, -1])
        if fitted > 0:
            out[m] = SampleCost(**{t: float(values[j, i]) / fitted for i, t in enumerate(_TERMS)})
    return out


def calibration_line(name: str, timed: Calibration, max_len: int, index: int, count: int) -> str:
    """What one module's calibration did, for the run's progress lines."""
    reach = f"up to {timed.longest:,} tokens"
    if max_len > timed.longest:
        reach += f" (its data's longest, {max_len:,}, extrapolated)"
    fit = "" if timed.cost is not None else "; too noisy to fit: the FLOP model prices it"
    return f"calibrated {name} ({index + 1}/{count}) in {timed.seconds:.2f} s: {len(timed.points)} shapes {reach}{fit}"


__all__ = [
    "CALIBRATION_BUDGET",
    "CALIBRATION_REPEATS",
    "CALIBRATION_SHAPES",
    "Calibration",
    "Timing",
    "calibrate_module",
    "calibrate_points",
    "calibration_ladder",
    "calibration_line",
    "longest_sample",
    "modules_to_calibrate",
    "shared_calibration",
    "warm_up",
]
