"""A seed from any parts (names, steps, ids): the same on every rank, in every process and Python (no hash())."""

from __future__ import annotations

import hashlib


def stable_seed(*parts: object) -> int:
    """A non-negative 63-bit seed of `parts` (what torch.Generator.manual_seed and numpy accept)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
