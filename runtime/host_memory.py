"""Host memory of a CPU rank: freed blocks are kept for reuse, not handed back to the kernel.

A CPU rank allocates its activations (attention scores, MLP intermediates: tens of MiB each)
through glibc's malloc. By default glibc serves any block above its mmap threshold (dynamic, at
most 32 MiB) with a fresh `mmap` and unmaps it on free, and trims the heap's free top. Every such
block is then page-faulted and zeroed by the kernel on first touch, in every step: on the tiny
float64 benchmarks the ranks spent a fifth of their CPU time in the kernel, and a rank holding
several long samples paid it out of proportion (its per-sample cost stopped adding up, which is
what the dispatcher's model assumes). On a GPU the CUDA caching allocator does this job.

`keep_freed_memory` raises both thresholds, so that blocks up to 1 GiB come from the heap and
the heap keeps what it has grown to: a step reuses the pages of the step before, as a caching
allocator would. A rank's peak memory is unchanged; what it holds between steps is its peak. The
same effect as `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` in the environment, set from
inside the rank so that every entry point (local, Slurm, profile) gets it.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 30  # blocks below this come from the heap
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # free heap top kept up to this (mallopt takes an int)


def keep_freed_memory() -> bool:
    """Set this process's glibc malloc to reuse freed blocks (module docstring). False where the C
    library is not glibc (musl, macOS): nothing is changed there."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
