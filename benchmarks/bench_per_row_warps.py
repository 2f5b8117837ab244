"""Per-row warp parameters on every path: `python benchmarks/bench_per_row_warps.py`.

One batch mixes rows of different settings (each row its own temperature, top-k, top-p
and min-p, as a serving batch of requests does). For each shape it runs `verify` on
`Logits` with those per-row warps, on the paths an engine takes (sampled drafts with the
default checks, one-hot drafts), with the backend's default mapping of rows (`vmap` on
an accelerator) and with `batching="map"`, and prints the first call's time (compiling
included: a program that never returns shows here), milliseconds per later call, and
whether the two mappings emit the same tokens (they must, bit for bit).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es


SHAPES = [(16, 5, 32_000), (64, 5, 128_256)]


def _inputs(batch, gamma, vocab):
    keys = jax.random.split(jax.random.key(0), 5)
    target = 2 * jax.random.normal(keys[0], (batch, gamma + 1, vocab))
    draft = target[:, :gamma] + 0.5 * jax.random.normal(keys[1], (batch, gamma, vocab))
    tokens = jax.random.categorical(keys[2], draft).astype(jnp.int32)
    uniforms = es.Uniforms(
        jax.random.uniform(keys[3], (batch, gamma)),
        jax.random.uniform(keys[4], (batch,)),
    )
    rows = jnp.linspace(0.5, 1.0, batch)
    warp = es.Warp(
        temperature=rows + 0.2,
        top_k=jnp.arange(batch) * 10 + 5,
        top_p=0.9 * rows,
        min_p=0.1 * rows,
    )
    return target, draft, tokens, uniforms, warp


def _timed(call, repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(call())
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        out = jax.block_until_ready(call())
    return first, (time.perf_counter() - start) / repeats, np.asarray(out.tokens)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"JAX {jax.__version__} on {jax.default_backend()}\n")
    print(
        "| B, G, V | path | first call (s) | ms per call | ms with batching=map | "
        "same tokens |"
    )
    print("|---|---|---|---|---|---|")
    mapped = es.Verifier(batching="map")
    for shape in SHAPES:
        target, draft, tokens, uniforms, warp = _inputs(*shape)
        paths = {
            "sampled drafts, default checks": es.Draft(tokens, es.Logits(draft, warp)),
            "one-hot drafts": es.Draft(tokens),
        }
        for name, drafted in paths.items():
            target_logits = es.Logits(target, warp)
            first, ms, ours = _timed(
                lambda: es.verify(target_logits, drafted, uniforms), args.repeats
            )
            _, ms_map, theirs = _timed(
                lambda: es.verify(target_logits, drafted, uniforms, verifier=mapped),
                args.repeats,
            )
            same = "yes" if np.array_equal(ours, theirs) else "NO"
            print(
                f"| {', '.join(map(str, shape))} | {name} | {first:.1f} | "
                f"{1e3 * ms:.2f} | {1e3 * ms_map:.2f} | {same} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
