"""How a mix file's sources are drawn: each step's rows as a function of (seed, step) alone. Torch-free.

A mix file (YAML) lists sources with weights, and how to mix them:

    strategy: interleave_over   # concat | interleave_under | interleave_over (LLaMA-Factory's mix_strategy)
    replacement: false          # true: every draw independent (a row may come back before its source is done)
    sources:
      - {path: captions.jsonl, weight: 3}
      - {path: asr.parquet, weight: 1}

Every row of every source is indexed once; the strategy decides how often each is drawn:

* `concat` (LLaMA-Factory's default): the sources' rows as one pool; each epoch visits every row once, in a
  permutation seeded by (seed, epoch), as a single data file is read; weights are not used (a source's share
  is its rows over all rows). With replacement: each draw any row of the pool, uniformly.
* `interleave_under` / `interleave_over` (orch's default): a draw takes a source with probability weight / sum
  of weights (sources whose every row was rejected take no share, and the index says so), then that source's
  next row: each source is read through its own permutations (seeded by (seed, source, pass)), every row once
  before any comes back. The two differ in what a mix epoch is, as LLaMA-Factory's `first_exhausted` and
  `all_exhausted` do: until the first source has given all its rows (the larger ones undersampled), or until
  every source has (the smaller ones repeated). An orch run is a number of steps, not epochs, so the two draw
  alike: the mix epoch is what `orch data index` reports (in draws and steps), to choose --steps by. Unlike
  datasets' `interleave_datasets`, which cuts the larger sources to their first rows, a source carries on
  through its permutation into the next mix epoch, so every row is reached.

Without replacement the sources are drawn in chunks of `CHUNK` draws: each chunk holds every source exactly
floor(CHUNK * p) or one more times (the one more with probability equal to the fraction, so the expected count is
exact), in an order shuffled per (seed, chunk). With replacement each draw picks its source and its row
independently, seeded by (seed, draw). Either way step k takes draws k*B .. k*B + B - 1 and nothing depends on the
steps drawn before it in this process, so a run resumed at step k draws exactly what the uninterrupted run drew.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.planner.io import read_spec_text

STRATEGIES = ("concat", "interleave_under", "interleave_over")
DEFAULT_STRATEGY = "interleave_over"
CHUNK = 4096  # draws per chunk of exact source quotas (without replacement)


def seeded(*parts: object) -> random.Random:
    """A generator seeded by `parts` (the same on every rank and in every process)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The order epoch `epoch` visits n rows in: a permutation seeded by (seed, epoch)."""
    order = list(range(n))
    seeded("epoch", seed, epoch).shuffle(order)
    return order


def step_rows(
    n: int, batch: int, seed: int, step: int, cache: dict[tuple[int, int], list[int]] | None = None
) -> list[int]:
    """The rows of step `step` over one pool of n rows: positions step·batch .. + batch - 1 of the epochs'
    orders laid end to end (a single data file, and a `concat` mix)."""
    cache = {} if cache is None else cache
    out = []
    for pos in range(step * batch, (step + 1) * batch):
        epoch, at = divmod(pos, n)
        if (seed, epoch) not in cache:
            cache.clear()  # one epoch at a time (two at an epoch's end)
            cache[(seed, epoch)] = epoch_order(n, seed, epoch)
        out.append(cache[(seed, epoch)][at])
    return out


@dataclass(frozen=True)
class MixSpec:
    """A mix file's strategy, replacement and per-source weights (the sources themselves: `read_sources`)."""

    strategy: str = DEFAULT_STRATEGY
    replacement: bool = False


