"""What differs between XLA's backends, in one place: how a verifier maps its row over
the batch, and the few layout choices each backend's compiler rewards (measured in
`benchmarks/bench_xla_cpu.py` and `benchmarks/results-tpu.md`)."""
