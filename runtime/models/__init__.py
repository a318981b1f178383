"""The modules a plan trains: orch's reference transformer, or a user's factory."""
