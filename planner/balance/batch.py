"""The input and output of `orch balance`: one global batch, and where every sample goes per phase.

The field names are a contract (issue 3, `orch balance`): a later check reads the JSON exactly,
so the result models carry no field beyond the ones listed there. One JSON name differs from the
code's: a batch file's `ranks_per_node` is `Batch.dp_per_node` (DP ranks per node, not the plan's
GPUs per node), through a pydantic alias that is the only spelling a file may use.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orch.planner.sample_cost import SampleCost

LLM_PHASE = "llm"  # the phase every encoder phase feeds; routes compose into it

NonNegInt = Annotated[int, Field(ge=0)]


class PhaseSpec(SampleCost):
    """Cost of one phase (an encoder or the LLM): the per-sample cost model (planner/sample_cost.py,
    constant + linear·len + quadratic·len² for len > 0), how a rank runs it, and its cap.

    A sample of length 0 takes no part in the phase and costs nothing (the constant included). `call`
    (per packed call) is the same for every placement, so the dispatcher does not read it. A batch
    file's phase without `linear` costs one per token.
    """

    linear: float = Field(default=1.0, ge=0, description="cost per token (MLP, projections)")
    padded: bool = Field(
        default=False, description="rank cost = samples on the rank × cost(longest on the rank), as padded batches run"
    )
    max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="per-rank token cap (memory): sum of lengths, or samples × longest for a padded phase",
    )


class Sample(BaseModel):
    """One sample of the global batch, on the DP rank that sampled it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    origin: NonNegInt = Field(description="DP rank that holds the sample before balancing")
    lengths: dict[str, NonNegInt] = Field(description="tokens per phase; a missing phase is 0 (modality absent)")
    bytes: dict[str, NonNegInt] = Field(
        default_factory=dict,
        description="payload moved per phase if the sample changes rank; missing: the phase's length",
    )


class Batch(BaseModel):
    """One global batch: N DP ranks, R per node, the phases' costs, and every sample."""

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    version: Literal[1] = 1
    num_ranks: int = Field(gt=0, description="DP ranks N")
    dp_per_node: int = Field(alias="ranks_per_node", gt=0, description="DP ranks per node R; N must be a multiple")
    phases: dict[str, PhaseSpec] = Field(description="phase name -> cost; the LLM phase is named 'llm'")
    samples: list[Sample] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Batch:
        # Messages start with the field path: the loader renders them as `file: field: message`.
        if self.num_ranks % self.dp_per_node:
            raise ValueError(
                f"num_ranks: expected a multiple of ranks_per_node ({self.dp_per_node}), got {self.num_ranks}"
            )
        declared = sorted(self.phases)
        for i, s in enumerate(self.samples):
            if s.origin >= self.num_ranks:
                raise ValueError(f"samples.{i}.origin: expected a rank in 0..{self.num_ranks - 1}, got {s.origin}")
            for part in ("lengths", "bytes"):
                for key in getattr(s, part):
                    if key not in self.phases:
                        raise ValueError(
                            f"samples.{i}.{part}.{key}: phase '{key}' is not declared; expected one of {declared}"
                        )
        return self

    @property
    def num_nodes(self) -> int:
        return self.num_ranks // self.dp_per_node


class PhaseResult(BaseModel):
    """Where every sample goes for one phase, and what that costs."""

    model_config = ConfigDict(extra="forbid")

    dest: list[int] = Field(description="dest[i]: sample i's rank for this phase (its origin if its length is 0)")
    max_cost: float = Field(description="largest rank cost after the move")
    mean_cost: float = Field(description="mean rank cost after the move")
    lower_bound: float = Field(description="no assignment has a smaller max cost (cost.lower_bound)")
    inter_node_bytes: int = Field(description="bytes of samples that change node")
    intra_node_bytes: int = Field(description="bytes of samples that change rank inside their node")
    seconds: float = Field(description="time the dispatcher took for this phase")


class BalanceResult(BaseModel):
    """`orch balance --json`: per phase the destinations, per encoder phase the composed route."""

    model_config = ConfigDict(extra="forbid")

    phases: dict[str, PhaseResult]
    routes: dict[str, list[tuple[int, int]]] = Field(
        description="per encoder phase, each sample's [encoder rank, llm rank] (Π_llm ∘ Π_enc⁻¹)"
    )
