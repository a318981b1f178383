"""What a schedule runs over: this rank's modules and how they are joined (`StepContext`, built once), and the
step in flight (`StepWork`). The schedules read these and nothing of the trainer; `llm.run_llm` is the one
place the LLM's pipeline stage runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from orch.planner.specs import ModelSpec
from orch.runtime.data.batch import GlobalBatch, Sample
from orch.runtime.parallel.boundary import Boundary
from orch.runtime.parallel.context import CPGroup
from orch.runtime.parallel.grid import Grid
from orch.runtime.parallel.pipeline import PipelineStage
from orch.runtime.train.aux_loss import RouterAux
from orch.runtime.train.debug import TokenCounter
from orch.runtime.train.inputs import InputRouter
from orch.runtime.train.post_balance import StepTables
from orch.runtime.train.trace import Span


@dataclass(frozen=True)
class StepContext:
    """One rank's side of every step: fixed once the model is built."""

    model: ModelSpec
    rank: int
    world: int
    device: torch.device
    dtype: torch.dtype  # the compute dtype
    grids: dict[str, Grid]
    modules: dict[str, nn.Module]  # the modules this rank serves, parallelised
    cp: dict[str, CPGroup | None]
    stage: PipelineStage | None  # the LLM's pipeline stage here (None: this rank serves no LLM)
    boundaries: dict[str, Boundary]  # per encoder: its move into the LLM's layout
    router: InputRouter
    beat: Callable[[str], None] = lambda phase: None  # a phase boundary: the rank's heartbeat (launch/heartbeat.py)
    aux: RouterAux | None = None  # the LLM's router auxiliary loss, where the model asks for it (train/aux_loss.py)

    def inputs(self, name: str, work: StepWork) -> list[Sample]:
        """The samples this rank runs for `name`, moved to it (collective when balancing: every rank, every module)."""
        return self.router.inputs(name, work.batch, work.tables, self.dtype, serves=name in self.modules)

    def count_encoder(self, counter: TokenCounter, name: str, samples: list[Sample], tables: StepTables) -> None:
        """The token count of an encoder: its tokens per sample (input rows / frames per token), a sample's pieces
        (train/pieces.py) summed."""
        fpt = self.model.modality(name).frames_per_token
        pieces = tables.pieces.get(name)
        counts: dict[int, int] = {}
        for s in samples:
            i = pieces.sample[s.id] if pieces is not None else s.id
            counts[i] = counts.get(i, 0) + s.feats[name].shape[0] // fpt
        counter.add(name, counts)


@dataclass
class StepWork:
    """The state of the step in flight, handed to the schedule."""

    batch: GlobalBatch
    tables: StepTables
    counter: TokenCounter
    phases: dict[str, float] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    aux_sum: float = 0.0  # this rank's share of the step's router aux loss (runtime/train/aux_loss.py)
