"""The two schedules of one step: three phases (homogeneous, colocated) and the graph-aware 1F1B (disaggregated)."""
