"""The verification step on an accelerator, against a sampler written in the style of
vLLM's `tpu-inference` and against the memory roof: `python benchmarks/bench_tpu.py`.

For each shape (B, G, V) and path, every implementation runs inside one caller's
`jax.jit` (as a serving engine calls it), interleaved in one process (medians):

- ours: `verify` with checks off, as an engine runs it, and with the default checks;
- the baseline, as tpu-inference's rejection sampler computes the step (not its code):
  full-row softmax of every target and draft row, warped as the path asks and as a JAX
  user writes it (top-k by `jax.lax.top_k`, top-p by a sort; tpu-inference itself
  always applies both, by a binary search), accept uniforms drawn from a key, the first
  rejection by a cumulative product, the correction by the Gumbel-max trick over the
  whole residual row at every position, and argmax for greedy decoding;
- the roof: the input's bytes and the bytes the step must read (the draft tokens'
  entries, and one row of p and of q per sequence), over the bandwidth a jitted
  `jnp.sum` over 1 GiB reaches in the same run.

Paths: probabilities (sampled drafts); greedy with one-hot drafts (target logits);
logits at temperature 1; top-k 50; top-p 0.9 (each on logits, sampled drafts).
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import eqx_specdec as es
from benchmarks.bench import _read_bandwidth


SHAPES = [(64, 5, 128_256), (256, 8, 32_000), (16, 5, 32_000)]
PATHS = (
    "probabilities",
    "greedy, one-hot drafts",
    "temperature 1",
    "top-k 50",
    "top-p 0.9",
)
WARPS = {
    "temperature 1": es.Warp(),
    "top-k 50": es.Warp(top_k=50),
    "top-p 0.9": es.Warp(top_p=0.9),
}


def _warped_probs(logits, top_k=None, top_p=None):
    """The baseline's warp, the one the path asks for as a JAX user writes it: softmax;
    top-k by `jax.lax.top_k`'s k-th value; top-p by a sort and a cumulative sum;
    renormalised."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if top_k is not None:
        kth = jax.lax.top_k(probs, top_k)[0][..., -1:]
        probs = jnp.where(probs >= kth, probs, 0.0)
    if top_p is not None:
        ordered = jnp.sort(probs, axis=-1)[..., ::-1]
        cumulative = jnp.cumsum(ordered, axis=-1) / jnp.sum(probs, -1, keepdims=True)
        last = jnp.sum(cumulative < top_p, axis=-1, keepdims=True)
        probs = jnp.where(probs >= jnp.take_along_axis(ordered, last, -1), probs, 0.0)
    return probs / jnp.sum(probs, axis=-1, keepdims=True)


def baseline(path, tokens, draft, target, key):
    """One step in the style of tpu-inference's rejection sampler."""
    batch, gamma = tokens.shape
    if path == "greedy, one-hot drafts":
        best = jnp.argmax(target, axis=-1).astype(jnp.int32)
        ok = jnp.cumprod(tokens == best[:, :gamma], axis=1)
        n = jnp.sum(ok, axis=1)
        out = jnp.concatenate([tokens, best[:, -1:]], axis=1)
        position = jnp.arange(gamma + 1)[None]
        correction = jnp.take_along_axis(best, n[:, None], axis=1)
        out = jnp.where(
            position < n[:, None],
            out,
            jnp.where(position == n[:, None], correction, -1),
        )
        return n, out
    if path == "probabilities":
        p, q = target, draft
    else:
        top_k = 50 if path == "top-k 50" else None
        top_p = 0.9 if path == "top-p 0.9" else None
        p = _warped_probs(target, top_k, top_p)
        q = _warped_probs(draft, top_k, top_p)
    accept_key, noise_key = jax.random.split(key)
    u = jax.random.uniform(accept_key, (batch, gamma))
    p_x = jnp.take_along_axis(p[:, :gamma], tokens[..., None], axis=-1)[..., 0]
    q_x = jnp.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]
    ok = jnp.cumprod(u * q_x < p_x, axis=1)
    n = jnp.sum(ok, axis=1)
    residual = jnp.maximum(p[:, :gamma] - q, 0.0)
    residual = jnp.concatenate([residual, p[:, gamma:]], axis=1)  # the bonus row
    gumbel = jax.random.gumbel(noise_key, residual.shape)
    drawn = jnp.argmax(jnp.log(residual) + gumbel, axis=-1).astype(jnp.int32)
    correction = jnp.take_along_axis(drawn, n[:, None], axis=1)
    position = jnp.arange(gamma + 1)[None]
    out = jnp.concatenate([tokens, correction], axis=1)
    out = jnp.where(
        position < n[:, None], out, jnp.where(position == n[:, None], correction, -1)
    )
    return n, out


