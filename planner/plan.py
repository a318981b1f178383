"""The plan file: what `orch plan` writes and the runtime executes (docs/design.md, Plan JSON).

Readable without the search code: the runtime imports only this module and the specs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orch.planner.sample_cost import SampleCost
from orch.planner.specs import ClusterSpec, DataSpec, ModelSpec

PLAN_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Placement(StrEnum):
    HOMOGENEOUS = "homogeneous"  # every module inherits the LLM's layout (Megatron-LM baseline)
    COLOCATED = "colocated"  # same GPUs, a grid per module, three-phase schedule
    DISAGGREGATED = "disaggregated"  # encoder island and LLM island, graph-aware 1F1B


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class DataParallel(StrEnum):
    """How a module's data-parallel replicas hold their state (runtime/parallel/fsdp.py).

    fsdp: FSDP2 `fully_shard` over the (dp, cp) ranks: parameters, gradients and optimizer state sharded
    at rest, gathered once per step, gradients reduce-scattered. replicate: every rank holds the whole
    state, gradients all-reduced (cheaper for a small module: one collective, no gather)."""

    FSDP = "fsdp"
    REPLICATE = "replicate"


class Sharding(StrEnum):
    """When an fsdp module's parameters are gathered (runtime/parallel/fsdp.py; docs/data_parallel.md).

    keep: every unit gathered once before the step and kept until its end, full-size gradients
    accumulated and reduced once (ZeRO-2 memory with gathered parameters, any number of calls per rank).
    reshard: ZeRO-3, each block gathered before its forward and freed after, gathered again for its
    backward, its gradients reduce-scattered as its backward ends (every DP rank makes the same calls:
    empty micro-batches pad the ranks that hold fewer samples)."""

    KEEP = "keep"
    RESHARD = "reshard"


class EdgeKind(StrEnum):
    EQUAL_DP = "equal_dp"
    FAN_IN = "fan_in"  # DP_src > DP_dst
    FAN_OUT = "fan_out"  # DP_src < DP_dst


class Transport(StrEnum):
    COLOCATED = "colocated"
    P2P = "p2p"


class Axis(StrEnum):
    """Mesh axes, innermost (fastest-varying rank) first: tp, cp, ep, dp, pp (Megatron order)."""

    TP = "tp"
    CP = "cp"
    DP = "dp"
    PP = "pp"
    EP = "ep"


class Layout(_Model):
    tp: int = Field(default=1, gt=0)
    cp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    dp: int = Field(default=1, gt=0)
    ep: int = Field(default=1, gt=0, description="expert parallel degree, carved out of dp")

    @model_validator(mode="after")
    def _ep_inside_dp(self) -> Layout:
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp})")
        return self

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def degree(self, axis: Axis | str) -> int:
        return int(getattr(self, str(axis)))

    def short(self) -> str:
        parts = [f"{a}{self.degree(a)}" for a in ("tp", "cp", "pp", "dp", "ep") if self.degree(a) > 1 or a == "dp"]
        return " ".join(parts)


class ModulePlan(_Model):
    layout: Layout
    ranks: list[int] = Field(description="global ranks, in mesh order (tp fastest, then cp, dp, pp)")
    micro_batch: int = Field(gt=0, description="samples per micro-batch")
    num_micro_batches: int = Field(gt=0, description="micro-batches per DP rank per step")
    recompute: Recompute = Recompute.NONE
    data_parallel: DataParallel = Field(
        default=DataParallel.REPLICATE,
        description="fsdp: state sharded over the (dp, cp) ranks; replicate: whole on each, gradients all-reduced",
    )
    sharding: Sharding = Field(
        default=Sharding.KEEP,
        description="fsdp only: keep (gathered for the whole step) or reshard (ZeRO-3: gathered per block call); "
        "a plan file without it keeps",
    )
    memory_gb: float = Field(ge=0, description="predicted peak memory per GPU from this module")
    time_s: float = Field(default=0.0, ge=0, description="predicted busy time of this module per step")
    sample_cost: SampleCost | None = Field(
        default=None,
        description="seconds one sample costs a DP index of this layout, from the profile the plan was priced "
        "with (planner/costs.py, profiled_sample_cost); the runtime's dispatcher starts from it instead of "
        "timing the module at start-up. None: planned from datasheet numbers",
    )

    @property
    def reshards(self) -> bool:
        """FSDP that gathers each block per call (ZeRO-3): its DP ranks must make the same calls."""
        return self.data_parallel == DataParallel.FSDP and self.sharding == Sharding.RESHARD

    @model_validator(mode="after")
    def _ranks_match_layout(self) -> ModulePlan:
        if len(self.ranks) != self.layout.gpus:
            raise ValueError(f"{len(self.ranks)} ranks for a layout of {self.layout.gpus} GPUs")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError("ranks repeat")
        return self


class Edge(_Model):
    src: str
    dst: str
    kind: EdgeKind
    transport: Transport


class Prediction(_Model):
    step_time_s: float = Field(ge=0)
    tokens_per_s: float = Field(ge=0)
    mfu: float = Field(ge=0)
    phases: dict[str, float] = Field(default_factory=dict, description="seconds per phase of one step")
    terms: dict[str, float] = Field(
        default_factory=dict,
        description="seconds per step as the runtime times them, per rank that does the work: '<module> fwd+bwd', "
        "'boundaries', 'grad sync+optimizer' (mean over all ranks), 'orchestrator', 'step bookkeeping' "
        "(`orch validate` compares these)",
    )


class BaselinePlan(_Model):
    placement: Placement = Placement.HOMOGENEOUS
    modules: dict[str, ModulePlan]
    predicted: Prediction


class Alternative(_Model):
    placement: Placement
    layouts: dict[str, str]
    gpus: dict[str, int]
    predicted: Prediction


Schedule = Literal["1f1b", "three_phase", "graph_1f1b"]


class Plan(_Model):
    version: Literal[1] = 1
    placement: Placement
    schedule: Schedule
    world_size: int = Field(gt=0)
    ranks_per_node: int = Field(gt=0)
    modules: dict[str, ModulePlan]
    edges: list[Edge]
    predicted: Prediction
    baseline: BaselinePlan | None = None
    alternatives: list[Alternative] = Field(default_factory=list)
    model: ModelSpec
    cluster: ClusterSpec
    data: DataSpec

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        if set(self.modules) != set(self.model.modules):
            raise ValueError(f"modules {sorted(self.modules)} differ from the model's {sorted(self.model.modules)}")
        for name, mp in self.modules.items():
            bad = [r for r in mp.ranks if not 0 <= r < self.world_size]
            if bad:
                raise ValueError(f"modules.{name}.ranks: {bad[:3]} outside 0..{self.world_size - 1}")
        for i, edge in enumerate(self.edges):
            for end in ("src", "dst"):
                if getattr(edge, end) not in self.modules:
                    raise ValueError(
                        f"edges.{i}.{end}: no module '{getattr(edge, end)}'; expected one of {sorted(self.modules)}"
                    )
        used = set().union(*(mp.ranks for mp in self.modules.values()))
        idle = sorted(set(range(self.world_size)) - used)
        if idle:
            # every rank the launcher starts must hold some module's grid
            held = _ranges(sorted(used))
            raise ValueError(
                f"world_size: {self.world_size} ranks, but the modules hold only {held} ({len(used)}); "
                f"ranks {_ranges(idle)} would start and sit idle"
            )
        return self


def _ranges(ranks: list[int]) -> str:
    """Sorted ranks as runs: 0-3, 6, 8-9."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)
