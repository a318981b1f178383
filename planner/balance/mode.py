"""The post-balancing modes: the one definition the CLI, the dispatcher and the runtime share (no imports)."""

from enum import StrEnum


class Mode(StrEnum):
    ORCH = "orch"  # topology-first post-balancing (orch_unpadded.py, orch_padded.py)
    PAPER = "paper"  # balanced buckets, then an OR-Tools assignment of buckets to ranks (paper.py)
    LPT = "lpt"  # plain largest-first greedy, bucket k on rank k (greedy.py)
    NONE = "none"  # every sample stays where DP sampling put it
