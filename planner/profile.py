"""The profile file `orch profile` writes and `orch plan --profile` reads (measured costs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orch.planner.sample_cost import SampleCost

PROFILE_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A profile written before issue 28 named the terms after the fit's coefficients.
_OLD_TERM_NAMES = {"call_s": "call", "c0": "constant", "c1": "linear", "c2": "quadratic"}


class ComputeFit(SampleCost):
    """Forward+backward seconds of one block (one TP shard), the per-sample cost model in seconds
    (planner/sample_cost.py): one call on a packed micro-batch of k samples of `len` tokens takes
    call + k·(constant + linear·len + quadratic·len²)."""

    rel_error: float = Field(default=0.0, ge=0, description="max relative error of the fit on the measured points")
    memory_bytes_per_token: float = Field(default=0.0, ge=0, description="peak activation bytes per token per block")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """Profiles written before issue 28 (`c0`, `c1`, `c2`, `call_s`) still load, as these terms."""
        if not isinstance(data, dict) or not any(k in data for k in _OLD_TERM_NAMES):
            return data
        out = {}
        for k, v in data.items():
            new = _OLD_TERM_NAMES.get(k, k)
            if new in out or (new != k and new in data):
                raise ValueError(f"{k}: the old name of '{new}', given together with it; keep one")
            out[new] = v
        return out


class ModuleProfile(_Model):
    block: dict[int, ComputeFit] = Field(description="fits per TP degree")
    stem: ComputeFit | None = Field(default=None, description="patch embedding / conv subsampling, per input token")
    rest: ComputeFit | None = Field(
        default=None,
        description="everything outside the blocks, fwd+bwd: stem, final norm and projector (encoders); "
        "embedding, final norm, LM head and loss (LLM)",
    )
    step_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="fixed seconds per step: the module's data parallelism as a step runs it (its FSDP2 units "
        "gathered, their gradients reduced), the gradient norm and its optimizer step "
        "(the step's batch assembly and metric collectives are Profile.step_bookkeeping_s, the boundary moves and "
        "the orchestrator Profile.boundary and Profile.balance_step_s; profiles written before step_bookkeeping_s "
        "existed carry it in the LLM's)",
    )
    step_overhead_alone_s: float | None = Field(
        default=None,
        ge=0,
        description="the same work with no data-parallel peer (each rank by itself); step_overhead_s is over every "
        "profiled rank. None: not measured (one rank, or a profile from before)",
    )

    def step_overhead(self, ranks: int, profiled: int) -> float:
        """The step-end work of a module whose data parallelism spans `ranks` ranks, from its measurements alone
        and over `profiled` ranks: interpolated in the ring's steps (ranks - 1), as its latency-bound
        collectives grow; held at the profiled figure beyond (links price the traffic of larger groups)."""
        alone = self.step_overhead_alone_s
        if alone is None or profiled <= 1:
            return self.step_overhead_s
        share = min(max(ranks - 1, 0) / (profiled - 1), 1.0)
        return alone + (self.step_overhead_s - alone) * share


class LinkFit(_Model):
    """Alpha-beta model of one link kind: t(bytes) = alpha_s + bytes / (gbps·1e9)."""

    alpha_s: float = Field(ge=0)
    gbps: float = Field(gt=0)


class BoundaryFit(_Model):
    """The runtime's encoder -> LLM boundary move (runtime/parallel/transport.py, forward and backward together), per
    encoder per step: t = alpha_s + bytes / (gbps·1e9), bytes = the encoder outputs one rank holds at the
    source (mean over ranks), at the profile's dtype (`elem_bytes` per element)."""

    alpha_s: float = Field(ge=0)
    gbps: float = Field(gt=0)
    elem_bytes: int = Field(default=4, ge=1)


class CoreSharing(_Model):
    """CPU profiles: the ranks of one machine share its cores, so every measured time holds the slowdown
    of `ranks` processes on `cores` cores, and a rank runs faster while others of the machine wait."""

    cores: int = Field(ge=1, description="CPU cores the profiled ranks of one machine could run on")
    ranks: int = Field(ge=1, description="profiled ranks on that machine (all busy in every timed case)")


class CollectiveRow(_Model):
    op: str
    link: Literal["intra_node", "inter_node"]
    ranks: int
    bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float


class Profile(_Model):
    version: Literal[1] = 1
    cluster: str = ""
    device: str = Field(description="device name, e.g. 'NVIDIA H100 80GB HBM3' or 'cpu'")
    backend: str = Field(description="nccl or gloo")
    torch_version: str = ""
    date: str = ""
    dtype: str = "bfloat16"
    model: str = ""
    modules: dict[str, ModuleProfile] = Field(default_factory=dict)
    links: dict[Literal["intra_node", "inter_node"], LinkFit] = Field(default_factory=dict)
    collectives: list[CollectiveRow] = Field(default_factory=list)
    nproc: int = Field(default=1, ge=1, description="processes that ran the benchmark concurrently")
    ranks_per_node: int = Field(default=1, ge=1)
    quick: bool = False
    boundary: BoundaryFit | None = Field(
        default=None, description="measured boundary move (transport.move, fwd+bwd) per encoder per step"
    )
    balance_step_s: float = Field(
        default=0.0,
        ge=0,
        description="the post-balancing orchestrator's per-step work on the critical path: the next step's length "
        "announce and this step's input routes (the dispatch runs on a worker thread during the step before)",
    )
    step_bookkeeping_s: float = Field(
        default=0.0,
        ge=0,
        description="the runtime's per-step work outside modules and orchestrator: batch assembly, the loss "
        "all_reduce and the metrics gather",
    )
    sharing: CoreSharing | None = Field(
        default=None, description="how the profiled ranks shared CPU cores; None on GPUs (a device per rank)"
    )
    steal_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="the largest share of CPU time a virtual machine's host took for other guests during a kept "
        "pass (/proc/stat steal); None where the kernel does not say",
    )
    passes_repeated: int = Field(
        default=0, ge=0, description="passes timed again because the host stole more than the allowed share"
    )


def busy_ratio(profile: Profile | None, world: int, busy: int) -> float:
    """How long work takes while only `busy` ranks run, relative to its measured time (every rank busy).

    1 unless the profiled ranks shared one machine's cores and the plan runs on that many ranks: then a
    rank's share of the cores is min(1, cores / busy) instead of min(1, cores / ranks). Islands on
    machines of their own (Slurm nodes, GPUs) gain nothing when the other island waits.
    """
    s = profile.sharing if profile is not None else None
    if s is None or s.ranks != world or busy <= 0:
        return 1.0

    def slowdown(n: int) -> float:
        return max(1.0, n / s.cores)

    return slowdown(busy) / slowdown(s.ranks)
