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


def test_an_update_that_overflowed_the_weights_is_named_when_loss_and_norm_were_finite(tmp_path):
    assert divergence(2, 3.25, 1.5, 0.1, 8, tmp_path, weights_finite=True) is None
    got = divergence(2, 3.25, 1.5, 0.1, 8, tmp_path, weights_finite=False)
    assert str(got).startswith(
        "step 3/8: its update left weights that are not finite (loss 3.25, grad norm 1.5): the run diverged; lower lr"
    )


def test_weights_finite_sees_one_infinite_entry_of_any_module(tmp_path):
    """What the trainer checks before a checkpoint is saved (a collective; here a one-rank group)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from orch.runtime.train.optim import weights_finite

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        modules = {"vision": nn.Linear(3, 2), "llm": nn.Linear(2, 2)}
        assert weights_finite(modules, "cpu")
        with torch.no_grad():
            modules["llm"].bias[1] = math.inf
        assert not weights_finite(modules, "cpu")
        with torch.no_grad():
            modules["llm"].bias[1] = math.nan
        assert not weights_finite(modules, "cpu")
        assert weights_finite({}, "cpu")  # nothing trainable here: this rank agrees
    finally:
        dist.destroy_process_group()


def test_a_divergence_on_the_first_step_after_a_resume_says_how_to_start_over(tmp_path):
    """AdamW at lr 1e30 leaves finite weights of 1e30 in step_00000001; a relaunch at a sane lr diverges on its first
    step from them: lowering lr again cannot help, the line says so."""
    (tmp_path / "checkpoints" / "step_00000001").mkdir(parents=True)
    got = str(divergence(1, 5.5, math.nan, 1e-4, 6, tmp_path, resumed_at=1))
    assert got.endswith(
        "a relaunch resumes from step_00000001, saved before it (the first step after step_00000001: if its weights "
        "are already broken, --no-resume starts over)"
    )
    assert "--no-resume" not in str(divergence(2, 5.5, math.nan, 1e-4, 6, tmp_path, resumed_at=1))
    assert "--no-resume" not in str(divergence(1, 5.5, math.nan, 1e-4, 6, tmp_path))  # no resume: a later step
