"""Context parallelism (CP): every packed sample's sequence split over a module's CP group.

The ranks of one CP group hold the same samples (one DP index, one TP index); the module's
inputs arrive replicated on each of them (runtime/parallel/transport.py broadcasts over the (cp, tp)
replica group). Per micro-batch a `CPShard` says which positions of every sample each CP rank
computes; the rank runs the module on its rows only:

* Sharding is zigzag (load-balanced, as Megatron/TransformerEngine do): a sample of n units
  is cut into 2·cp near-equal chunks and CP rank r takes chunks r and 2cp-1-r, so under a
  causal mask every rank does nearly the same work. A unit is one token for the LLM and the
  projector's `downsample` tokens for an encoder (the projector then merges inside a shard);
  the audio stem takes `Modality.frames_per_token` frames per token, so a rank's frames are its tokens' frame pairs.
  A sample shorter than 2·cp units leaves some ranks with no rows of it (or of a whole
  micro-batch): every collective below is still joined, with zero rows.
* Attention (`CPShard.gather_kv`): queries stay sharded; K and V are all-gathered over the CP
  group (padded to the largest rank's rows; every rank computes every rank's row counts from
  the lengths, no count exchange) and reassembled per sample in position order; the causal
  mask compares true positions (`model.attend(q_pos=...)`). Backward: a rank's K/V rows get
  the sum of every rank's gradient for them (all_reduce of the full gradient, then my rows:
  gloo has no reduce_scatter).
* LLM inputs (`CPShard.llm_input`): a rank takes its positions of each sample's sequence (prefix
  rows and text where the sample's `SequenceLayout` puts them). Its text positions are embedded
  here (embedding gradients are partial) and the loss covers the scored positions it holds only
  (`CPShard.scored`; head and norm gradients are partial). The boundary prefix rows arrive
  replicated; the slicing is an autograd op whose backward sums the prefix gradient over the
  CP group, so every replica holds the full gradient of the boundary activation (the
  transport's contract: the leader sends it back) and the executor needs no extra step.
* Encoder outputs (`CPShard.gather_units`): after the projector the projected rows are
  all-gathered over CP into the full sequence; backward takes my rows of the incoming
  gradient (it is replicated over the replica group: no sum).

Parameter gradients on a CP rank are therefore partial: the executor sums them over the
flattened (dp, cp) group, and the loss over every TP-0 rank (runtime/train/step.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch import nn

    from orch.runtime.parallel.grid import Grid
    from orch.runtime.sample import SequenceLayout


_CPU = torch.device("cpu")


def zigzag_bounds(n: int, cp: int) -> list[int]:
    """Boundaries of 2·cp near-equal chunks of n units (sizes differ by at most one)."""
    return [j * n // (2 * cp) for j in range(2 * cp + 1)]


def zigzag_positions(n: int, cp: int, r: int) -> torch.Tensor:
    """Unit positions CP rank r computes of a sample of n units: chunks r and 2cp-1-r, ascending."""
    b = zigzag_bounds(n, cp)
    last = 2 * cp - 1 - r
    return torch.cat([torch.arange(b[r], b[r + 1]), torch.arange(b[last], b[last + 1])])


def _offsets(lens: list[int]) -> list[int]:
    out, acc = [], 0
    for n in lens:
        out.append(acc)
        acc += n
    return out


@dataclass(frozen=True)
class CPGroup:
    """One rank's CP group of a module: the process group, its size and this rank's index in it.

    `device`: where the shard's row indices live (the rank's device: they index its activations).
    Positions (`CPShard.pos`, `units`) stay on the CPU: they only give counts and comparisons.
    """

    group: Any
    size: int
    rank: int
    device: torch.device = _CPU

    def shard(self, lens: list[int], unit: int = 1) -> CPShard:
        """The shard plan of one micro-batch whose samples have `lens` rows (tokens), in units of `unit` rows."""
        n_units = [-(-n // unit) for n in lens]
        units = [[zigzag_positions(u, self.size, r) for u in n_units] for r in range(self.size)]
        if unit == 1:
            pos = units
        else:
            step = torch.arange(unit)
            pos = [
                [(u.unsqueeze(1) * unit + step).reshape(-1) for u in per] for per in units
            ]  # the last unit of a sample may be partial
            pos = [[p[p < n] for p, n in zip(per, lens, strict=True)] for per in pos]
        return CPShard(self, lens, pos, n_units, units)


def cp_group(grid: Grid, rank: int, device: torch.device | str = "cpu") -> CPGroup | None:
    """This rank's CP group of `grid`, None without CP (or outside the grid)."""
    c = grid.coord(rank)
    if grid.cp == 1 or c is None:
        return None
    return CPGroup(grid.submesh("cp").get_group(), grid.cp, c.cp, torch.device(device))


