"""Starting ranks: one rank-start path, the local and Slurm launchers, job records and post-mortems."""
