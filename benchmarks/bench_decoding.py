"""Speculative decoding in wall-clock time: `python benchmarks/bench_decoding.py`.

Decodes with the built-in transformer target (`eqx_specdec.demo.builtin_transformers`: three
layers of width 320, a key-value cache) and, as drafts, the built-in character n-gram
models and the built-in small transformer (one layer of width 64, cached), against plain
autoregressive decoding of the same target with the same cache, the runs interleaved.
Prints tokens per second, the measured speed-up, what a cost model predicts from the
models' per-call times alone (`eqx_specdec.Speedup.predicted_speedup`) and the tokens per
target call. The standard rule, sampled drafts, the built-in prompts.
"""

import argparse

import jax
import numpy as np

import eqx_specdec as es
from eqx_specdec._decoding.speedup import measure_speedup, speedup_table


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


if __name__ == "__main__":
    main()