def read_mix_spec(ref: str) -> MixSpec:
    """The strategy and replacement of a mix file (defaults for a data file; `concat` for a directory's files or a
    dataset description's names, as LLaMA-Factory's mix_strategy and a folder of files mean them)."""
    from orch.runtime.data.dataset_info import is_dataset_info, split_ref

    p = Path(ref)
    if p.is_dir() or split_ref(ref) is not None or is_dataset_info(ref):
        return MixSpec("concat")
    if p.suffix not in (".yaml", ".yml"):
        return MixSpec()
    import yaml

    doc = yaml.safe_load(read_spec_text(p))
    if not isinstance(doc, dict):
        return MixSpec()
    strategy = doc.get("strategy", doc.get("mix_strategy", DEFAULT_STRATEGY))
    if strategy not in STRATEGIES:
        raise SpecError(ref, "strategy", f"expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    replacement = doc.get("replacement", False)
    if not isinstance(replacement, bool):
        raise SpecError(ref, "replacement", f"expected true or false, got {replacement!r}")
    return MixSpec(strategy, replacement)


@dataclass
class Mix:
    """The draws of a run over indexed sources of `sizes` rows (module docstring). `rows(seed, step, batch)`
    gives step `step`'s rows as indices into the sources' rows laid end to end (the index's order)."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    strategy: str = DEFAULT_STRATEGY
    replacement: bool = False
    _offsets: list[int] = field(init=False, repr=False)
    _cum: list[float] = field(init=False, repr=False)
    _orders: dict[Any, list[int]] = field(default_factory=dict, init=False, repr=False)
    _before: dict[int, list[list[int]]] = field(default_factory=dict, init=False, repr=False)  # seed -> per chunk
    _chunk: dict[tuple[int, int], tuple[list[int], list[int]]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if sum(self.sizes) == 0:
            raise ValueError("a mix of no rows")
        self._offsets = [0, *itertools.accumulate(self.sizes)]
        self._cum = list(itertools.accumulate(self.shares()))

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def shares(self) -> list[float]:
        """Each source's probability of a draw: rows over all rows (`concat`), else weight over the weights of
        the sources that have rows."""
        if self.strategy == "concat" or len(self.sizes) == 1:
            return [n / self.total for n in self.sizes]
        live = sum(w for w, n in zip(self.weights, self.sizes, strict=True) if n)
        return [w / live if n else 0.0 for w, n in zip(self.weights, self.sizes, strict=True)]

    def epoch_draws(self) -> int:
        """Draws in one mix epoch: all rows (`concat`); until the first source has given all its rows
        (`interleave_under`) or every source has (`interleave_over`)."""
        if self.strategy == "concat" or len(self.sizes) == 1:
            return self.total
        per = [n / p for n, p in zip(self.sizes, self.shares(), strict=True) if n]
        return max(1, math.floor(min(per)) if self.strategy == "interleave_under" else math.ceil(max(per)))

    def rows(self, seed: int, step: int, batch: int) -> list[int]:
        if (self.strategy == "concat" or len(self.sizes) == 1) and not self.replacement:
            return step_rows(self.total, batch, seed, step, self._orders)
        return [self._row(seed, pos) for pos in range(step * batch, (step + 1) * batch)]

    def _row(self, seed: int, pos: int) -> int:
        if self.replacement:
            rng = seeded("draw", seed, pos)
            source = min(bisect.bisect_right(self._cum, rng.random() * self._cum[-1]), len(self.sizes) - 1)
            while not self.sizes[source]:  # a float edge on an empty source's zero share
                source -= 1
            return self._offsets[source] + rng.randrange(self.sizes[source])
        chunk, at = divmod(pos, CHUNK)
        order, rank = self._chunk_order(seed, chunk)
        source = order[at]
        drawn = self._counts_before(seed, chunk)[source] + rank[at]  # the source's draws before this one
        n = self.sizes[source]
        passes, k = divmod(drawn, n)
        key = ("source", seed, source, passes)
        if key not in self._orders:
            if len(self._orders) > 4 * len(self.sizes):
                self._orders.clear()
            self._orders[key] = epoch_order(n, seed * 1_000_003 + source, passes)
        return self._offsets[source] + self._orders[key][k]

    def chunk_quotas(self, seed: int, chunk: int) -> list[int]:
        """Each source's draws in chunk `chunk`: floor(CHUNK * p), plus one for the sources a systematic draw
        over their fractions picks (each with probability its fraction), seeded by (seed, chunk)."""
        exact = [CHUNK * p for p in self.shares()]
        quotas = [math.floor(x) for x in exact]
        extra = CHUNK - sum(quotas)
        if extra:
            u = seeded("quota", seed, chunk).random()
            acc = 0.0
            for s, x in enumerate(exact):
                frac = x - quotas[s]
                if frac <= 0:
                    continue
                lo, acc = acc, acc + frac
                if math.ceil(acc - u) > math.ceil(lo - u) and extra:  # a point u + j falls in [lo, acc)
                    quotas[s] += 1
                    extra -= 1
            for s in sorted(range(len(quotas)), key=lambda s: -(exact[s] - math.floor(exact[s]))):
                if not extra:
                    break
                if self.sizes[s]:  # float rounding left a point over: the largest fractions take it
                    quotas[s] += 1
                    extra -= 1
        return quotas

    def _counts_before(self, seed: int, chunk: int) -> list[int]:
        """Each source's draws in chunks 0 .. chunk - 1 (their quotas, summed once and kept)."""
        before = self._before.setdefault(seed, [[0] * len(self.sizes)])
        while len(before) <= chunk:
            q = self.chunk_quotas(seed, len(before) - 1)
            before.append([a + b for a, b in zip(before[-1], q, strict=True)])
        return before[chunk]

    def _chunk_order(self, seed: int, chunk: int) -> tuple[list[int], list[int]]:
        """The chunk's sources in draw order, and each draw's rank among its source's draws in the chunk."""
        if (seed, chunk) not in self._chunk:
            if len(self._chunk) > 1:
                self._chunk.clear()
            order = [s for s, q in enumerate(self.chunk_quotas(seed, chunk)) for _ in range(q)]
            seeded("chunk", seed, chunk).shuffle(order)
            seen = [0] * len(self.sizes)
            rank = []
            for s in order:
                rank.append(seen[s])
                seen[s] += 1
            self._chunk[(seed, chunk)] = (order, rank)
        return self._chunk[(seed, chunk)]
