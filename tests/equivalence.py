"""Comparing a parallel run's tensors with the single-process reference (float64 equivalence)."""

from pathlib import Path

import torch


def merged(workdir: Path, what: str) -> dict[str, torch.Tensor]:
    """The full tensors every rank wrote as `{what}.rank*.pt`, merged by name."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(workdir.glob(f"{what}.rank*.pt")):
        out.update(torch.load(f))
    return out


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rel: float) -> None:
    """Same names, and every tensor within `rel` of the reference's largest magnitude."""
    assert set(got) == set(want)
    for name, ref in want.items():
        scale = max(ref.abs().max().item(), 1e-300)
        err = (got[name] - ref).abs().max().item()
        assert err <= rel * scale, f"{name}: max error {err:.3e} vs scale {scale:.3e}"


def run_plans(plans: dict, data, cfg, out: Path) -> dict[str, tuple[list[float], dict, dict]]:
    """Every plan (all of one world size) through the trainer in ONE launch; name -> (losses, merged grads,
    merged params). `data` and `cfg`: one for all, or a dict by name (launching.train_tasks)."""
    from launching import train_tasks

    records = train_tasks(plans, data, cfg, out)
    return {
        name: ([r.loss for r in records[name]], merged(out / name, "grads"), merged(out / name, "params"))
        for name in plans
    }


def orch_keys(model) -> dict[str, str]:
    """orch's parameter names (`module.local`) -> the transformers model's, for every HF module of `model`."""
    from orch.runtime.models.hf.build import build_hf_modules

    return {f"{n}.{local}": key for n, m in build_hf_modules(model).items() for local, key in m.hf_keys.items()}


def gradient_errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, tuple[float, float]]:
    """HF name -> (max error of `got`'s gradient, the scale it is measured against): the reference tensor's
    largest entry. A key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by all
    keys): its reference is rounding noise, so the scale is at least a millionth of the largest gradient. A fused
    qkv's gradient held by q, k and v group ([3, width, in]) is compared as HF's rows ([3 x width, in])."""
    floor = 1e-6 * max(g.abs().max().item() for g in want.values())
    return {
        k: ((got[k].reshape(ref.shape) - ref).abs().max().item(), max(ref.abs().max().item(), floor))
        for k, ref in want.items()
    }


def renamed_gradients(out: Path, name: str, keys: dict[str, str]) -> dict[str, torch.Tensor]:
    """Plan `name`'s merged gradients under the HF reference's names (`keys`: orch name -> HF's; others as they are)."""
    return {keys.get(k, k): v for k, v in merged(out / name, "grads").items()}


def assert_matches_hf(records: dict, name: str, out: Path, keys: dict[str, str], want_loss: float, want: dict) -> dict:
    """Plan `name`'s step-0 loss (1e-9 relative) and every gradient, renamed by `keys` (orch name -> the HF
    reference's; others as they are), against the HF reference's (1e-9 of `gradient_errors`' scale). Returns
    the renamed gradients."""
    import pytest

    assert records[name][0].loss == pytest.approx(want_loss, rel=1e-9), name
    got = renamed_gradients(out, name, keys)
    assert set(got) == set(want), (name, sorted(set(got) ^ set(want)))
    got = {k: v.reshape(want[k].shape) for k, v in got.items()}  # a fused qkv held by q, k and v group: HF's rows
    for k, (err, scale) in gradient_errors(got, want).items():
        assert err <= 1e-9 * scale, f"{name}: {k}: max error {err:.3e}"
    return got


def assert_same_gradients(mine, theirs_model) -> None:
    """Every parameter of `mine` (modules sharing names with the HF model `theirs_model`) has HF's gradient
    (1e-9 relative, 1e-12 absolute), a parameter without one having none (or zeros) there too."""
    theirs = dict(theirs_model.named_parameters())
    checked = 0
    for key, p in mine.named_parameters():
        if p.grad is None:
            assert theirs[key].grad is None or not theirs[key].grad.any(), key
            continue
        grad = p.grad.reshape(theirs[key].grad.shape)  # a fused qkv held by q, k and v group: HF's rows
        torch.testing.assert_close(grad, theirs[key].grad, rtol=1e-9, atol=1e-12, msg=key)
        checked += 1
    assert checked == sum(1 for _ in mine.parameters())  # every parameter has a gradient (lm_head untied)
