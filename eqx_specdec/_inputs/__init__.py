"""What a step takes and what its checks find: the typed inputs, the run-time checks and their results, masks and requested log-probabilities, example inputs."""
