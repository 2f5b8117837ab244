"""The library's rules compared on SmolLM2's recorded rows: the table on the docs' "A real
model" page (`docs/recorded_rows_table.txt`).

    python scripts/recorded_rows_table.py [--rows rows.npz]

Without `--rows` it records them first, as `python -m eqx_specdec record` does (SmolLM2
continues one prompt per category; the draft is its first 20 layers; G = 4). Tokens per
target call, $1 + E[n]$, in closed form for the rules whose pass probabilities are exact,
and for block verification averaged over 32 draws of the draft tokens from $q$ per window.
"""

import argparse
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

import eqx_specdec as es
from eqx_specdec.llm import (
    CHAT_PROMPTS,
    continue_prompts,
    fetch_smollm2,
    load_gguf,
    record_rows,
    RecordedRows,
)


OUT = (
    pathlib.Path(__file__).resolve().parent.parent / "docs" / "recorded_rows_table.txt"
)


def load_or_record(path: str | None) -> tuple[RecordedRows, str]:
    """The rows at `path`, or, without one, SmolLM2's rows recorded as `python -m
    eqx_specdec record` does by default; and where they came from."""
    if path:
        return RecordedRows.load(path), path
    model, tokenizer = load_gguf(fetch_smollm2())
    prompts = [
        tokenizer.encode(tokenizer.chat(texts[0])) for texts in CHAT_PROMPTS.values()
    ]
    texts = continue_prompts(model, prompts, 32)
    rows = record_rows(model, model.first_layers(20), texts, gamma=4, windows=4)
    return rows, "python -m eqx_specdec record (defaults)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None)
    parser.add_argument("--draws", type=int, default=32)
    args = parser.parse_args(argv)
    rows, source = load_or_record(args.rows)
    count, gamma = rows.tokens.shape
    q, p = rows.draft_probs, rows.target_probs
    block = es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter())
    rules = {
        "standard (lossless)": (es.Verifier(), None),
        "one-hot drafts, argmax of q (lossless)": (es.Verifier(), "argmax"),
        "block (lossless)": (block, "sampled"),
        "lenient 0.5 (lossy)": (es.Verifier(es.LenientRatioTest(0.5)), None),
    }
    lines = [
        f"SmolLM2-135M-Instruct's rows: {count} windows of G = {gamma}, the draft its "
        f"first 20 of 30 layers (untrained), from {source}",
        "",
        "| rule | tokens per target call | acceptance rate by position |",
        "|---|---|---|",
    ]
    for name, (verifier, drafts) in rules.items():
        if drafts is None:
            reach = es.evaluation.acceptance_by_position(q, p, verifier=verifier)
        elif drafts == "argmax":
            reach = es.evaluation.acceptance_by_position(
                None, p, verifier=verifier, draft_tokens=jnp.argmax(q, -1)
            )
        else:
            keys = jax.random.split(jax.random.key(0), args.draws)
            reach = jnp.mean(
                jnp.stack(
                    [
                        es.evaluation.acceptance_by_position(
                            q,
                            p,
                            verifier=verifier,
                            draft_tokens=jax.random.categorical(k, jnp.log(q)),
                        )
                        for k in keys
                    ]
                ),
                0,
            )
        reach = np.asarray(reach, np.float64).mean(0)
        conditional = reach / np.concatenate([[1.0], reach[:-1]])
        lines.append(
            f"| {name} | {1 + reach.sum():.3f} | "
            f"{' '.join(f'{r:.2f}' for r in conditional)} |"
        )
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
