"""The verification step on an accelerator, against a sampler written in the style of
vLLM's `tpu-inference` and against the memory roof: `python benchmarks/bench_tpu.py`.

For each shape (B, G, V) and path, every implementation runs inside one caller's
`jax.jit` (as a serving engine calls it), interleaved in one process (medians), timed two
ways: a call (the dispatch and the wait for the result included: on a TPU v5e about
0.5 ms, whatever the work), and a step inside a program (each step's inputs tied to its
iteration, so that nothing is hoisted out of the loop), as a step inside an engine's own
program costs: the time one more step adds, the difference between programs of `--loop`
and of `--loop // 5` steps over the difference in steps, which leaves out the program's
one-off work (on a TPU v5e its copies of the inputs, 2.5 ms at (256, 8, 32000) by the
profiler: 0.25 ms a step in a program of 10). On the CPU read
the calls: there the loop's rewrite of its carried inputs distorts the steps (greedy
verification measured 84 ms a step against 31 ms a call at (64, 5, 128256)):

- ours: `verify` with checks off, as an engine runs it, and with the default checks;
- the baseline, as tpu-inference's rejection sampler computes the step (not its code):
  full-row softmax of every target and draft row, warped as the path asks and as a JAX
  user writes it (top-k by `jax.lax.top_k`, top-p by a sort; tpu-inference itself
  always applies both, by a binary search), accept uniforms drawn from a key, the first
  rejection by a cumulative product, the correction by the Gumbel-max trick over the
  whole residual row at every position, and argmax for greedy decoding;
- the straightforward JAX version, as a JAX user writes the step from the paper (the
  same warps; the correction by `jax.random.categorical` over row n, gathered);
- on the TPU, for probabilities, ours with `batching="vmap"` (rows n read by XLA's
  gather rather than the kernel), printed beneath the row;
- the roof: the input's bytes, and the bytes the step must read, over the bandwidth a
  jitted `jnp.sum` over 1 GiB reaches in the same run. What a step must read depends on
  its outcome, n accepted of G (the mean over the batch is used): on probabilities, the
  draft tokens' entries and rows n of p and q; on logits, the normalisers of rows 0 to
  n of the target and of the draft up to its row n (the test reads the draft tokens'
  log-probabilities up to the first rejection), the correction reading rows n again;
  greedy, the target's rows 0 to n (each row's argmax up to the first mismatch).

Paths: probabilities (sampled drafts); greedy with one-hot drafts (target logits);
logits at temperature 1, with sampled and with one-hot drafts; top-k 50; top-p 0.9;
min-p 0.05 (each on logits, sampled drafts).
"""

import argparse
import math
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
    "temperature 1, one-hot drafts",
    "top-k 50",
    "top-p 0.9",
    "min-p 0.05",
)
WARPS = {
    "temperature 1": es.Warp(),
    "temperature 1, one-hot drafts": es.Warp(),
    "top-k 50": es.Warp(top_k=50),
    "top-p 0.9": es.Warp(top_p=0.9),
    "min-p 0.05": es.Warp(min_p=0.05),
}
ONE_HOT = ("greedy, one-hot drafts", "temperature 1, one-hot drafts")


