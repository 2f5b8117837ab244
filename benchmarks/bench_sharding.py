"""Communication of sharded verification: bytes that cross devices per step, read from the
compiled program, for `ShardedVerifier` against the naive scheme that all-gathers the rows
of p and q over the vocabulary and then verifies. Runs on 8 host CPU devices.

    python benchmarks/bench_sharding.py [--batch 64 --gamma 5 --vocab 128256]
"""

import argparse
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from eqx_specdec import ShardedVerifier, speculative_accept, Verifier


_COLLECTIVES = "all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute"


_HLO_DTYPES = {
    "f16": "f2",
    "bf16": "f2",
    "f32": "f4",
    "f64": "f8",
    "s32": "i4",
    "u32": "u4",
    "s64": "i8",
    "u64": "u8",
    "pred": "b1",
    "s8": "i1",
    "u8": "u1",
}


def _group_size(line: str) -> int:
    """The number of devices in each replica group of an HLO collective."""
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
    if iota:
        return int(iota.group(2))
    listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if listed:
        return len(listed.group(1).split(","))
    pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
    return 2 if pairs else 1


def collectives(compiled_text: str) -> list[tuple[str, tuple[int, ...], int]]:
    """Every cross-device collective of a compiled (per-device) HLO module, as
    `(op, result shape, bytes received per device)`.

    Bytes received follow the ring algorithms: an all-reduce of $N$ bytes over $D$
    devices receives $2N(D-1)/D$; an all-gather with an $N$-byte result receives
    $N(D-1)/D$; other collectives $N$.
    """
    found = []
    for line in compiled_text.splitlines():
        match = re.search(rf"=\s*(.*?)\s+({_COLLECTIVES})(-start)?\(", line)
        if not match:
            continue
        op, devices = match.group(2), _group_size(line)
        for dtype, dims in re.findall(r"([a-z]+\d*)\[([\d,]*)\]", match.group(1)):
            shape = tuple(int(d) for d in dims.split(",") if d)
            size = int(np.prod(shape)) * np.dtype(_HLO_DTYPES.get(dtype, "f4")).itemsize
            if op == "all-reduce":
                received = 2 * size * (devices - 1) / devices
            elif op == "all-gather":
                received = size * (devices - 1) / devices
            else:
                received = size
            found.append((op, shape, int(received)))
    return found


def gathering_verifier(mesh, batch_axis, vocab_axis, verifier=Verifier()):
    """The naive scheme: all-gather the rows of p and q over `vocab_axis`, then run the
    single-device verifier on each device's rows. Returns a function of
    `(draft_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms)`."""
    auto = Mesh(
        mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * mesh.devices.ndim
    )
    rows = PartitionSpec(batch_axis, None, vocab_axis)

    def body(x, q, p, u, s):
        q = jax.lax.all_gather(q, vocab_axis, axis=2, tiled=True)
        p = jax.lax.all_gather(p, vocab_axis, axis=2, tiled=True)
        return verifier(x, q, p, u, s)

    return jax.shard_map(
        body,
        mesh=auto,
        in_specs=(
            PartitionSpec(batch_axis, None),
            rows,
            rows,
            PartitionSpec(batch_axis, None),
            PartitionSpec(batch_axis),
        ),
        out_specs={
            "num_accepted": PartitionSpec(batch_axis),
            "tokens": PartitionSpec(batch_axis, None),
        },
        check_vma=False,
    )


def _inputs(batch, gamma, vocab, mesh, batch_axis, vocab_axis):
    key = jax.random.key(0)
    kp, kq, kx, ku, ks = jax.random.split(key, 5)
    p = jax.nn.softmax(2 * jax.random.normal(kp, (batch, gamma + 1, vocab)), -1)
    q = jax.nn.softmax(2 * jax.random.normal(kq, (batch, gamma, vocab)), -1)
    x = jax.random.categorical(kx, jnp.log(q)).astype(jnp.int32)
    u = jax.random.uniform(ku, (batch, gamma))
    s = jax.random.uniform(ks, (batch,))
    specs = {
        3: PartitionSpec(batch_axis, None, vocab_axis),
        2: PartitionSpec(batch_axis, None),
        1: PartitionSpec(batch_axis),
    }
    return [
        jax.device_put(a, NamedSharding(mesh, specs[a.ndim])) for a in (x, q, p, u, s)
    ]


