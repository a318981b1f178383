"""The one per-sample cost model: what one sample costs a module, and what one packed call costs.

    cost(len)        = constant + linear·len + quadratic·len²   for len > 0; 0 for len == 0
    call(k, len)     = call + k·cost(len)                      one call on a packed micro-batch of k samples

`linear` is the work every token meets (MLP, projections), `quadratic` the work of every pair of tokens
(attention's scores), `constant` the fixed work per sample (attention and the projector run once per
sample: a dozen small kernels per layer), `call` the fixed work per packed call (launch and Python
overhead), which no placement of samples changes, so the dispatcher does not read it.

Every producer and reader of this polynomial uses this class (issue 28):

* `orch profile` fits it per block and TP degree (runtime/profile/fit.py, `fit_compute`), in seconds;
  the profile file stores it as `ComputeFit` (planner/profile.py);
* `orch plan --profile` prices a module with it and records, per module, the cost of one sample on the
  plan's layout (`ModulePlan.sample_cost`, planner/costs.py `profiled_sample_cost`);
* the runtime's start-up calibration fits it to the module's real forward+backward
  (runtime/train/calibration.py) when the plan carries none;
* the dispatcher's phases (`PhaseSpec`, planner/balance/batch.py) are one, with a padding flag and a cap.

Units are whatever the producer measured in (seconds, or FLOPs of the planner's model): the dispatcher
reads ratios within one phase only. Pure: no torch, no numpy import (an array of lengths works as is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Lengths = TypeVar("Lengths", float, npt.NDArray[np.float64])
else:
    Lengths = TypeVar("Lengths")


class SampleCost(BaseModel):
    """cost(len) = constant + linear·len + quadratic·len² per sample present (len > 0), and `call` per packed call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call: float = Field(default=0.0, ge=0, description="cost per packed call on a micro-batch (launch overhead)")
    constant: float = Field(
        default=0.0, ge=0, description="cost per sample present (fixed per-sample work: kernel launches)"
    )
    linear: float = Field(default=0.0, ge=0, description="cost per token (MLP, projections)")
    quadratic: float = Field(default=0.0, ge=0, description="cost per token² (attention)")

    def per_sample(self, length: Lengths) -> Lengths:
        """cost(len) of one sample, or of every entry of an array of lengths (float64); 0 where len == 0."""
        cost = self.linear * length + self.quadratic * length * length
        if self.constant:  # a sample of length 0 takes no part in the phase: not even the constant
            cost = cost + self.constant * (length > 0)
        return cost

    def per_call(self, k: float, length: float) -> float:
        """One call on a packed micro-batch of `k` samples of `length` tokens each (what `orch profile` times)."""
        return self.call + k * self.per_sample(float(length))

    def total(self, samples: float, tokens: float, tokens_sq: float, calls: float = 0.0) -> float:
        """Many samples at once, from their moments: `samples` present, Σlen = `tokens`, Σlen² = `tokens_sq`,
        in `calls` packed calls."""
        return self.call * calls + self.constant * samples + self.linear * tokens + self.quadratic * tokens_sq

    def scaled(self, factor: float, tokens: float = 1.0) -> SampleCost:
        """Every term times `factor`, and the per-token terms also times `tokens` (1 / cp: a CP rank holds
        1/cp of every sample's tokens and does 1/cp of its pairs, but the per-sample and per-call work whole)."""
        return SampleCost(
            call=self.call * factor,
            constant=self.constant * factor,
            linear=self.linear * factor * tokens,
            quadratic=self.quadratic * factor * tokens,
        )

    def plus(self, other: SampleCost) -> SampleCost:
        """The cost of running both (a module's blocks and its other parts)."""
        return SampleCost(
            call=self.call + other.call,
            constant=self.constant + other.constant,
            linear=self.linear + other.linear,
            quadratic=self.quadratic + other.quadratic,
        )

    def terms(self) -> SampleCost:
        """Only the four terms, whatever subclass this is (a ComputeFit, a PhaseSpec)."""
        return SampleCost(call=self.call, constant=self.constant, linear=self.linear, quadratic=self.quadratic)


__all__ = ["SampleCost"]
