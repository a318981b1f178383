"""A diverged step: which quantity went non-finite, at which step, and which checkpoint a relaunch resumes from."""

import math

from orch.runtime.train.divergence import divergence


def test_finite_steps_do_not_diverge(tmp_path):
    assert divergence(3, 2.5, 1.0, 0.1, 10, tmp_path) is None
    assert divergence(3, 2.5, None, None, 10, tmp_path) is None  # a run with nothing to train has no norm


def test_the_line_names_the_step_the_quantity_and_the_checkpoint_before_it(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("step_00000002", "step_00000004", "step_00000006"):
        (root / name).mkdir(parents=True)
    got = divergence(4, 3.25, math.nan, 1e4, 8, tmp_path)
    assert str(got) == (
        "step 5/8: grad norm is nan (loss 3.25): the run diverged; lower lr (now 10000), or set clip_norm or "
        "warmup_steps in the --config file; a relaunch resumes from step_00000004, saved before it"
    )
    # the loss named first when both are gone (the forward went wrong first); no checkpoint yet
    got = divergence(0, math.inf, math.nan, 0.5, 8, tmp_path / "empty")
    assert str(got).startswith("step 1/8: loss is inf (grad norm nan): the run diverged; lower lr (now 0.5)")
    assert str(got).endswith("a relaunch starts again at step 0")