def _median_us(functions, args, repeats):
    times = [[] for _ in functions]
    for _ in range(repeats):  # interleaved, so that both see the same machine load
        for i, f in enumerate(functions):
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[i].append(time.perf_counter() - start)
    return [1e6 * float(np.median(t)) for t in times]


def _format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench_sharding.py",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if jax.device_count() < 8:
        flag = "--xla_force_host_platform_device_count=8"
        if flag in os.environ.get("XLA_FLAGS", ""):
            raise SystemExit("needs 8 devices, and JAX sees fewer with XLA_FLAGS set")
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        os.execv(
            sys.executable,
            [sys.executable, os.path.abspath(__file__)] + (argv or sys.argv[1:]),
        )

    batch, gamma, vocab = args.batch, args.gamma, args.vocab
    row_bytes = batch * (2 * gamma + 1) * vocab * 4
    print(
        f"B, G, V = {batch}, {gamma}, {vocab}; float32; {jax.device_count()} "
        f"{jax.devices()[0].platform.upper()} devices; p and q hold "
        f"{_format_bytes(row_bytes)}.\n"
    )
    print(
        "| mesh (batch x vocab) | bytes received per device per step, ours | naive "
        "(all-gather rows) | naive / ours | largest array crossing devices, ours | "
        "us per step, ours | us, naive |"
    )
    print("|---|---|---|---|---|---|---|")
    for shape, names, batch_axis, vocab_axis in [
        ((8,), ("vocab",), None, "vocab"),
        ((2, 4), ("batch", "vocab"), "batch", "vocab"),
        ((4, 2), ("batch", "vocab"), "batch", "vocab"),
        ((8,), ("batch",), "batch", None),
    ]:
        mesh = jax.make_mesh(shape, names)
        inputs = _inputs(batch, gamma, vocab, mesh, batch_axis, vocab_axis)
        sharded = ShardedVerifier(Verifier(), mesh, batch_axis, vocab_axis)
        ours = jax.jit(
            lambda *a, v=sharded: speculative_accept(*a, verifier=v, check_inputs="off")
        )
        ours_found = collectives(ours.lower(*inputs).compile().as_text())
        ours_bytes = sum(c[2] for c in ours_found)
        largest = max((c[1] for c in ours_found), key=np.prod, default=())
        label = " x ".join(f"{n} {a}" for n, a in zip(shape, names))
        if vocab_axis is None:
            print(
                f"| {label} | {_format_bytes(ours_bytes)} | {_format_bytes(ours_bytes)} | "
                f"1x (nothing to gather) | {largest or '-'} | "
                f"{_median_us([ours], inputs, args.repeats)[0]:.0f} | - |"
            )
            continue
        naive = jax.jit(gathering_verifier(mesh, batch_axis, vocab_axis))
        naive_bytes = sum(
            c[2] for c in collectives(naive.lower(*inputs).compile().as_text())
        )
        same = np.array_equal(ours(*inputs)["tokens"], naive(*inputs)["tokens"])
        t_ours, t_naive = _median_us([ours, naive], inputs, args.repeats)
        print(
            f"| {label} | {_format_bytes(ours_bytes)} | {_format_bytes(naive_bytes)} | "
            f"{naive_bytes / max(ours_bytes, 1):,.0f}x | {largest} | {t_ours:.0f} | "
            f"{t_naive:.0f} |" + ("" if same else " (tokens differ!)")
        )
    print(
        "\nBytes received per device follow the ring algorithms (all-reduce 2N(D-1)/D, "
        "all-gather N(D-1)/D) over the collectives of the compiled program. Host CPU "
        "devices share this machine's cores and memory: the times compare the two "
        "schemes, not a real interconnect."
    )


if __name__ == "__main__":
    main()
