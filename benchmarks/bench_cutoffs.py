"""What each piece of the warps' cut-offs costs on this backend:
`python benchmarks/bench_cutoffs.py`.

Milliseconds per call (medians, after compilation), each piece compiled alone, over `R`
rows of `V` float32 logits (default (704, 128256): the target's and the draft's rows at
(B, G, V) = (64, 5, 128256)), with k = 50 and p = 0.9:

- the row maxima, and the sum of exponentials with them (the temperature's passes), on
  the float32 logits and on the same logits in bfloat16 (upcast inside the pass: the
  floor of the bfloat16 path);
- the maxima of blocks of 16, the 50 and the 1,024 largest of them by XLA's TopK, the
  search over them for the 50th, the 50 blocks at or above it by a prefix sum, and the
  gather of those blocks;
- the search for the 50th largest among the 800 candidates;
- `top_k_cut` (static k, with its normaliser) and `top_p_cutoff`, with their blocks taken
  either way: by TopK (other backends than the CPU; the CPU up to 64 blocks) and by the
  search and a prefix sum (the CPU beyond 64 blocks);
- with `--full-rows`, what a sort-based warp would run instead: XLA's TopK of 50 and of
  1,024 over whole rows, a sort and a cumulative sum of whole rows (slow on the CPU).
"""

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from eqx_specdec._warps import cutoffs


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks.bench_xla_cpu import _time  # noqa: E402


K, TOP_P, TEMPERATURE = 50, 0.9, 0.7


def _by(method, fn):
    """`fn` traced with `_top_blocks` taking its blocks by `method`."""

    def traced(x):
        chosen = cutoffs.blocks_by_top_k
        cutoffs.blocks_by_top_k = lambda k: method == "TopK"
        try:
            return fn(x)
        finally:
            cutoffs.blocks_by_top_k = chosen

    return traced


def pieces(rows, vocab, full_rows):
    """`(name, function, argument)` for each piece, over random rows."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, vocab), dtype=np.float32) * 3)
    blocks = x.reshape(rows, vocab // 16, 16)
    block_max = jnp.max(blocks, axis=-1)
    m = cutoffs.key_values(
        cutoffs.largest_reaching(cutoffs.order_keys(block_max), None, K), x.dtype
    )
    picks = cutoffs._blocks_at_or_above(block_max, m, K)
    candidates = jnp.take_along_axis(blocks, picks[..., None], axis=1)
    candidates = candidates.reshape(rows, -1)

    def normaliser(x):
        return cutoffs.log_normaliser(x / TEMPERATURE, cutoffs.row_max(x) / TEMPERATURE)

    def top_k(x):
        normalise = (TEMPERATURE, cutoffs.row_max(x) / TEMPERATURE)
        return cutoffs.top_k_cut(x, jnp.full((rows, 1), K), K, normalise)

    def top_p(x):
        return cutoffs.top_p_cutoff(x, TEMPERATURE, *normaliser(x), TOP_P)

    def upcast(fn):
        return lambda h: fn(h.astype(jnp.float32))

    half = x.astype(jnp.bfloat16)
    out = [
        ("row maxima", cutoffs.row_max, x),
        ("sum of exponentials, with the maxima", normaliser, x),
        # The floor of the bfloat16 target: the same passes reading half the bytes,
        # upcast inside the fused reduction.
        ("row maxima, bfloat16 logits", upcast(cutoffs.row_max), half),
        ("sum of exponentials, with the maxima, bfloat16", upcast(normaliser), half),
        ("block maxima", lambda x: jnp.max(x.reshape(rows, -1, 16), axis=-1), x),
        (f"TopK {K} of the block maxima", lambda b: jax.lax.top_k(b, K), block_max),
        ("TopK 1024 of the block maxima", lambda b: jax.lax.top_k(b, 1024), block_max),
        (
            f"search for the {K}th block maximum",
            lambda b: cutoffs.largest_reaching(cutoffs.order_keys(b), None, K),
            block_max,
        ),
        (
            f"{K} blocks at or above it, by a prefix sum",
            lambda b: cutoffs._blocks_at_or_above(b, m, K),
            block_max,
        ),
        (
            f"gather of {K} blocks",
            lambda x: jnp.take_along_axis(
                x.reshape(rows, -1, 16), picks[..., None], axis=1
            ),
            x,
        ),
        (
            f"search for the {K}th among {16 * K} candidates",
            lambda c: cutoffs.largest_reaching(cutoffs.order_keys(c), None, K),
            candidates,
        ),
    ]
    for method in ("TopK", "prefix sum"):
        out.append((f"top_k_cut {K}, blocks by {method}", _by(method, top_k), x))
        out.append((f"top_p_cutoff {TOP_P}, blocks by {method}", _by(method, top_p), x))
    if full_rows:
        out += [
            (f"TopK {K} of whole rows", lambda x: jax.lax.top_k(x, K)[0], x),
            ("TopK 1024 of whole rows", lambda x: jax.lax.top_k(x, 1024)[0], x),
            ("sort of whole rows", lambda x: jnp.sort(x, axis=-1), x),
            ("cumulative sum of whole rows", lambda x: jnp.cumsum(x, axis=-1), x),
        ]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", default="704,128256", help="'R,V'")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per piece")
    parser.add_argument(
        "--full-rows", action="store_true", help="sort-based pieces too"
    )
    args = parser.parse_args(argv)
    rows, vocab = (int(v) for v in args.rows.split(","))
    if vocab % 16 or vocab < 16 * 1024:
        parser.error("--rows: V must be a multiple of 16 and at least 16,384")
    print(f"JAX {jax.__version__} on {jax.default_backend()}, rows ({rows}, {vocab})\n")
    print("| piece | ms |")
    print("|---|---|")
    for name, fn, x in pieces(rows, vocab, args.full_rows):
        print(f"| {name} | {_time(fn, x, args.repeats) * 1e3:.3f} |", flush=True)


if __name__ == "__main__":
    main()