def _warped_probs(logits, top_k=None, top_p=None, min_p=None):
    """The baseline's warp, the one the path asks for as a JAX user writes it: softmax;
    top-k by `jax.lax.top_k`'s k-th value; top-p by a sort and a cumulative sum; min-p
    against the row's largest probability; renormalised."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if top_k is not None:
        kth = jax.lax.top_k(probs, top_k)[0][..., -1:]
        probs = jnp.where(probs >= kth, probs, 0.0)
    if top_p is not None:
        ordered = jnp.sort(probs, axis=-1)[..., ::-1]
        cumulative = jnp.cumsum(ordered, axis=-1) / jnp.sum(probs, -1, keepdims=True)
        last = jnp.sum(cumulative < top_p, axis=-1, keepdims=True)
        probs = jnp.where(probs >= jnp.take_along_axis(ordered, last, -1), probs, 0.0)
    if min_p is not None:
        largest = jnp.max(probs, axis=-1, keepdims=True)
        probs = jnp.where(probs >= min_p * largest, probs, 0.0)
    return probs / jnp.sum(probs, axis=-1, keepdims=True)


def _assembled(tokens, n, correction):
    """Accepted tokens, then the correction, then -1."""
    gamma = tokens.shape[1]
    position = jnp.arange(gamma + 1)[None]
    out = jnp.concatenate([tokens, correction[:, None]], axis=1)
    return jnp.where(
        position < n[:, None],
        out,
        jnp.where(position == n[:, None], correction[:, None], -1),
    )


def baseline(path, tokens, draft, target, key):
    """One step in the style of tpu-inference's rejection sampler."""
    batch, gamma = tokens.shape
    if path == "greedy, one-hot drafts":
        best = jnp.argmax(target, axis=-1).astype(jnp.int32)
        n = jnp.sum(jnp.cumprod(tokens == best[:, :gamma], axis=1), axis=1)
        correction = jnp.take_along_axis(best, n[:, None], axis=1)[:, 0]
        return n, _assembled(tokens, n, correction)
    if path == "probabilities":
        p, q = target, draft
    else:
        p = _warped_probs(
            target,
            50 if path == "top-k 50" else None,
            0.9 if path == "top-p 0.9" else None,
            0.05 if path == "min-p 0.05" else None,
        )
        q = (
            None
            if path in ONE_HOT
            else _warped_probs(
                draft,
                50 if path == "top-k 50" else None,
                0.9 if path == "top-p 0.9" else None,
                0.05 if path == "min-p 0.05" else None,
            )
        )
    accept_key, noise_key = jax.random.split(key)
    u = jax.random.uniform(accept_key, (batch, gamma))
    p_x = jnp.take_along_axis(p[:, :gamma], tokens[..., None], axis=-1)[..., 0]
    if q is None:  # one-hot drafts: q(x) = 1, and the residual is p without x
        n = jnp.sum(jnp.cumprod(u < p_x, axis=1), axis=1)
        ids = jnp.arange(p.shape[-1])[None, None]
        residual = jnp.where(ids == tokens[..., None], 0.0, p[:, :gamma])
    else:
        q_x = jnp.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]
        n = jnp.sum(jnp.cumprod(u * q_x < p_x, axis=1), axis=1)
        residual = jnp.maximum(p[:, :gamma] - q, 0.0)
    residual = jnp.concatenate([residual, p[:, gamma:]], axis=1)  # the bonus row
    gumbel = jax.random.gumbel(noise_key, residual.shape)
    drawn = jnp.argmax(jnp.log(residual) + gumbel, axis=-1).astype(jnp.int32)
    correction = jnp.take_along_axis(drawn, n[:, None], axis=1)[:, 0]
    return n, _assembled(tokens, n, correction)


def straightforward(path, tokens, draft, target, key):
    """The step as a JAX user writes it from the paper: the path's warp (as the
    baseline's), the ratio test on the draft tokens' probabilities, the first rejection
    by a cumulative product, and the correction drawn by `jax.random.categorical` from
    the residual of row n alone, gathered by `take_along_axis` (argmax for greedy)."""
    if path == "greedy, one-hot drafts":
        return baseline(path, tokens, draft, target, key)
    batch, gamma = tokens.shape
    if path == "probabilities":
        p, q = target, draft
    else:
        cut = dict(
            top_k=50 if path == "top-k 50" else None,
            top_p=0.9 if path == "top-p 0.9" else None,
            min_p=0.05 if path == "min-p 0.05" else None,
        )
        p = _warped_probs(target, **cut)
        q = None if path in ONE_HOT else _warped_probs(draft, **cut)
    accept_key, sample_key = jax.random.split(key)
    u = jax.random.uniform(accept_key, (batch, gamma))
    p_x = jnp.take_along_axis(p[:, :gamma], tokens[..., None], axis=-1)[..., 0]
    q_x = (
        jnp.ones_like(p_x)
        if q is None
        else jnp.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]
    )
    n = jnp.sum(jnp.cumprod(u * q_x < p_x, axis=1), axis=1)
    p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]
    rejected_at = jnp.minimum(n, gamma - 1)
    if q is None:
        x_n = jnp.take_along_axis(tokens, rejected_at[:, None], axis=1)
        q_n = (jnp.arange(p.shape[-1])[None] == x_n).astype(p.dtype)
    else:
        q_n = jnp.take_along_axis(q, rejected_at[:, None, None], axis=1)[:, 0]
    residual = jnp.maximum(p_n - q_n, 0.0)
    weights = jnp.where((n < gamma)[:, None], residual, p_n)
    correction = jax.random.categorical(sample_key, jnp.log(weights), axis=-1)
    return n, _assembled(tokens, n, correction.astype(jnp.int32))


