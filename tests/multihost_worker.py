"""One of two processes of `test_multihost.py`: a (2, 4) mesh over two processes with 4
CPU devices each, verified with `ShardedVerifier` after `jax.distributed.initialize`."""

import os
import re
import sys


process_id, port = int(sys.argv[1]), sys.argv[2]
# Four devices per process; the test suite's other flags (quick compilation) are kept.
_flags = re.sub(
    r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", "")
)
os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=4".strip()

import jax  # noqa: E402


jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import eqx_specdec as es  # noqa: E402


assert jax.device_count() == 8 and jax.local_device_count() == 4
mesh = jax.make_mesh((2, 4), ("batch", "vocab"))  # batch over the two processes
batch, gamma, vocab = 8, 3, 256
rng = np.random.default_rng(0)  # the same global arrays in both processes
p = rng.dirichlet(np.ones(vocab), size=(batch, gamma + 1)).astype(np.float32)
q = rng.dirichlet(np.ones(vocab), size=(batch, gamma)).astype(np.float32)
x = rng.integers(0, vocab, size=(batch, gamma)).astype(np.int32)
u = rng.random((batch, gamma)).astype(np.float32)
s = rng.random(batch).astype(np.float32)


def place(a):
    spec = [PartitionSpec("batch"), PartitionSpec("batch", None)]
    spec.append(PartitionSpec("batch", None, "vocab"))
    sharding = NamedSharding(mesh, spec[a.ndim - 1])
    # Each process supplies only its own shards, as a real multi-host job would.
    return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])


for name, verifier in [
    ("standard", es.Verifier()),
    ("block", es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter())),
]:
    sharded = es.ShardedVerifier(verifier, mesh, batch_axis="batch", vocab_axis="vocab")
    out = es.speculative_accept(*map(place, (x, q, p, u, s)), verifier=sharded)
    tokens = multihost_utils.process_allgather(out["tokens"], tiled=True)
    expected = es.speculative_accept(x, q, p, u, s, verifier=verifier)["tokens"]
    print(f"{name} equal: {np.array_equal(tokens, np.asarray(expected))}", flush=True)

bad = p.copy()
bad[5, 2, 200] = np.nan  # row 5 lives on process 1, vocabulary shard 3
try:
    es.speculative_accept(
        *map(place, (x, q, bad, u, s)), verifier=sharded, check_inputs="all"
    )
    print("bad input: no error", flush=True)
except RuntimeError as error:
    print(f"bad input: {error}", flush=True)
