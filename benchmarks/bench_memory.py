"""Memory of every entry point and option: `python benchmarks/bench_memory.py`.

For each entry point and serving option, the temporaries of its compiled program (XLA's
memory analysis of the program, lowered and compiled, never run) beside the bytes of its
inputs, at a serving shape (default (B, G, V) = (64, 5, 128256)): the probabilities and
logits entry points with their default checks, with each warp, a mask, the penalties (a
history of 256 tokens), log-probabilities; a tree and traversal verification (N = 5
nodes, so `N + 1 = G + 1` rows); the decoding loop's theory of `TopNRelaxedRatioTest`.
A program whose temporaries grow past its inputs' bytes holds something of size
`O(rows x V)` beyond them, or worse.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es
from benchmarks.contract_calls import accept_logits, tree_accept


def _memory(fn, *args) -> tuple[float, float]:
    """(temporaries, inputs) of `fn`'s compiled program, in MB."""
    compiled = jax.jit(fn).lower(*args).compile()
    inputs = sum(np.asarray(a).nbytes for a in jax.tree.leaves(args))
    return compiled.memory_analysis().temp_size_in_bytes / 1e6, inputs / 1e6


def rows(batch: int, gamma: int, vocab: int) -> dict:
    """Each row: a function and the arrays it takes (its inputs)."""
    tokens, q, p, u, s = es.example_inputs(batch=batch, gamma=gamma, vocab=vocab)
    logq, logp = jnp.log(q), jnp.log(p)
    rng = np.random.default_rng(0)
    mask = (
        jnp.asarray(rng.uniform(size=(batch, gamma + 1, vocab)) < 0.5)
        .at[..., 0]
        .set(True)
    )
    history = jnp.asarray(rng.integers(0, vocab, (batch, 256)), jnp.int32)
    tree = (-1, 0, 1, 2, 3)[:gamma]  # a chain-shaped tree: N + 1 = G + 1 rows
    nodes = tokens[:, : len(tree)]
    q_tree = jnp.concatenate([q[:, : len(tree)], q[:, :1]], axis=1)

    def logits(warp, **options):
        return lambda t, a, b, c, d: accept_logits(
            t, a, b, c, d, target_warp=warp, draft_warp=warp, **options
        )["tokens"]

    penalised = es.Warp(0.8, top_k=50, repetition_penalty=1.2, frequency_penalty=0.3)
    logit_args = (tokens, logq, logp, u, s)
    topn = es.TopNRelaxedRatioTest(10)
    return {
        "probabilities": (
            lambda t, a, b, c, d: es.speculative_accept(t, a, b, c, d)["tokens"],
            (tokens, q, p, u, s),
        ),
        "probabilities, checks off": (
            lambda t, a, b, c, d: es.speculative_accept(
                t, a, b, c, d, check_inputs="off"
            )["tokens"],
            (tokens, q, p, u, s),
        ),
        "probabilities + log-probabilities (top 5)": (
            lambda t, a, b, c, d: es.speculative_accept(
                t, a, b, c, d, logprobs=es.LogProbs(top_k=5)
            )["tokens"],
            (tokens, q, p, u, s),
        ),
        "probabilities + mask": (
            lambda t, a, b, c, d, m: es.speculative_accept(t, a, b, c, d, allowed=m)[
                "tokens"
            ],
            (tokens, q, p, u, s, mask),
        ),
        "logits, Warp(0.7)": (logits(es.Warp(0.7)), logit_args),
        "logits, Warp(0.7, top_k=50)": (logits(es.Warp(0.7, top_k=50)), logit_args),
        "logits, Warp(0.7, top_p=0.9)": (logits(es.Warp(0.7, top_p=0.9)), logit_args),
        "logits, Warp(0.7, min_p=0.05)": (
            logits(es.Warp(0.7, min_p=0.05)),
            logit_args,
        ),
        "logits + penalties (history of 256)": (
            lambda t, a, b, c, d, h: accept_logits(
                t, a, b, c, d, target_warp=penalised, draft_warp=penalised, history=h
            )["tokens"],
            logit_args + (history,),
        ),
        "logits + raw log-probabilities": (
            logits(es.Warp(0.7), logprobs=es.LogProbs(raw=True)),
            logit_args,
        ),
        f"tree_accept, {len(tree)} nodes": (
            lambda t, a, b, c, d: tree_accept(
                t, None, a, b, c, d, verifier=es.TreeVerifier(tree=tree)
            )["tokens"],
            (nodes, q_tree, p, u[:, : len(tree)], s),
        ),
        f"traversal, {len(tree)} nodes": (
            lambda t, a, b, c, d: tree_accept(
                t, None, a, b, c, d, verifier=es.TraversalVerifier(tree=tree)
            )["tokens"],
            (nodes, q_tree, p, u[:, : len(tree)], s),
        ),
        "TopNRelaxedRatioTest.pass_probabilities (the loop's theory)": (
            jax.vmap(topn.pass_probabilities),
            (q, p[:, :gamma]),
        ),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64,5,128256", help="B,G,V")
    args = parser.parse_args(argv)
    batch, gamma, vocab = (int(v) for v in args.shape.split(","))
    print(f"JAX {jax.__version__} on {jax.default_backend()}; B, G, V = {args.shape}\n")
    print("| program | temporaries, MB | inputs, MB | temporaries / inputs |")
    print("|---|---|---|---|")
    for name, (fn, arrays) in rows(batch, gamma, vocab).items():
        temp, inputs = _memory(fn, *arrays)
        print(f"| {name} | {temp:.1f} | {inputs:.1f} | {temp / inputs:.2f} |")


if __name__ == "__main__":
    main()
