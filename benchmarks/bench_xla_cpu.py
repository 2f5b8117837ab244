"""What XLA CPU does with the logits path's passes: `python benchmarks/bench_xla_cpu.py`.

The measurements behind the choices the Performance page explains, each side by side in
one run (medians, after compilation), over the target and draft rows of (B, G, V)
= (64, 5, 128256) by default (`--shape`; V a multiple of 16, at least 800):

- a fused sum of exponentials with one output per row, over every row at once against
  one sequence's rows at a time under `jax.lax.map` (nanoseconds an entry);
- XLA's TopK of 50 over one sequence's block maxima at a time, alone, beside a reader of
  the block maxima (which makes XLA lower it to a sort), and behind an optimisation
  barrier with that reader;
- bfloat16 logits: the row maxima and the sum of exponentials on the float32 upcast,
  one sequence at a time, against the same on float32 logits.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def _time(fn, x, repeats):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sum_exp(rows):
    return jnp.log(jnp.sum(jnp.exp(rows.astype(jnp.float32) / 0.7 - 3.0), axis=-1))


def _per_sequence(fn):
    return lambda x: jax.lax.map(fn, x)


def _block_max(rows):
    return jnp.max(rows.reshape(rows.shape[:-1] + (-1, 16)), axis=-1)


def _top_k(rows):
    return jax.lax.top_k(_block_max(rows), 50)[1]


def _top_k_read(rows):
    block_max = _block_max(rows)
    values, picks = jax.lax.top_k(block_max, 50)
    return picks, jnp.sum(block_max >= values[..., -1:], axis=-1)


def _top_k_barrier(rows):
    block_max = _block_max(rows)
    values, picks = jax.lax.optimization_barrier(jax.lax.top_k(block_max, 50))
    return picks, jnp.sum(block_max >= values[..., -1:], axis=-1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,5,128256", help="B,G,V")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls each")
    args = parser.parse_args(argv)
    batch, gamma, vocab = (int(v) for v in args.shape.split(","))
    repeats = args.repeats
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 2 * gamma + 1, vocab), dtype=np.float32) * 3
    x32, x16 = jnp.asarray(x), jnp.asarray(x, jnp.bfloat16)
    entries = x.size
    print(f"JAX {jax.__version__} on {jax.default_backend()}; rows {x.shape}\n")

    whole = _time(_sum_exp, x32, repeats)
    each = _time(_per_sequence(_sum_exp), x32, repeats)
    print("| sum of exponentials | ns an entry |")
    print("|---|---|")
    print(f"| every row at once | {whole * 1e9 / entries:.2f} |")
    print(f"| one sequence's rows at a time | {each * 1e9 / entries:.2f} |")
    print()

    print("| TopK 50 over each sequence's block maxima | ms |")
    print("|---|---|")
    for name, fn in [
        ("alone", _top_k),
        ("with another reader of the block maxima", _top_k_read),
        ("the same, behind a barrier", _top_k_barrier),
    ]:
        print(f"| {name} | {_time(_per_sequence(fn), x32, repeats) * 1e3:.1f} |")
    print()

    print("| one sequence at a time | float32 logits (ms) | bfloat16 logits (ms) |")
    print("|---|---|---|")
    for name, fn in [
        ("row maxima", lambda r: jnp.max(r, axis=-1)),
        ("sum of exponentials of the upcast", _sum_exp),
    ]:
        wide = _time(_per_sequence(fn), x32, repeats)
        narrow = _time(_per_sequence(fn), x16, repeats)
        print(f"| {name} | {wide * 1e3:.1f} | {narrow * 1e3:.1f} |")


if __name__ == "__main__":
    main()
