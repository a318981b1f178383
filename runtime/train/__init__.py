"""Training: the run configuration, one step of a plan, its schedules, and the loop every launcher runs."""
