"""Context parallelism (runtime/parallel/context.py): the zigzag shard plan, and CP modules on gloo.

Pure: every position of every sample lands on exactly one CP rank, in position order, whole
projector units on one rank, and the causal work is balanced. Gloo (one launch of 4 ranks,
CP2 x TP2): the LLM and the encoders on micro-batches of short samples, including ones where a
CP rank holds no token of a sample or of the whole micro-batch, match the unsharded modules in
float64 (loss, outputs, parameter gradients, boundary-prefix gradients).
"""

from pathlib import Path

import pytest
import torch

from orch.runtime.parallel.context import CPGroup, zigzag_bounds, zigzag_positions


def _causal_work(positions: torch.Tensor) -> int:
    return int((positions + 1).sum())  # query at position p attends to p + 1 keys


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_zigzag_covers_every_position_exactly_once(cp):
    for n in range(0, 50):
        parts = [zigzag_positions(n, cp, r) for r in range(cp)]
        for p in parts:
            assert torch.equal(p, p.sort().values)  # ascending: rows keep position order
        assert sorted(torch.cat(parts).tolist()) == list(range(n))
        sizes = [b - a for a, b in zip(zigzag_bounds(n, cp), zigzag_bounds(n, cp)[1:], strict=False)]
        assert max(sizes) - min(sizes) <= 1


