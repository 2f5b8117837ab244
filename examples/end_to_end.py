"""Speculative decoding end to end with the built-in character n-gram pair."""

import jax
import numpy as np

import eqx_specdec as es


draft, target = es.demo.builtin_models()  # a character bigram draft, a 4-gram target
texts = ["the ", "we hold these ", "in the beginning "]
lengths = np.array([len(t) for t in texts])
prompts = np.zeros((len(texts), lengths.max()), np.int32)  # padded on the right
for row, text in enumerate(texts):
    prompts[row, : len(text)] = es.demo.encode(text)


result = es.speculative_decode(
    draft,
    target,
    prompts,
    lengths,
    num_tokens=80,
    key=jax.random.key(0),
    proposal=es.Chain(4),  # G = 4 draft tokens per step (or a tree: es.Tree)
    verifier=es.Verifier(),  # any verifier: block, greedy, your own...
)
for text, tokens in zip(texts, result.tokens):
    print(f"{text!r} -> {es.demo.decode(tokens)!r}")

print(f"tokens per target call: {result.tokens_per_call():.3f}")
print(f"theory:                 {result.theoretical_tokens_per_call():.3f}")
print(f"acceptance by position: {np.round(result.acceptance_rate(), 2)}")
