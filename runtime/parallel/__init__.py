"""Parallelism applied to modules: grids, TP, CP, EP, pipeline stages, and the moves between layouts."""
