"""Encoder islands of a disaggregated placement: which encoders share ranks, and how many each island has.

The encoders are split into islands (any grouping: all on one, one each, or anything between); each
island holds its encoders' layouts on its own ranks, in the model's encoder order, and the LLM takes
the ranks after the last island. The graph-aware 1F1B merges every island's stream into the LLM's
first stage.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product

from orch.planner.candidates import SearchInput, degrees

Group = tuple[str, ...]


@dataclass(frozen=True)
class Islands:
    """Encoder groups in rank order and each group's GPU count."""

    groups: tuple[Group, ...]
    sizes: tuple[int, ...]

    @classmethod
    def one(cls, encoders: Sequence[str], gpus: int) -> Islands:
        return cls((tuple(encoders),), (gpus,))

    @property
    def encoder_gpus(self) -> int:
        return sum(self.sizes)

    def size_of(self, encoder: str) -> int:
        return self.sizes[self._index(encoder)]

    def offset_of(self, encoder: str) -> int:
        """First global rank of the island that holds `encoder`."""
        return sum(self.sizes[: self._index(encoder)])

    def describe(self) -> str:
        return " | ".join(f"{'+'.join(g)}:{k}" for g, k in zip(self.groups, self.sizes, strict=True))

    def _index(self, encoder: str) -> int:
        for i, g in enumerate(self.groups):
            if encoder in g:
                return i
        raise KeyError(encoder)


def set_partitions(items: Sequence[str]) -> Iterator[tuple[Group, ...]]:
    """Every way of splitting `items` into non-empty groups; groups and members keep the items' order."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield ((first,), *part)
        for i in range(len(part)):
            yield (*part[:i], (first, *part[i]), *part[i + 1 :])


def subsets(items: Sequence[str]) -> list[Group]:
    """Every non-empty group of `items`, members in the items' order: the islands a grouping can use."""
    out: list[Group] = []
    for mask in range(1, 2 ** len(items)):
        out.append(tuple(x for i, x in enumerate(items) if mask >> i & 1))
    return out


def island_sizes(inp: SearchInput) -> list[int]:
    """GPU counts an encoder island may have: any inside one node, or whole nodes.

    Islands are packed in rank order; the LLM island after them starts on a node boundary when the
    cluster has several nodes (llm_island_sizes), so sub-node islands share a node among themselves.
    """
    n, gpn = inp.world, inp.cluster.gpus_per_node
    if n <= gpn:
        return list(range(1, n))
    return [*range(1, gpn), *range(gpn, n, gpn)]


def llm_island_sizes(inp: SearchInput) -> list[int]:
    """GPU counts the LLM island may have: the ranks the encoder islands leave, whole nodes on a multi-node cluster."""
    n, gpn = inp.world, inp.cluster.gpus_per_node
    if n <= gpn:
        return list(range(1, n))
    return list(range(gpn, n, gpn))


def island_layouts(inp: SearchInput) -> Iterator[Islands]:
    """Every grouping of the encoders with every island size that leaves the LLM an allowed island."""
    sizes, llm_sizes = island_sizes(inp), set(llm_island_sizes(inp))
    for groups in set_partitions(list(inp.model.encoder_names)):
        for ks in product(sizes, repeat=len(groups)):
            if inp.world - sum(ks) in llm_sizes:
                yield Islands(groups, ks)


EXACT_SIZES = 40  # up to this many island sizes per side the search tries every one


@dataclass(frozen=True)
class IslandSizes:
    """The island sizes the search considers, for the encoder islands and for the LLM island.

    Every allowed size on a small cluster. On a large one (more than EXACT_SIZES sizes a side), the sizes
    some layout of the module fills exactly with a DP degree on _dp_grid: the degrees that split the
    batch evenly and a geometric ladder, so the model stays small enough to solve in seconds.
    """

    encoders: tuple[int, ...]
    llm: tuple[int, ...]

    @classmethod
    def of(cls, inp: SearchInput) -> IslandSizes:
        enc_allowed, llm_allowed = island_sizes(inp), llm_island_sizes(inp)
        if len(enc_allowed) <= EXACT_SIZES and len(llm_allowed) <= EXACT_SIZES:
            return cls(tuple(enc_allowed), tuple(llm_allowed))
        pinned = {p.value for p in inp.pins if p.axis == "gpus"}
        enc: set[int] = set()
        for e in inp.model.encoder_names:
            enc |= _layout_grid(inp, e)
        llm = _layout_grid(inp, inp.model.llm_name)
        return cls(tuple(sorted((enc | pinned) & set(enc_allowed))), tuple(sorted((llm | pinned) & set(llm_allowed))))


def _dp_grid(limit: int, batch: int) -> list[int]:
    """DP degrees that split the global batch evenly, and 1 to 8 then four per octave (8, 10, 12, 14, 16,
    20, ...): degrees at most 25% apart whatever the batch."""
    out = set(range(1, 9)) | {d for d in range(1, min(limit, batch) + 1) if batch % d == 0}
    base = 8
    while base <= limit:
        out |= {base, base * 5 // 4, base * 3 // 2, base * 7 // 4}
        base *= 2
    return sorted(d for d in out if d <= limit)


def _layout_grid(inp: SearchInput, module: str) -> set[int]:
    """Island sizes that some layout of `module` fills exactly (tp·cp·pp·dp) with dp on _dp_grid: the
    sizes the module's own divisibility favours (a pipeline of 11 stages wants 11·k GPUs)."""
    deg = degrees(inp, module, allow_pp=module == inp.model.llm_name)
    out = set()
    for tp in deg.tp:
        for cp in deg.cp:
            for pp in deg.pp:
                unit = tp * cp * pp
                out |= {unit * d for d in _dp_grid(inp.world // unit, inp.data.global_batch)}
    return out