def test_zigzag_balances_causal_work():
    for cp in (2, 4):
        n = 64 * cp
        work = [_causal_work(zigzag_positions(n, cp, r)) for r in range(cp)]
        assert len(set(work)) == 1  # exactly even when 2·cp divides n
        contiguous = [_causal_work(torch.arange(r * n // cp, (r + 1) * n // cp)) for r in range(cp)]
        assert max(contiguous) / min(contiguous) > 2  # what zigzag avoids
        for n in range(8 * cp, 200):  # otherwise within one chunk's worth
            work = [_causal_work(zigzag_positions(n, cp, r)) for r in range(cp)]
            assert max(work) - min(work) <= 2 * n


def test_short_samples_leave_ranks_empty():
    assert zigzag_positions(1, 2, 0).tolist() == [0] and zigzag_positions(1, 2, 1).tolist() == []
    shard = CPGroup(None, 2, 1).shard([1, 1])
    assert shard.local_lens == [0, 0]
    assert shard.take(torch.arange(2.0).unsqueeze(1)).shape == (0, 1)


def test_encoder_units_stay_whole_and_frames_follow_tokens():
    lens = [5, 0, 3, 8, 1]
    shards = [CPGroup(None, 2, r).shard(lens, unit=2) for r in range(2)]
    for i, n in enumerate(lens):
        got = sorted(t for s in shards for t in s.mine(i).tolist())
        assert got == list(range(n))
        for s in shards:
            mine = s.mine(i)
            assert sorted({t // 2 for t in mine.tolist()}) == s.units[s.cp.rank][i].tolist()
            # whole units, only the sample's last unit may be partial, and then it is the shard's last row
            for u in s.units[s.cp.rank][i].tolist():
                assert [t for t in mine.tolist() if t // 2 == u] == list(range(2 * u, min(2 * u + 2, n)))
    frames = torch.arange(2 * sum(lens)).unsqueeze(1)  # 2 frames per token, packed
    taken = [s.take(frames, per=2).reshape(-1).tolist() for s in shards]
    offsets = [sum(lens[:i]) for i in range(len(lens))]
    for s, got in zip(shards, taken, strict=True):
        want = [2 * (off + t) + f for i, off in enumerate(offsets) for t in s.mine(i).tolist() for f in (0, 1)]
        assert got == want


# -- gloo: CP2 x TP2 modules against the unsharded ones ---------------------------------------------

LLM_BATCHES = [  # (prefix rows, text tokens) per sample
    [(0, 1), (3, 1), (1, 2), (2, 5), (6, 9)],
    [(0, 1), (0, 1)],  # 1 token each: CP rank 1 holds nothing of the micro-batch
    [(0, 2), (2, 1)],  # 2 and 3 tokens: the ranks share and some chunks are empty
]
ENC_BATCHES = {  # encoder tokens per sample
    "audio": [[1, 0, 3, 5, 8], [1], [2, 3]],  # downsample 2, two frames per token
    "vision": [[2, 0, 7], [1, 1], [4]],
}


def _check_cp_modules(out: str, ctx) -> None:
    import torch.distributed as dist

    from orch.runtime.data.batch import Sample
    from orch.runtime.models.reference import build_model
    from orch.runtime.models.registry import load_model
    from orch.runtime.parallel.context import cp_group
    from orch.runtime.parallel.grid import Grid, build_meshes
    from orch.runtime.parallel.tensor import apply_tp
    from orch.runtime.train.compute import encode, text_loss

    rank = ctx.env.rank
    model = load_model("tiny")
    grid = Grid("m", tp=2, cp=2, dp=1, pp=1, ranks=(0, 1, 2, 3))
    build_meshes({"m": grid})
    cp = cp_group(grid, rank)
    assert cp is not None
    cp_all = grid.flat_group("dp", "cp")
    dt = torch.float64
    errors: dict[str, float] = {}

    def grads(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        res = {}
        for n, p in m.named_parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            g = g.full_tensor() if hasattr(g, "full_tensor") else g
            g = g.detach().clone()
            dist.all_reduce(g, group=cp_all)  # CP ranks hold partial gradients
            res[n] = g
        return res

    def record(key: str, got: torch.Tensor, want: torch.Tensor, scale: float | None = None) -> None:
        if scale is None:
            scale = max(want.abs().max().item(), 1e-300) if want.numel() else 1.0
        err = (got - want).abs().max().item() / scale if want.numel() else 0.0
        errors[key] = max(errors.get(key, 0.0), err)

    for name in ["llm", "audio", "vision"]:
        ref = build_model(model, 3, dt, [name])[name]
        mod = build_model(model, 3, dt, [name])[name]
        apply_tp(mod, tp_mesh=grid.submesh("tp"))
        batches = LLM_BATCHES if name == "llm" else ENC_BATCHES[name]
        for b, batch in enumerate(batches):
            gen = torch.Generator().manual_seed(100 + b)  # the same inputs on every rank (replicated)
            ref.zero_grad(set_to_none=True)
            mod.zero_grad(set_to_none=True)
            if name == "llm":
                hidden, vocab = model.llm.hidden, model.llm.vocab
                prefixes = [torch.randn(p, hidden, generator=gen, dtype=dt) for p, _ in batch]
                samples = [
                    Sample(
                        i,
                        {},
                        torch.randint(0, vocab, (t,), generator=gen),
                        torch.randint(0, vocab, (t,), generator=gen),
                    )
                    for i, (_, t) in enumerate(batch)
                ]
                label_tokens = 50
                leaves = [p.clone().requires_grad_() for p in prefixes]
                want = text_loss(ref, leaves, samples, label_tokens)
                want.backward()
                mine = [p.clone().requires_grad_() for p in prefixes]
                got = text_loss(mod, mine, samples, label_tokens, cp)
                got.backward()
                total = got.detach().clone()
                dist.all_reduce(total, group=cp.group)
                record(f"llm.loss.{b}", total, want.detach())
                for i, (g, w) in enumerate(zip(mine, leaves, strict=True)):
                    gg = g.grad if g.grad is not None else torch.zeros_like(g)
                    wg = w.grad if w.grad is not None else torch.zeros_like(w)
                    record(f"llm.prefix_grad.{b}.{i}", gg, wg)  # full, on every replica
            else:
                fpt = 2 if name == "audio" else 1
                dim = model.modules[name].input_dim
                samples = [
                    Sample(i, {name: torch.randn(n * fpt, dim, generator=gen, dtype=dt)}, None, None)
                    for i, n in enumerate(batch)
                ]
                fpt = model.modality(name).frames_per_token
                want = encode(ref, name, samples, dt, fpt)
                got = encode(mod, name, samples, dt, fpt, cp)
                record(f"{name}.out.{b}", got.detach(), want.detach())
                upstream = torch.randn(want.shape, generator=gen, dtype=dt)
                want.backward(upstream)
                got.backward(upstream)
            # a gradient relative to the module's largest: where a sample has one token, attention's q and k
            # gradients are zero but for rounding, and the fused kernels round differently per mask
            want_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
            module_scale = max((w.abs().max().item() for w in want_grads.values() if w.numel()), default=1.0)
            for n, g in grads(mod).items():
                w = want_grads.get(n)
                record(f"{name}.grad.{b}.{n}", g, w if w is not None else torch.zeros_like(g), module_scale)
    torch.save(errors, Path(out) / f"errors.rank{rank}.pt")


@pytest.mark.slow
def test_cp_modules_match_unsharded_on_gloo(tmp_path):
    from functools import partial

    from orch.runtime.launch.base import FunctionTask
    from orch.runtime.launch.local import LocalLauncher

    LocalLauncher(start_method="forkserver").submit(
        FunctionTask(partial(_check_cp_modules, str(tmp_path)), 4, str(tmp_path))
    ).wait()
    for rank in range(4):
        errors = torch.load(tmp_path / f"errors.rank{rank}.pt")
        assert any(k.startswith("llm.prefix_grad") for k in errors) and any(k.startswith("audio.out") for k in errors)
        bad = {k: v for k, v in errors.items() if v > 1e-12}
        assert not bad, f"rank {rank}: {bad}"
