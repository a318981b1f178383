"""One step's decoded media on one rank: `DecodeCache`, per (sample, encoder), each decoded once.

A `ConversationBatch` is handed its cache when it is built and reads its samples' encoder inputs through it.
The prefetch thread (runtime/data/prefetch.py) fills it while the step before runs, with what it decoded
itself or what a loader worker process sent back; `ConversationBatch.sample` fills what is still missing
when the step asks. The two can run at once on different threads: a lock guards every read and write, and
the first input stored for a (sample, encoder) is the one kept.
"""

from __future__ import annotations

import threading

import torch

from orch.planner.specs import ModelSpec


class DecodeCache:
    """Decoded encoder inputs of one step's samples, with the samples whose media could not be read."""

    def __init__(self, model: ModelSpec, rows: tuple[dict[str, int], ...], empty: tuple[int, ...] = ()) -> None:
        """`rows`: per sample, each encoder's input rows (`GlobalBatch.input_rows`); `empty`: samples with no
        encoder input (skipped when the batch was built): nothing to decode."""
        self._model, self._rows = model, rows
        self._lock = threading.Lock()
        self._inputs: dict[tuple[int, str], torch.Tensor] = {
            (i, e): torch.zeros(0, model.modules[e].input_dim or 1) for i in empty for e in rows[i]
        }
        self._failed: set[int] = set()
        self._held = len(self._inputs)  # not decoded: `counts` leaves them out

    def missing(self, sample_id: int, encoders: tuple[str, ...]) -> tuple[str, ...]:
        """The encoders among `encoders` whose inputs of the sample are not here yet."""
        with self._lock:
            return tuple(e for e in encoders if (sample_id, e) not in self._inputs)

    def put(self, sample_id: int, encoders: tuple[str, ...], feats: dict[str, torch.Tensor] | None) -> None:
        """Keep a sample's decoded inputs for `encoders` (`ConversationData.decode`'s, None: unreadable); zeros
        of the indexed shape where a file could not be read, and the sample counted as failed."""
        kept: dict[str, tuple[torch.Tensor, bool]] = {}  # encoder -> (input, read)
        for e in encoders:
            rows = self._rows[sample_id][e]
            got = feats.get(e) if feats is not None else None
            if got is None or got.shape[0] != rows:  # unreadable now (or changed): zeros, trained on nothing
                kept[e] = torch.zeros(rows, self._model.modules[e].input_dim or 1), False
            else:
                kept[e] = got, True
        with self._lock:
            for e, (got, read) in kept.items():
                if (sample_id, e) in self._inputs:
                    continue
                self._inputs[(sample_id, e)] = got
                if not read:
                    self._failed.add(sample_id)

    def get(self, sample_id: int, encoder: str) -> torch.Tensor:
        with self._lock:
            return self._inputs[(sample_id, encoder)]

    def failed(self) -> set[int]:
        """The samples with an input that could not be read here."""
        with self._lock:
            return set(self._failed)

    def counts(self) -> dict[str, int]:
        """failed: samples whose media could not be read here; decoded: the (sample, encoder) inputs held."""
        with self._lock:
            return {"failed": len(self._failed), "decoded": len(self._inputs) - self._held}
