"""The input and output of `orch balance`: one global batch, and where every sample goes per phase.

The field names are a contract (issue 3, `orch balance`): a later check reads the JSON exactly,
so the result models carry no field beyond the ones listed there. One JSON name differs from the
code's: a batch file's `ranks_per_node` is `Batch.dp_per_node` (DP ranks per node, not the plan's
GPUs per node), through a pydantic alias that is the only spelling a file may use.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, model_validator

from orch.planner.sample_cost import SampleCost

LLM_PHASE = "llm"  # the phase every encoder phase feeds; routes compose into it

NonNegInt = Annotated[int, Field(ge=0)]


def _tokens_or_items(value: object) -> int | list[int]:
    """A number of tokens (>= 0), or a list of item token counts (each > 0): one error line for either."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"expected a number of tokens >= 0, got {value}")
        return value
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return list(value)
    raise ValueError(f"expected a number of tokens >= 0 or a list of item token counts > 0, got {value!r}")


def _bytes_or_items(value: object) -> int | list[int]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return list(value)
    raise ValueError(f"expected a number of bytes >= 0 or a list of them per item, got {value!r}")


_INT_OR_LIST = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "array", "items": {"type": "integer"}}]}
TokensOrItems = Annotated[int | list[int], PlainValidator(_tokens_or_items), WithJsonSchema(_INT_OR_LIST)]
BytesOrItems = Annotated[int | list[int], PlainValidator(_bytes_or_items), WithJsonSchema(_INT_OR_LIST)]


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
    lengths: dict[str, TokensOrItems] = Field(
        description="tokens per phase; a missing phase is 0 (modality absent); an encoder phase may list its "
        "items' tokens (images, runs of a video's frame groups, audio windows), balanced by item"
    )
    bytes: dict[str, BytesOrItems] = Field(
        default_factory=dict,
        description="payload moved per phase if the sample changes rank (per item where lengths lists items: "
        "a list as long, or one number shared by tokens); missing: the phase's length",
    )

    def items(self, phase: str) -> list[int]:
        """The phase's item lengths: a number is one item (none if 0)."""
        got = self.lengths.get(phase, 0)
        return list(got) if isinstance(got, list) else [got] if got else []

    def item_bytes(self, phase: str) -> list[int]:
        """Each item's bytes: listed, or the number (the phase's length if missing) shared by tokens."""
        lens = self.items(phase)
        got = self.bytes.get(phase)
        if isinstance(got, list):
            return list(got)
        total = sum(lens) if got is None else got
        tokens = sum(lens)
        cum = [0]
        for n in lens:
            cum.append(cum[-1] + n)
        return [total * cum[k + 1] // tokens - total * cum[k] // tokens for k in range(len(lens))] if tokens else []


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
            for key, value in s.lengths.items():
                if isinstance(value, list) and key == LLM_PHASE:
                    raise ValueError(f"samples.{i}.lengths.{key}: expected one number (the LLM runs a sample whole)")
                listed = s.bytes.get(key)
                if isinstance(listed, list) and len(listed) != len(s.items(key)):
                    raise ValueError(
                        f"samples.{i}.bytes.{key}: expected {len(s.items(key))} numbers (one per item), "
                        f"got {len(listed)}"
                    )
        return self

    @property
    def num_nodes(self) -> int:
        return self.num_ranks // self.dp_per_node


class PhaseResult(BaseModel):
    """Where every sample goes for one phase, and what that costs."""

    model_config = ConfigDict(extra="forbid")

    dest: list[int | list[int]] = Field(
        description="dest[i]: sample i's rank for this phase (its origin if its length is 0); a list of its items' "
        "ranks where its lengths listed items"
    )
    max_cost: float = Field(description="largest rank cost after the move")
    mean_cost: float = Field(description="mean rank cost after the move")
    lower_bound: float = Field(
        description="no assignment has a smaller max cost (cost.lower_bound; of items where the phase lists them)"
    )
    inter_node_bytes: int = Field(description="bytes of samples that change node")
    intra_node_bytes: int = Field(description="bytes of samples that change rank inside their node")
    seconds: float = Field(description="time the dispatcher took for this phase")


class BalanceResult(BaseModel):
    """`orch balance --json`: per phase the destinations, per encoder phase the composed route."""

    model_config = ConfigDict(extra="forbid")

    phases: dict[str, PhaseResult]
    routes: dict[str, list[tuple[int | list[int], int]]] = Field(
        description="per encoder phase, each sample's [encoder rank, llm rank] (Π_llm ∘ Π_enc⁻¹); the encoder "
        "ranks of its items where its lengths listed items"
    )
