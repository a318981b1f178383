"""Decoding the next step's samples while the current step runs (a data file's batches only).

When step k announces step k + 1, `SamplePrefetcher.start` hands a thread the upcoming batch and the future
of its post-balancing tables; the thread waits for the tables, then decodes the images and clips of every
sample this rank will build for each module it serves (where the dispatcher puts them when loading at the
destination, their origin otherwise) into the batch's `DecodeCache` (runtime/data/decode_cache.py), the one
object the thread writes. Step k + 1 takes the same batch object and `wait()`s for it first (the wait is the
step's `load` phase: zero when decoding hid behind compute); its `sample` reads the inputs from that cache.

`workers` > 0 (`--loader-workers`): the decoding runs in that many worker processes (spawned once, each
opening the data file, its index and the model's processors), as a DataLoader's workers do, so decoding
uses other cores than the rank's and never holds its GIL; the thread only hands them rows and stores what
comes back. 0: the thread decodes itself (Pillow and the STFT release the GIL).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from orch.runtime.data.problems import DataProblems
from orch.runtime.data.source import ConversationBatch, ConversationData

if TYPE_CHECKING:
    from orch.planner.specs import DataSpec, ModelSpec

Opened = tuple["ModelSpec", "DataSpec"] | tuple["ModelSpec", "DataSpec", DataProblems]
_WORKER_DATA: list[ConversationData] = []  # the worker process's own opened data file (one per process)


def _open_in_worker(model: ModelSpec, data: DataSpec, problems: DataProblems | None = None) -> None:
    torch.set_num_threads(1)
    _WORKER_DATA.append(ConversationData(model, data, problems))  # its problems appended as the rank's


def _decode_in_worker(row: int, encoders: tuple[str, ...], step: int) -> dict[str, torch.Tensor] | None:
    return _WORKER_DATA[0].decode(row, encoders, step)


def _hold_stop_signals() -> None:
    """The loader thread's (and so its worker processes': they inherit the mask of the thread that starts them)
    stop signals held: a Ctrl-C or a systemd stop reaches the rank's whole process group, and the rank, which
    stops at its next step boundary and closes the pool, acts on it; a worker it killed would break the pool."""
    import signal

    from orch.runtime.preemption import STOP_SIGNALS

    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


class SamplePrefetcher:
    def __init__(self, workers: int = 0, opened: Opened | None = None) -> None:
        """`workers` processes decoding (0: one thread); `opened`: the model and data they open (and where they
        append the media they cannot read)."""
        self._thread: ThreadPoolExecutor | None = None
        self._procs: ProcessPoolExecutor | None = None
        self._workers, self._opened = workers, opened
        self._job: tuple[int, Future[None]] | None = None

    def _pool(self) -> ProcessPoolExecutor | None:
        if self._workers <= 0 or self._opened is None:
            return None
        if self._procs is None:
            import multiprocessing

            self._procs = ProcessPoolExecutor(
                self._workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_open_in_worker,
                initargs=self._opened,
            )
        return self._procs

    def start(self, batch: ConversationBatch, wanted: Callable[[], dict[str, list[int]]]) -> None:
        """Decode every (module -> sample ids) `wanted()` returns (it may wait for tables), off the step's path."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="orch-load", initializer=_hold_stop_signals)
        procs = self._pool()

        cache = batch.decoded

        def run() -> None:
            items = [
                (i, missing)
                for module, ids in wanted().items()
                for i in ids
                if (missing := cache.missing(i, (module,)))
            ]
            if procs is None:
                for i, encoders in items:
                    cache.put(i, encoders, batch.source.decode(batch.rows[i], encoders, batch.step))
                return
            futures = [procs.submit(_decode_in_worker, batch.rows[i], encoders, batch.step) for i, encoders in items]
            for (i, encoders), fut in zip(items, futures, strict=True):
                cache.put(i, encoders, fut.result())

        self._job = (batch.step, self._thread.submit(run))

    def wait(self, step: int) -> float:
        """Wait for the prefetch of `step` (if one runs); the seconds waited."""
        if self._job is None or self._job[0] != step:
            return 0.0
        t = time.perf_counter()
        self._job[1].result()
        self._job = None
        return time.perf_counter() - t

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        if self._procs is not None:
            self._procs.shutdown(wait=True, cancel_futures=True)
