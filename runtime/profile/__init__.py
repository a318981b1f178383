"""`orch profile` and `orch validate`: timing the cluster's calls, fitting them, checking a plan's predictions."""
