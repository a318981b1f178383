"""What a step trains on: global batches drawn from the seed and the step."""
