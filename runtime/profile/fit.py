"""Fits and bandwidth arithmetic of `orch profile`: pure functions over measured points (no torch).

Compute: the per-sample cost model (planner/sample_cost.py), t(k, len) = call + k·(constant +
linear·len + quadratic·len²) for one call on a packed micro-batch of k samples of `len` tokens each
(the runtime's blocks run the linear layers once per micro-batch and attention once per sample).
Communication: nccl-tests' algbw = bytes / time and busbw = algbw times
the op's bus factor (nccl-tests doc/PERFORMANCE.md), and an alpha-beta model t = alpha + bytes / bw.
"""

from __future__ import annotations

import numpy as np

from orch.planner.sample_cost import SampleCost

# nccl-tests doc/PERFORMANCE.md: the bytes each rank must move relative to the message size.
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of `op` on `n` ranks."""
    if op not in _BUS_FACTORS:
        raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(_BUS_FACTORS)}")
    if n < 1:
        raise ValueError(f"ranks must be >= 1, got {n}")
    return float(_BUS_FACTORS[op](n))


def bandwidths(op: str, n: int, nbytes: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, as nccl-tests prints them."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * bus_factor(op, n)


def nonnegative_relative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min Σ((a·c − y) / y)² subject to c >= 0, exactly: every subset of columns, the best solution
    with no negative coefficient (a handful of columns: at most 15 small solves)."""
    w = 1.0 / np.maximum(y, 1e-12)
    aw, yw = a * w[:, None], y * w
    scale = np.abs(aw).max(axis=0)
    scale[scale == 0] = 1.0
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(yw**2))
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1]
        sub, *_ = np.linalg.lstsq(aw[:, cols] / scale[cols], yw, rcond=None)
        if np.any(sub < 0):
            continue
        coef = np.zeros(n)
        coef[cols] = sub / scale[cols]
        res = float(np.sum((aw @ coef - yw) ** 2))
        if res < best_res - 1e-15 * max(best_res, 1.0):
            best, best_res = coef, res
    return best


def fit_compute(points: list[tuple[int, int, float]], quadratic: bool = True) -> tuple[SampleCost, float]:
    """The per-sample cost model (planner/sample_cost.py) of t(k, len) = call + k·(constant + linear·len +
    quadratic·len²) over (k, len, seconds) points, and its largest relative error on them.

    The relative error is what is minimised (a micro-batch of a few short samples, where the fixed
    costs matter, weighs as much as a long one), under non-negative coefficients (a negative
    per-token cost is noise, not physics): solved exactly over the subsets of terms, rather than
    clipping an unconstrained solution, which can leave a fit far from every point. With one micro-batch
    size the per-call and per-sample terms cannot be told apart: all of it is per sample (call = 0).
    """
    if not points:
        raise ValueError("no points to fit")
    ks = {k for k, _, _ in points}
    cols = [lambda k, n: 1.0, lambda k, n: float(k), lambda k, n: float(k * n)]
    if quadratic:
        cols.append(lambda k, n: float(k * n * n))
    use_call = len(ks) > 1
    if not use_call:
        cols = cols[1:]
    a = np.array([[c(k, n) for c in cols] for k, n, _ in points], dtype=np.float64)
    y = np.array([t for _, _, t in points], dtype=np.float64)
    if len(points) < a.shape[1]:
        raise ValueError(f"{len(points)} points cannot determine {a.shape[1]} coefficients")
    coef = nonnegative_relative_lstsq(a, y)
    values = list(coef) if use_call else [0.0, *coef]
    while len(values) < 4:
        values.append(0.0)
    call, constant, linear, quad = (float(v) for v in values)
    cost = SampleCost(call=call, constant=constant, linear=linear, quadratic=quad)
    pred = np.array([cost.per_call(k, n) for k, n, _ in points])
    err = float(np.max(np.abs(pred - y) / np.maximum(y, 1e-12)))
    return cost, err


def fit_alpha_beta(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(alpha seconds, GB/s) of t = alpha + bytes / (gbps·1e9) over (bytes, seconds) points."""
    if len(points) < 2:
        raise ValueError("an alpha-beta fit needs at least two message sizes")
    x = np.array([b for b, _ in points], dtype=np.float64)
    y = np.array([t for _, t in points], dtype=np.float64)
    a = np.stack([np.ones_like(x), x / x.max()], axis=1)
    (alpha, slope), *_ = np.linalg.lstsq(a, y, rcond=None)
    slope = slope / x.max()
    alpha = max(float(alpha), 0.0)
    gbps = 1.0 / (float(slope) * 1e9) if slope > 0 else 1e6  # no measurable per-byte cost: effectively free
    return alpha, gbps


def median(values: list[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64))) if values else 0.0


__all__ = [
    "bandwidths",
    "bus_factor",
    "fit_alpha_beta",
    "fit_compute",
    "median",
    "nonnegative_relative_lstsq",
]
