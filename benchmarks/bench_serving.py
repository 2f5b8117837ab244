"""The serving options' cost: `python benchmarks/bench_serving.py`.

Milliseconds per call (medians of interleaved repeats in a rotating order, each after
an untimed call of its own, after compiling) of the probabilities
and logits entry points with their default checks, without and with each serving option:
log-probabilities (and their top 5), a per-position mask (booleans, and packed bits), and
the history-dependent penalties (a history of 256 tokens). The first row of each entry point
is the default program, which no option changes.
"""

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es
from benchmarks.contract_calls import accept_logits


def _median_ms(fns: dict, repeats: int) -> dict:
    for fn in fns.values():
        jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    names = list(fns)
    for repeat in range(repeats):
        # The order rotates every repeat, and each timed call follows an untimed one of
        # its own, as in serving, where the same program runs step after step: a call
        # right after a heavier one (a mask reads every row) would otherwise pay for the
        # caches that call left behind.
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            jax.block_until_ready(fns[name]())
            start = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,5,32000", help="B,G,V")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    batch, gamma, vocab = (int(v) for v in args.shape.split(","))
    tokens, q, p, u, s = es.example_inputs(batch=batch, gamma=gamma, vocab=vocab)
    rng = np.random.default_rng(0)
    mask = rng.uniform(size=(batch, gamma + 1, vocab)) < 0.5
    mask[..., :1] = True
    words = -(-vocab // 32)
    padded = np.zeros((batch, gamma + 1, words * 32), bool)
    padded[..., :vocab] = mask
    bits = (
        (
            padded.reshape(batch, gamma + 1, words, 32).astype(np.uint64)
            << np.arange(32, dtype=np.uint64)
        )
        .sum(-1)
        .astype(np.uint32)
    )
    mask, bits = jnp.asarray(mask), jnp.asarray(bits)
    history = jnp.asarray(rng.integers(0, vocab, (batch, 256)), jnp.int32)
    logq, logp = jnp.log(q), jnp.log(p)
    probs = functools.partial(es.speculative_accept, tokens, q, p, u, s)
    warp = es.Warp(0.8, top_k=50)
    penalised = es.Warp(0.8, top_k=50, repetition_penalty=1.2, frequency_penalty=0.3)
    logits = functools.partial(accept_logits, tokens, logq, logp, u, s, draft_warp=warp)
    rows = {
        "probabilities: default": lambda: probs(),
        "probabilities: + log-probabilities": lambda: probs(logprobs=es.LogProbs()),
        "probabilities: + top-5 log-probabilities": lambda: probs(
            logprobs=es.LogProbs(top_k=5)
        ),
        "probabilities: + mask (booleans)": lambda: probs(allowed=mask),
        "probabilities: + mask (bits)": lambda: probs(allowed=bits),
        "logits, Warp(0.8, top_k=50): default": lambda: logits(target_warp=warp),
        "logits: + log-probabilities, raw too": lambda: logits(
            target_warp=warp, logprobs=es.LogProbs(raw=True)
        ),
        "logits: + mask (bits)": lambda: logits(target_warp=warp, allowed=bits),
        "logits: + penalties (history of 256)": lambda: logits(
            target_warp=penalised, draft_warp=penalised, history=history
        ),
    }
    ms = _median_ms(rows, args.repeats)
    print(f"JAX {jax.__version__} on {jax.default_backend()}; B, G, V = {args.shape}\n")
    print("| call | ms | / its entry point's default |")
    print("|---|---|---|")
    base = None
    for name, value in ms.items():
        if name.endswith("default"):
            base = value
        print(f"| {name} | {value:.2f} | {value / base:.2f}x |")


if __name__ == "__main__":
    main()
