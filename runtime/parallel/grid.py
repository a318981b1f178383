"""A module's parallel grid: degrees and global ranks from its ModulePlan, and its DeviceMesh.

Rank order (planner/plan.py): tp fastest, then cp, dp, pp, so the mesh is the rank list
reshaped to (pp, dp, cp, tp). EP is carved out of DP and not a separate mesh axis here.
Nothing is global: each module gets its own frozen grid, passed to whatever communicates
(torchtitan ParallelDims; docs/design.md, Conventions).

Building a DeviceMesh creates one process group per axis with `new_group`, a collective over
the whole world: every rank must build every module's mesh, in the same order, even the
meshes it is not part of (`build_meshes`). With CP, `build_meshes` also creates two flattened
groups per grid (`flat_group`): (cp, tp), the replicas of one DP index (transport broadcast),
and (dp, cp), the ranks whose parameter gradients are summed, also as a DeviceMesh (`dp_mesh`,
FSDP2's). The mesh is lazy so that pure code (routing, tests without a process group) never touches torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orch.planner.plan import Axis, ModulePlan

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

MESH_AXES: tuple[Axis, ...] = (Axis.PP, Axis.DP, Axis.CP, Axis.TP)  # outermost first
# Flattened groups a grid with CP needs (build_meshes creates them, in this order).
FLAT_GROUPS: tuple[tuple[str, ...], ...] = (("cp", "tp"), ("dp", "cp"))


@dataclass(frozen=True)
class Coord:
    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class Grid:
    name: str
    tp: int
    cp: int
    dp: int
    pp: int
    ranks: tuple[int, ...]
    device: str = "cpu"
    _cache: dict[str, DeviceMesh] = field(default_factory=dict, compare=False, repr=False)
    _groups: dict[tuple[str, ...], Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.ranks) != self.tp * self.cp * self.dp * self.pp:
            raise ValueError(
                f"{self.name}: {len(self.ranks)} ranks for tp{self.tp} cp{self.cp} dp{self.dp} pp{self.pp}"
            )
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"{self.name}: ranks repeat")

    @classmethod
    def from_plan(cls, name: str, mp: ModulePlan, device: str = "cpu") -> Grid:
        lay = mp.layout
        return cls(name, lay.tp, lay.cp, lay.dp, lay.pp, tuple(mp.ranks), device)

    def degree(self, axis: Axis | str) -> int:
        return int(getattr(self, str(axis)))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.degree(a) for a in MESH_AXES)

    def rank_at(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        return self.ranks[((pp * self.dp + dp) * self.cp + cp) * self.tp + tp]

    def coord(self, rank: int) -> Coord | None:
        """This global rank's place in the grid, None if it does not serve the module."""
        if rank not in self.ranks:
            return None
        i = self.ranks.index(rank)
        tp, i = i % self.tp, i // self.tp
        cp, i = i % self.cp, i // self.cp
        dp, pp = i % self.dp, i // self.dp
        return Coord(pp, dp, cp, tp)

    def leader(self, dp: int, pp: int = 0) -> int:
        """The rank that sends and receives a DP index's samples at a boundary (tp 0, cp 0)."""
        return self.rank_at(pp=pp, dp=dp)

    def replica_ranks(self, dp: int, pp: int = 0) -> list[int]:
        """The TP x CP ranks that hold one DP index's activations on stage pp (leader first)."""
        return [self.rank_at(pp, dp, c, t) for c in range(self.cp) for t in range(self.tp)]

    @property
    def mesh(self) -> DeviceMesh:
        if "" not in self._cache:
            import torch
            from torch.distributed.device_mesh import DeviceMesh

            ranks = torch.tensor(self.ranks, dtype=torch.int).reshape(self.shape)
            self._cache[""] = DeviceMesh(self.device, ranks, mesh_dim_names=tuple(str(a) for a in MESH_AXES))
        return self._cache[""]

    def submesh(self, axis: Axis | str) -> DeviceMesh:
        key = str(axis)
        if key not in self._cache:
            self._cache[key] = self.mesh[key]
        return self._cache[key]

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The ranks that hold the same parameters and sum their gradients: dp, or (dp, cp) flattened."""
        if self.cp == 1:
            return self.submesh("dp")
        if "dp_cp" not in self._cache:
            self._cache["dp_cp"] = self.mesh["dp", "cp"]._flatten("dp_cp")
        return self._cache["dp_cp"]

    def flat_ranks(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Every group of ranks that differ only in `axes` (in mesh order), one list per coordinate of the rest."""
        import itertools

        names = [str(a) for a in MESH_AXES]
        rest = [a for a in names if a not in axes]
        out = []
        for fixed in itertools.product(*(range(self.degree(a)) for a in rest)):
            group = []
            for varied in itertools.product(*(range(self.degree(a)) for a in axes)):
                at = dict(zip(rest, fixed, strict=True)) | dict(zip(axes, varied, strict=True))
                group.append(self.rank_at(at["pp"], at["dp"], at["cp"], at["tp"]))
            out.append(sorted(group))
        return out

    def flat_group(self, *axes: str) -> Any:
        """This rank's process group over the flattened `axes` (created on first use: a world collective)."""
        if axes not in self._groups:
            import torch.distributed as dist

            self._groups[axes], _ = dist.new_subgroups_by_enumeration(self.flat_ranks(axes))
        return self._groups[axes]


def build_grids(modules: dict[str, ModulePlan], device: str = "cpu") -> dict[str, Grid]:
    return {name: Grid.from_plan(name, mp, device) for name, mp in sorted(modules.items())}


def build_meshes(grids: dict[str, Grid]) -> None:
    """Create every grid's mesh on this rank, in name order: new_group is a world collective."""
    for name in sorted(grids):
        _ = grids[name].mesh
        if grids[name].cp > 1:
            for axes in FLAT_GROUPS:
                grids[name].flat_group(*axes)
            _ = grids[name].dp_mesh