def ours(path, tokens, draft, target, key, checks, batching="auto"):
    if path == "probabilities":
        t, d = es.Probabilities(target), es.Draft(tokens, es.Probabilities(draft))
        verifier = es.Verifier(batching=batching)
        out = es.verify(t, d, key, verifier=verifier, check_inputs=checks)
    elif path == "greedy, one-hot drafts":
        out = es.verify(
            es.Logits(target),
            es.Draft(tokens),
            key,
            verifier=es.Verifier(es.GreedyRatioTest()),
            check_inputs=checks,
        )
    else:
        warp = WARPS[path]
        t = es.Logits(target, warp)
        d = (
            es.Draft(tokens)
            if path in ONE_HOT
            else es.Draft(tokens, es.Logits(draft, warp))
        )
        out = es.verify(t, d, key, check_inputs=checks)
    return out.num_accepted, out.tokens


def _inputs(path, batch, gamma, vocab):
    keys = jax.random.split(jax.random.key(1), 4)
    target = 2 * jax.random.normal(keys[0], (batch, gamma + 1, vocab))
    draft = target[:, :gamma] + 0.7 * jax.random.normal(keys[1], (batch, gamma, vocab))
    tokens = jax.random.categorical(keys[2], draft).astype(jnp.int32)
    if path == "probabilities":
        target, draft = jax.nn.softmax(target, -1), jax.nn.softmax(draft, -1)
    if path == "greedy, one-hot drafts":  # a draft decoding greedily
        tokens = jnp.argmax(draft, axis=-1).astype(jnp.int32)
    if path in ONE_HOT:
        draft = jnp.zeros((batch, gamma, 1))  # unused
    return tokens, draft, target, keys[3]


def _in_a_program(step, loop):
    """`step` run `loop` times inside one program. The inputs are the loop's carry, and
    each iteration rewrites one entry of each float input with its own value behind a
    test of the running total of the outputs (which the compiler cannot decide), so
    that no step's work is hoisted out of the loop or shared with another step (an
    optimisation barrier did not stop XLA TPU from hoisting). The inputs are donated
    and returned (`main` passes fresh copies to each run); even so the profiler shows
    each program copying its inputs once (2.5 ms at (256, 8, 32000) on a TPU v5e),
    which `main` leaves out by timing two programs of different lengths."""

    def run(*inputs):
        def body(i, carry):
            inputs, total = carry
            first = (0,) * 3

            def touched(a):
                if not jnp.issubdtype(a.dtype, jnp.floating) or a.ndim != 3:
                    return a
                return a.at[first].set(jnp.where(total == -7, 0, a[first]))

            inputs = tuple(touched(a) for a in inputs)
            outputs = step(*inputs)
            total = total + sum(jnp.sum(o) for o in jax.tree.leaves(outputs))
            return inputs, total

        inputs, total = jax.lax.fori_loop(0, loop, body, (inputs, jnp.int32(0)))
        return total, inputs

    return jax.jit(run, donate_argnums=(0, 1, 2))  # tokens, draft, target


