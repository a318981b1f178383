"""A diverged run: a step whose loss or gradient norm is not finite (NaN or infinite) ends the run.

What Megatron-LM (`check_for_nan_in_loss_and_grad`) and torchtitan do in fp32 and bf16: no step skipping
(that is fp16's loss scaling), the run stops. Both values are all-reduced, the same on every rank, so every
rank decides alike without another collective; before a checkpoint is saved, the weights are checked too (one
all-reduce of a flag). The trainer (runtime/train/trainer.py) writes the step's
record first, NaN and all (runtime/workdir/metrics.py), then every rank raises `Diverged` before any checkpoint of
the broken weights is saved: the newest checkpoint is still the last one from before the divergence, which
a relaunch resumes from. The CLI says the same line, not a rank's failure (cli/launch_cmd.py). Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path

from orch.planner.errors import OrchError


class Diverged(OrchError):
    """A step's loss or gradient norm is not finite: the run stopped (the message says the step and why)."""

    failure_kind = "diverged"


def divergence(
    step: int,
    loss: float,
    grad_norm: float | None,
    lr: float | None,
    steps: int,
    workdir: str | Path,
    *,
    weights_finite: bool = True,
    resumed_at: int = 0,
) -> Diverged | None:
    """`Diverged` when step `step` (0-based) of a run of `steps` has a non-finite loss or gradient norm, or left
    non-finite weights (`weights_finite`, checked before a checkpoint is saved: an update of a finite gradient
    can overflow), else None. The loss is named first when both are: it went wrong before the gradient. A launch
    that resumed after `resumed_at` steps and diverged on its first step may have loaded weights an earlier
    divergence already ruined (finite, but huge): the line says how to start over."""
    norm = math.nan if grad_norm is None else grad_norm
    if not math.isfinite(loss):
        what = f"loss is {loss} (grad norm {norm:.4g})"
    elif grad_norm is not None and not math.isfinite(grad_norm):
        what = f"grad norm is {norm} (loss {loss:.4g})"
    elif not weights_finite:
        what = f"its update left weights that are not finite (loss {loss:.4g}, grad norm {norm:.4g})"
    else:
        return None
    rate = f" (now {lr:g})" if lr is not None else ""
    newest = _newest_before(workdir, step + 1)
    resume = f"resumes from {newest}, saved before it" if newest is not None else "starts again at step 0"
    first = (
        f" (the first step after {newest}: if its weights are already broken, --no-resume starts over)"
        if resumed_at > 0 and step == resumed_at and newest is not None
        else ""
    )
    return Diverged(
        f"step {step + 1}/{steps}: {what}: the run diverged; lower lr{rate}, or set clip_norm or warmup_steps in "
        f"the --config file; a relaunch {resume}{first}"
    )


def _newest_before(workdir: str | Path, done: int) -> str | None:
    """The newest checkpoint folder's name of fewer than `done` completed steps (None: there is none)."""
    from orch.runtime.workdir.run_dir import step_folders

    return next((p.name for s, p in step_folders(workdir) if s < done), None)