def ours(path, tokens, draft, target, key, checks):
    if path == "probabilities":
        t, d = es.Probabilities(target), es.Draft(tokens, es.Probabilities(draft))
    elif path == "greedy, one-hot drafts":
        greedy = es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler())
        out = es.verify(
            es.Logits(target),
            es.Draft(tokens),
            key,
            verifier=greedy,
            check_inputs=checks,
        )
        return out.num_accepted, out.tokens
    else:
        warp = WARPS[path]
        t, d = es.Logits(target, warp), es.Draft(tokens, es.Logits(draft, warp))
    out = es.verify(t, d, key, check_inputs=checks)
    return out.num_accepted, out.tokens


def _inputs(path, batch, gamma, vocab):
    keys = jax.random.split(jax.random.key(1), 4)
    target = 2 * jax.random.normal(keys[0], (batch, gamma + 1, vocab))
    draft = target[:, :gamma] + 0.7 * jax.random.normal(keys[1], (batch, gamma, vocab))
    tokens = jax.random.categorical(keys[2], draft).astype(jnp.int32)
    if path == "probabilities":
        target, draft = jax.nn.softmax(target, -1), jax.nn.softmax(draft, -1)
    if path == "greedy, one-hot drafts":
        draft = jnp.zeros((batch, gamma, 1))  # unused
    return tokens, draft, target, keys[3]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--shapes", default=None, help="'B,G,V;B,G,V'")
    parser.add_argument("--paths", default=None, help="comma-separated, of PATHS")
    args = parser.parse_args(argv)
    shapes = (
        SHAPES
        if args.shapes is None
        else [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    )
    bandwidth = 1e9 * _read_bandwidth(max(5, args.repeats // 5))
    print(
        f"JAX {jax.__version__} on {jax.default_backend()}; jnp.sum over 1 GiB: {bandwidth / 1e9:.0f} GB/s\n"
    )
    print(
        "| B, G, V | path | ours, checks off (ms) | ours, default checks (ms) | baseline (ms) | baseline / ours | ours / input bytes | ours / bytes it must read |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for batch, gamma, vocab in shapes:
        for path in PATHS if args.paths is None else args.paths.split(","):
            inputs = _inputs(path, batch, gamma, vocab)
            impls = {
                "off": jax.jit(lambda *a, path=path: ours(path, *a, "off")),
                "read": jax.jit(lambda *a, path=path: ours(path, *a, "read")),
                "baseline": jax.jit(lambda *a, path=path: baseline(path, *a)),
            }
            for impl in impls.values():
                jax.block_until_ready(impl(*inputs))
            times = {name: [] for name in impls}
            for _ in range(args.repeats):
                for name, impl in impls.items():
                    start = time.perf_counter()
                    jax.block_until_ready(impl(*inputs))
                    times[name].append(time.perf_counter() - start)
            ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            tokens, draft, target, _ = inputs
            input_bytes = sum(a.nbytes for a in (tokens, draft, target))
            rows = 2 if path != "greedy, one-hot drafts" else 1
            needed = batch * (rows * vocab * target.dtype.itemsize + 2 * gamma * 4)
            roof_ms = 1e3 * input_bytes / bandwidth
            needed_ms = 1e3 * needed / bandwidth
            print(
                f"| {batch}, {gamma}, {vocab} | {path} | {ms['off']:.2f} | {ms['read']:.2f} | "
                f"{ms['baseline']:.2f} | {ms['baseline'] / ms['off']:.2f}x | "
                f"{ms['off'] / roof_ms:.1f}x | {ms['off'] / needed_ms:.0f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
