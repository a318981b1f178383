"""Decoding the next step's samples while the current step runs (a data file's batches only).

When step k announces step k + 1, `SamplePrefetcher.start` hands a worker thread the upcoming batch and the
future of its post-balancing tables; the worker waits for the tables, then decodes the images and clips of
every sample this rank will build for each module it serves (where the dispatcher puts them when loading at
the destination, their origin otherwise) into the batch's cache. Step k + 1 takes the same batch object and
`wait()`s for the worker first (the wait is the step's `load` phase: zero when decoding hid behind compute).
Image decoding (Pillow) and the STFT release the GIL, so the thread overlaps the step's compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from orch.runtime.data.source import ConversationBatch


class SamplePrefetcher:
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._pool: ThreadPoolExecutor | None = None
        self._job: tuple[int, Future[None]] | None = None

    def start(self, batch: ConversationBatch, wanted: Callable[[], dict[str, list[int]]]) -> None:
        """Decode, on the worker, every (module -> sample ids) `wanted()` returns (it may wait for tables)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="orch-load")

        def run() -> None:
            for module, ids in wanted().items():
                for i in ids:
                    batch.sample(i, self.dtype, "cpu", (module,))

        self._job = (batch.step, self._pool.submit(run))

    def wait(self, step: int) -> float:
        """Wait for the prefetch of `step` (if one runs); the seconds waited."""
        if self._job is None or self._job[0] != step:
            return 0.0
        t = time.perf_counter()
        self._job[1].result()
        self._job = None
        return time.perf_counter() - t

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
