"""Speculative decoding in wall-clock time: `python benchmarks/bench_decoding.py`.

Decodes with the built-in transformer target (`eqx_specdec.demo.builtin_transformers`: three
layers of width 320, a key-value cache) and, as drafts, the built-in character n-gram
models and the built-in small transformer (one layer of width 64, cached), against plain
autoregressive decoding of the same target with the same cache, the runs interleaved.
Prints tokens per second, the measured speed-up, what a cost model predicts from the
models' per-call times alone (`eqx_specdec.evaluation.Speedup.predicted_speedup`) and the tokens per
target call. The standard rule, sampled drafts, the built-in prompts.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es
from eqx_specdec._decoding.speedup import measure_speedup, speedup_table
from eqx_specdec._inputs.checks import invalid_distributions, model_problems


def prompts(batch: int):
    rows = [
        es.demo.encode(es.demo.BUILTIN_PROMPTS[i % len(es.demo.BUILTIN_PROMPTS)])
        for i in range(batch)
    ]
    tokens = np.zeros((batch, max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    return tokens, np.asarray([len(r) for r in rows], np.int32)


def drafts():
    draft_transformer, _ = es.demo.builtin_transformers()
    bigram, fourgram = es.demo.builtin_models(2, 4)
    _, trigram = es.demo.builtin_models(2, 3)
    return {
        "3-gram": (trigram, "probs"),
        "4-gram": (fourgram, "probs"),
        "2-gram": (bigram, "probs"),
        "transformer, 1 layer of 64": (draft_transformer, "logits"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--gamma", type=int, nargs="+", default=[4])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    _, target = es.demo.builtin_transformers()
    print(f"JAX {jax.__version__} on {jax.default_backend()}")
    for batch in args.batch:
        tokens, lengths = prompts(batch)
        for gamma in args.gamma:
            rows = {}
            for name, (draft, outputs) in drafts().items():
                rows[name] = measure_speedup(
                    draft,
                    target,
                    tokens,
                    lengths,
                    args.tokens,
                    jax.random.key(0),
                    proposal=es.Chain(gamma),
                    outputs=(outputs, "logits"),
                    repeats=args.repeats,
                )
            print(
                f"\nB = {batch} rows, G = {gamma}, {args.tokens} new tokens per row "
                f"(medians of {args.repeats} interleaved runs):\n"
            )
            print(speedup_table(rows))
            print(row_check_cost(rows, batch, gamma))


def row_check_cost(rows: dict, batch: int, gamma: int) -> str:
    """What the loop's check of the models' rows costs per step (every step checks the
    target's G + 1 rows and the draft's G rows of each sequence: a NaN, an infinity, a
    negative entry or a sum off 1 stops the row), timed alone on rows of the step's
    shapes, against the measured step: an upper bound, since in the loop XLA fuses the
    check with the code that reads the rows anyway."""
    vocab = len(es.demo.VOCABULARY)
    key_p, key_q = jax.random.split(jax.random.key(1))
    p = jax.nn.softmax(jax.random.normal(key_p, (batch, gamma + 1, vocab)), -1)
    q = jax.nn.softmax(jax.random.normal(key_q, (batch, gamma, vocab)), -1)
    active = jnp.ones((batch,), bool)
    check = jax.jit(
        lambda p, q: [
            problem.flags
            for problem in model_problems(
                (invalid_distributions(q), invalid_distributions(p)), active
            )
        ]
    )
    jax.block_until_ready(check(p, q))
    times = []
    for _ in range(200):
        start = time.perf_counter()
        jax.block_until_ready(check(p, q))
        times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    step = min(r.speculative_seconds / r.steps for r in rows.values())
    return (
        f"\nThe loop's check of the models' rows, timed alone: {seconds * 1e3:.3f} ms "
        f"per step, {100 * seconds / step:.1f}% of the fastest step above "
        f"({step * 1e3:.2f} ms)."
    )


if __name__ == "__main__":
    main()