@dataclass(frozen=True)
class CPShard:
    """Which positions of each sample of one micro-batch every CP rank computes (ascending per sample)."""

    cp: CPGroup
    lens: list[int]  # full rows (tokens) per sample
    pos: list[list[torch.Tensor]]  # [cp rank][sample] token positions
    n_units: list[int]  # units per sample (projected rows of an encoder)
    units: list[list[torch.Tensor]]  # [cp rank][sample] unit positions

    def mine(self, i: int) -> torch.Tensor:
        """This rank's token positions of sample i."""
        return self.pos[self.cp.rank][i]

    @cached_property
    def _mine_on_device(self) -> list[torch.Tensor]:
        return [p.to(self.cp.device) for p in self.pos[self.cp.rank]]

    def mine_on_device(self, i: int) -> torch.Tensor:
        """`mine(i)` on the rank's device, moved once per shard (attention's query positions, every layer)."""
        return self._mine_on_device[i]

    @cached_property
    def local_lens(self) -> list[int]:
        return [p.numel() for p in self.pos[self.cp.rank]]

    def _index(self, r: int, per: int = 1) -> torch.Tensor:
        """Rows of CP rank r's positions in the packed full micro-batch (`per` rows per token)."""
        step = torch.arange(per)
        parts = [
            ((off + p).unsqueeze(1) * per + step).reshape(-1)
            for off, p in zip(_offsets(self.lens), self.pos[r], strict=True)
        ]
        return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).to(self.cp.device)

    @cached_property
    def _token_index(self) -> list[torch.Tensor]:
        return [self._index(r) for r in range(self.cp.size)]

    def _unit_index(self, r: int) -> torch.Tensor:
        parts = [off + u for off, u in zip(_offsets(self.n_units), self.units[r], strict=True)]
        return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).to(self.cp.device)

    def take(self, x: torch.Tensor, per: int = 1) -> torch.Tensor:
        """My rows of a packed, replicated full tensor (`per` rows per token: audio frames)."""
        return x[self._token_index[self.cp.rank] if per == 1 else self._index(self.cp.rank, per)]

    def gather_kv(self, k_THd: torch.Tensor, v_THd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed K and V of the whole micro-batch in position order, from every rank's rows (one all_gather)."""
        heads = k_THd.shape[1]
        kv = torch.cat([k_THd, v_THd], dim=1).flatten(1)
        full = _Gather.apply(kv, self._token_index, self.cp, True).unflatten(-1, (2 * heads, -1))
        return full[:, :heads], full[:, heads:]

    def gather_units(self, x: torch.Tensor) -> torch.Tensor:
        """Projected encoder rows of the whole micro-batch (replicated), from every rank's units."""
        index = [self._unit_index(r) for r in range(self.cp.size)]
        return _Gather.apply(x, index, self.cp, False)

    def llm_input(
        self,
        prefixes: list[torch.Tensor],
        texts: list[torch.Tensor],
        embed: nn.Module,
        layouts: list[SequenceLayout],
    ) -> tuple[torch.Tensor, list[int]]:
        """My rows of each sample's sequence (prefix rows and embedded text where its layout puts them, in
        position order), and my seqlens."""
        plens = [p.shape[0] for p in prefixes]
        src = [layout.sources(self.mine(i)) for i, layout in enumerate(layouts)]
        is_prefix = [s < n for s, n in zip(src, plens, strict=True)]
        prefix_rows = [s[m] for s, m in zip(src, is_prefix, strict=True)]
        if sum(plens) > 0:  # the same on every CP rank: the prefixes are replicated
            index = torch.cat([off + r for off, r in zip(_offsets(plens), prefix_rows, strict=True)]).to(self.cp.device)
            local_prefix = _TakeSummed.apply(torch.cat(prefixes), index, self.cp)
        else:
            local_prefix = prefixes[0].new_zeros(0, prefixes[0].shape[1])
        texts_mine = [
            text[(s[~m] - n).to(text.device)] for text, s, m, n in zip(texts, src, is_prefix, plens, strict=True)
        ]
        embedded = embed(torch.cat(texts_mine))
        parts = []
        for layout, m, pre, emb in zip(
            layouts,
            is_prefix,
            local_prefix.split([r.numel() for r in prefix_rows]),
            embedded.split([t.numel() for t in texts_mine]),
            strict=True,
        ):
            rows = torch.cat([pre, emb])
            if layout.source is not None:  # back into position order
                placed = torch.cat([torch.nonzero(m).flatten(), torch.nonzero(~m).flatten()])
                rows = rows[torch.argsort(placed).to(rows.device)]
            parts.append(rows)
        return torch.cat(parts), self.local_lens

    def scored(self, i: int, layout: SequenceLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows of sample i in this rank's shard, text indices) of the labels this rank scores."""
        m = self.mine(i)
        pos, token = layout.scored
        keep = torch.isin(pos, m)
        return torch.searchsorted(m, pos[keep]), token[keep]

    def score_rows(self, layouts: list[SequenceLayout]) -> torch.Tensor:
        """Rows of this rank's packed shard whose logits are scored, from the layouts alone: a pipeline's last
        stage has no prefixes to look at."""
        rows, off = [], 0
        for i, layout in enumerate(layouts):
            rows.append(self.scored(i, layout)[0] + off)
            off += self.mine(i).numel()
        return (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)).to(self.cp.device)

    def scored_labels(self, labels: list[torch.Tensor], layouts: list[SequenceLayout]) -> list[torch.Tensor]:
        """Each sample's labels of this rank's scored rows, in their order (`score_rows`)."""
        return [
            y[self.scored(i, layout)[1].to(y.device)] for i, (y, layout) in enumerate(zip(labels, layouts, strict=True))
        ]


class _Gather(torch.autograd.Function):
    """Every CP rank's rows into the packed full tensor; backward: my rows of the gradient,
    summed over the CP group first when every rank's use of the full tensor is partial (K/V)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: list[torch.Tensor], cp: CPGroup, reduce: bool) -> torch.Tensor:
        ctx.index, ctx.cp, ctx.reduce = index, cp, reduce
        counts = [i.numel() for i in index]
        rows = sum(counts)
        out = x.new_empty(rows, *x.shape[1:])
        if rows == 0:  # every rank knows every count: all skip together
            return out
        width = max(counts)
        pad = x.new_zeros(width, *x.shape[1:])
        pad[: x.shape[0]] = x
        got = [torch.empty_like(pad) for _ in range(cp.size)]
        dist.all_gather(got, pad, group=cp.group)
        out[torch.cat(index)] = torch.cat([g[:n] for g, n in zip(got, counts, strict=True)])
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        grad = grad.contiguous()
        if ctx.reduce and grad.numel() > 0:
            grad = grad.clone()
            dist.all_reduce(grad, group=ctx.cp.group)
        return grad[ctx.index[ctx.cp.rank]], None, None, None


class _TakeSummed(torch.autograd.Function):
    """My rows of a replicated tensor; backward: the full gradient, summed over the CP group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor, cp: CPGroup) -> torch.Tensor:
        ctx.index, ctx.cp, ctx.shape = index, cp, x.shape
        return x[index]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        full = grad.new_zeros(ctx.shape)
        full[ctx.index] = grad
        dist.all_reduce(full, group=ctx.cp.group)
        return full, None, None


__all__ = ["CPGroup", "CPShard", "cp_group", "zigzag_bounds", "zigzag_positions"]
