"""Block over token verification and traversal over top-down, on SmolLM2 in the decoding
loop: the table on the docs' "Published numbers" page (`docs/real_model_trees_table.txt`).

    python scripts/real_model_trees.py

SmolLM2-135M-Instruct continues the built-in chat prompts (one per category) with
speculative decoding, sampled at temperature 1. Its drafter is SmolLM2 itself at
temperature 1.3 (a drafter close to the target, so that the verifiers' differences show;
the real-model page's 20-layer drafter accepts about one token in ten). Both models run
uncached here (the tree proposal scores every node's context with a whole forward pass),
so the table reports tokens per target call, not time. Each pair of rows runs on the
same prompts and keys:

- a chain of G = 4 draft tokens: the standard verifier, and block verification;
- a tree (two candidates at the root, each with a chain of two below; depth-first
  `(-1, 0, 1, -1, 3, 4)`) drafted without replacement: the top-down walk, and traversal
  verification.
"""

import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es
from eqx_specdec.llm import CHAT_PROMPTS, fetch_smollm2, load_gguf


OUT = (
    pathlib.Path(__file__).resolve().parent.parent
    / "docs"
    / "real_model_trees_table.txt"
)
TREE = (-1, 0, 1, -1, 3, 4)
TOKENS = 64
DRAFT_TEMPERATURE = 1.3


class Uncached(eqx.Module):
    """A Llama as a stateless model: its logits at `positions` from one whole forward
    pass over the buffer (the rows are causal, so what lies after is not read)."""

    model: eqx.Module
    temperature: float = 1.0

    def __call__(self, tokens, positions):
        return self.model.logits(tokens)[positions] / self.temperature


def main():
    model, tokenizer = load_gguf(fetch_smollm2())
    prompts = [
        tokenizer.encode(tokenizer.chat(texts[0])) for texts in CHAT_PROMPTS.values()
    ]
    width = max(map(len, prompts))
    buffer = np.zeros((len(prompts), width), np.int32)
    for i, prompt in enumerate(prompts):
        buffer[i, : len(prompt)] = prompt
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    draft, target = Uncached(model, DRAFT_TEMPERATURE), Uncached(model)
    runs = {
        "chain, G = 4": {
            "standard": dict(verifier=es.Verifier(), proposal=es.Chain(4)),
            "block": dict(
                verifier=es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter()),
                proposal=es.Chain(4),
            ),
        },
        f"tree {TREE}": {
            "top-down (without replacement)": dict(
                verifier=es.TreeVerifier(es.WithoutReplacementCandidates(), tree=TREE)
            ),
            "traversal": dict(verifier=es.TraversalVerifier(tree=TREE)),
        },
    }
    lines = [
        f"SmolLM2-135M-Instruct, {len(prompts)} prompts, {TOKENS} tokens each, sampled "
        f"at temperature 1; the drafter: SmolLM2 at temperature {DRAFT_TEMPERATURE}",
        "",
        "| proposal | verifier | tokens per target call | target calls |",
        "|---|---|---|---|",
    ]
    for proposal, verifiers in runs.items():
        for name, options in verifiers.items():
            start = time.perf_counter()
            result = es.speculative_decode(
                draft, target, buffer, lengths, TOKENS, jax.random.key(0),
                outputs="logits", **options,
            )  # fmt: skip
            calls = int(jnp.sum(result.target_calls))
            lines.append(
                f"| {proposal} | {name} | {result.tokens_per_call():.3f} | {calls} |"
            )
            print(lines[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