def _must_read(path, batch, gamma, vocab, n, itemsize):
    """The bytes a step with `n` accepted (mean over the batch) must read (see the
    module's docstring)."""
    row = vocab * itemsize
    entries = 2 * gamma * itemsize
    target_rows = n + 1 if path != "probabilities" else 1
    if path == "probabilities":
        draft_rows = float(n < gamma)
    elif path in ONE_HOT:
        draft_rows = 0.0
    else:
        draft_rows = min(n + 1, gamma)
    return batch * (entries + (target_rows + draft_rows) * row)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument(
        "--loop", type=int, default=50, help="steps in the longer program"
    )
    parser.add_argument(
        "--no-calls", action="store_true", help="time steps in a program only"
    )
    parser.add_argument("--shapes", default=None, help="'B,G,V;B,G,V'")
    parser.add_argument("--paths", default=None, help="semicolon-separated, of PATHS")
    args = parser.parse_args(argv)
    short = max(1, args.loop // 5)
    shapes = (
        SHAPES
        if args.shapes is None
        else [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    )
    bandwidth = 1e9 * _read_bandwidth(max(5, args.repeats // 5))
    print(
        f"JAX {jax.__version__} on {jax.default_backend()}; jnp.sum over 1 GiB: "
        f"{bandwidth / 1e9:.0f} GB/s; a step (programs of {args.loop} and {short} "
        "steps), and a call (dispatch included), in ms; ratios of steps\n"
    )
    print(
        "| B, G, V | path | mean n | ours, checks off: step / call | default checks: "
        "step / call | baseline: step / call | straightforward JAX: step / call | "
        "baseline / ours | JAX / ours | ours / input bytes | ours / bytes it must "
        "read |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for batch, gamma, vocab in shapes:
        for path in PATHS if args.paths is None else args.paths.split(";"):
            inputs = _inputs(path, batch, gamma, vocab)
            steps = {
                "off": lambda *a, path=path: ours(path, *a, "off"),
                "read": lambda *a, path=path: ours(path, *a, "read"),
                "baseline": lambda *a, path=path: baseline(path, *a),
                "jax": lambda *a, path=path: straightforward(path, *a),
            }
            if path == "probabilities" and jax.default_backend() == "tpu":
                # The kernel's effect: rows n read by vmap's gather instead.
                steps["vmap"] = lambda *a: ours("probabilities", *a, "off", "vmap")
            impls = {}
            for name, step in steps.items():
                impls[name, "step"] = _in_a_program(step, args.loop)
                impls[name, "short"] = _in_a_program(step, short)
                if not args.no_calls:
                    impls[name, "call"] = jax.jit(step)

            def fresh():  # the programs consume their inputs: copies, made untimed
                return jax.block_until_ready([jnp.copy(a) for a in inputs[:3]])

            for impl in impls.values():
                jax.block_until_ready(impl(*fresh(), inputs[3]))
            times = {name: [] for name in impls}
            for _ in range(args.repeats):
                for name, impl in impls.items():
                    copies = fresh()
                    start = time.perf_counter()
                    jax.block_until_ready(impl(*copies, inputs[3]))
                    times[name].append(time.perf_counter() - start)
            ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            for name in steps:  # the time one more step adds
                long, brief = ms[name, "step"], ms.pop((name, "short"))
                ms[name, "step"] = (long - brief) / (args.loop - short)
            for name in ("off", "read", "baseline", "jax", "vmap"):
                ms.setdefault((name, "call"), float("nan"))
                ms.setdefault((name, "step"), float("nan"))
            tokens, draft, target, _ = inputs
            n = float(jnp.mean(ours(path, *inputs, "off")[0]))
            input_bytes = sum(a.nbytes for a in (tokens, draft, target))
            needed = _must_read(path, batch, gamma, vocab, n, target.dtype.itemsize)
            ours_ms = ms["off", "step"]
            print(
                f"| {batch}, {gamma}, {vocab} | {path} | {n:.2f} | "
                f"{ours_ms:.3f} / {ms['off', 'call']:.2f} | "
                f"{ms['read', 'step']:.3f} / {ms['read', 'call']:.2f} | "
                f"{ms['baseline', 'step']:.3f} / {ms['baseline', 'call']:.2f} | "
                f"{ms['jax', 'step']:.3f} / {ms['jax', 'call']:.2f} | "
                f"{ms['baseline', 'step'] / ours_ms:.2f}x | "
                f"{ms['jax', 'step'] / ours_ms:.2f}x | "
                f"{ours_ms / (1e3 * input_bytes / bandwidth):.1f}x | "
                f"{ours_ms / (1e3 * needed / bandwidth):.1f}x |",
                flush=True,
            )
            if not math.isnan(ms["vmap", "step"]):
                print(
                    f"<!-- rows n by vmap's gather, checks off: "
                    f"{ms['vmap', 'step']:.3f} ms a step, "
                    f"{ms['vmap', 'step'] / (1e3 * needed / bandwidth):.1f}x the bytes "
                    "it must read -->",
                    flush=True,
                )


if __name__ == "__main__":
    main()
