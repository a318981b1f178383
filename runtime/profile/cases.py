"""What `orch profile` measures: its configuration and its cases, as typed values (no torch).

A case is one timed measurement that every rank runs at the same time (runtime/profile/bench.py).
Its `key` names its result in the raw record rank 0 writes (WORKDIR/profile-raw.json, the `times`
map); the profile is built from the same case list (`build_cases`, runtime/profile/build.py), which
reads each number through its case's fields, never by parsing a key back.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from orch.planner.specs import ModelSpec
from orch.runtime.train.config import ELEM_BYTES, torch_dtype

if TYPE_CHECKING:
    import torch

MICRO_BATCH_SIZES = (1, 2, 4)  # three micro-batch sizes separate the per-call cost from the per-sample one
BOUNDARY_SCALES = (1, 4)  # row multipliers of the boundary case: two message sizes for the alpha-beta fit
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
Link = Literal["intra_node", "inter_node"]
LINKS: tuple[Link, ...] = ("intra_node", "inter_node")


@dataclass(frozen=True)
class ProfileConfig:
    """What `orch profile` is asked to measure; a frozen value pickled to every rank."""

    model_json: str
    data_json: str
    ranks_per_node: int
    quick: bool = False
    max_bytes: int = 16 << 20
    dtype: str = "float32"
    seed: int = 0
    progress: bool = False  # rank 0 draws a progress bar on stderr
    # Passes over the whole case list; a case's figure is its median over the passes. A burst of other work
    # on a shared machine spans a case's back-to-back windows but seldom the same case in every pass.
    passes: int = 3
    # A pass during which more than this share of the CPU time was stolen by the host (runtime/profile/steal.py)
    # is timed again, up to `passes` more times: it measured a slower machine than the run will have.
    max_steal: float = 0.05
    lengths: tuple[int, ...] = ()  # override the sequence lengths (tests)
    modules: tuple[str, ...] = ()  # only these modules (tests); default all

    def seq_lengths(self, module: str, llm: str) -> tuple[int, ...]:
        """The sequence lengths `module`'s blocks are timed at: a short ladder below, and the lengths the data
        has (median, 90th percentile and largest of its samples that use the module), so the fit is
        measured where the run will be and not extrapolated to it."""
        if self.lengths:
            return self.lengths
        seen = data_lengths(self.data_json, module, llm)
        if not seen:
            return (16, 64, 192) if self.quick else (8, 16, 32, 64, 128, 192, 256, 384)
        ladder = (16,) if self.quick else (8, 16, 32, 64, 128, 256)
        return tuple(sorted({x for x in ladder if x < seen[-1]} | set(seen)))

    def sizes(self) -> list[int]:
        step = 32 if self.quick else 4
        out, b = [], 1024
        while b <= self.max_bytes:
            out.append(b)
            b *= step
        if out and out[-1] != self.max_bytes and self.max_bytes > 1024:
            out.append(self.max_bytes)
        return out or [1024]

    @property
    def reps(self) -> int:
        """Timed windows of a case per pass."""
        return 1 if self.quick else 4

    @property
    def elem_bytes(self) -> int:
        return ELEM_BYTES[self.dtype]

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)


@lru_cache(maxsize=32)
def data_lengths(data_json: str, module: str, llm: str) -> tuple[int, ...]:
    """Median, 90th percentile and largest of `module`'s tokens per sample over the samples that use it
    (the LLM's capped at seq_len); () when the data never uses the module."""
    from orch.planner.data import module_lengths
    from orch.planner.specs import DataSpec

    values = sorted(n for n in module_lengths(DataSpec.model_validate_json(data_json), module, llm, 4096, 0) if n)
    if not values:
        return ()
    return tuple(sorted({values[len(values) // 2], values[int(0.9 * (len(values) - 1))], values[-1]}))


def tp_degrees(model: ModelSpec, name: str, world: int, ranks_per_node: int) -> list[int]:
    """The TP degrees `name` is timed at: inside a node, dividing the world, splitting the module (splits_over)."""
    m = model.modules[name]
    return [t for t in (1, 2, 4, 8) if t <= ranks_per_node and world % t == 0 and m.splits_over(t)]


@dataclass(frozen=True)
class BlockCase:
    """One block of `module` on a TP group of `tp` ranks, forward and backward on a packed micro-batch
    of `k` samples of `length` tokens; `peak`: also its activation bytes per token (the largest case)."""

    module: str
    tp: int
    k: int
    length: int
    peak: bool = False

    @property
    def key(self) -> str:
        return f"block/{self.module}/{self.tp}/{self.k}/{self.length}"


@dataclass(frozen=True)
class RestCase:
    """The module outside its blocks (stem, norm, projector; the LLM's embedding, head and loss), forward
    and backward on `k` samples of `length` tokens, at TP 1."""

    module: str
    k: int
    length: int

    @property
    def key(self) -> str:
        return f"rest/{self.module}/{self.k}/{self.length}"


@dataclass(frozen=True)
class OverheadCase:
    """The module's fixed work per step (its units' gather and gradient reductions, the norm, the optimizer step)
    with data parallelism over every rank, or `alone` over each rank by itself (no peer to reduce with)."""

    module: str
    alone: bool = False

    @property
    def key(self) -> str:
        return f"overhead/{self.module}" + ("/alone" if self.alone else "")


@dataclass(frozen=True)
class StepCase:
    """The per-step bookkeeping outside the modules: batch assembly, the loss all_reduce, the metrics gather."""

    @property
    def key(self) -> str:
        return "step"


@dataclass(frozen=True)
class BoundaryPoint:
    """One encoder's boundary move into the LLM layout, forward and backward, its rows times `scale`."""

    encoder: str
    scale: int

    @property
    def key(self) -> str:
        return f"boundary/{self.encoder}/{self.scale}"

    @property
    def bytes_key(self) -> str:
        """The result key of the mean encoder-output bytes per rank this move carried."""
        return f"boundary_bytes/{self.encoder}/{self.scale}"


@dataclass(frozen=True)
class RuntimeCase:
    """The runtime's own per-step work, through its code: the orchestrator and input routes (`key`), and
    each encoder's boundary move at each scale (`boundaries`)."""

    boundaries: tuple[BoundaryPoint, ...]

    @property
    def key(self) -> str:
        return "balance"


@dataclass(frozen=True)
class CommCase:
    """One nccl-tests-style collective `op` of `nbytes` over the ranks of one `link` kind."""

    link: Link
    op: str
    nbytes: int

    @property
    def key(self) -> str:
        return f"comm/{self.link}/{self.op}/{self.nbytes}"


Case = BlockCase | RestCase | OverheadCase | StepCase | RuntimeCase | CommCase


def build_cases(cfg: ProfileConfig, model: ModelSpec, world: int) -> list[Case]:
    """Every case of a profile of `model` on `world` ranks, in the order every rank runs them."""
    from orch.runtime.data.batch import encoder_order

    names = [n for n in model.modules if not cfg.modules or n in cfg.modules]
    ks = MICRO_BATCH_SIZES
    cases: list[Case] = []
    for n in names:
        lengths = cfg.seq_lengths(n, model.llm_name)
        for t in tp_degrees(model, n, world, cfg.ranks_per_node):
            cases += [
                BlockCase(n, t, k, length, peak=length == max(lengths) and k == max(ks))
                for length in lengths
                for k in ks
            ]
        cases += [RestCase(n, k, length) for length in lengths for k in ks]
        cases += [OverheadCase(n)] + ([OverheadCase(n, alone=True)] if world > 1 else [])
    cases.append(StepCase())
    cases.append(RuntimeCase(tuple(BoundaryPoint(e, s) for e in encoder_order(model) for s in BOUNDARY_SCALES)))
    nodes = world // cfg.ranks_per_node
    for link in LINKS:
        if nodes > 1 or link == "intra_node":
            cases += [CommCase(link, op, b) for op in OPS for b in cfg.sizes()]
    return cases


__all__ = [
    "BlockCase",
    "BoundaryPoint",
    "Case",
    "CommCase",
    "Link",
    "OverheadCase",
    "ProfileConfig",
    "RestCase",
    "RuntimeCase",
    "StepCase",
    "build_cases",
    "data_lengths",
    "tp_degrees",
]
