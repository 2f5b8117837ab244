"""Threshold rules evaluated exactly on SmolLM2's recorded rows: the table on the docs'
"Writing a custom stage" page (`docs/threshold_rules_table.txt`).

    python scripts/threshold_rules_table.py [--rows rows.npz]

Without `--rows` it records them first, as `scripts/recorded_rows_table.py` does. Every
window of every prompt, every position, at the full vocabulary of 49,152 tokens:
`evaluate_verifier` in closed form (exact) for the standard rule, the docs' capped rule
at c = 0.5 and lenience 0.5; beside it, what Monte Carlo with 20,000 draws measures of
the standard rule (its positions under-sampled at this vocabulary: not measured).
"""

import argparse
import pathlib
import sys
import time

import jax.numpy as jnp
import numpy as np

import eqx_specdec as es


ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "threshold_rules_table.txt"


def _capped():
    """The capped rule of "Writing a custom stage", as the page defines it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from user_stages import page_classes

    return page_classes("custom_stage.md")["Capped"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None)
    parser.add_argument("--draws", type=int, default=20_000)
    args = parser.parse_args(argv)
    # The recording is recorded_rows_table.py's (this script's folder is on the path
    # when it runs).
    from recorded_rows_table import load_or_record

    rows, source = load_or_record(args.rows)
    count, gamma = rows.tokens.shape
    vocab = rows.target_probs.shape[-1]
    capped = _capped()
    rules = {
        "standard, `RatioTest()`": es.Verifier(),
        "capped c = 0.5, `Capped(0.5)` (5 lines)": es.Verifier(
            capped(jnp.asarray(0.5))
        ),
        "lenient l = 0.5, `LenientRatioTest(0.5)`": es.Verifier(
            es.LenientRatioTest(0.5)
        ),
    }
    lines = [
        f"SmolLM2-135M-Instruct's rows: {count} windows of G = {gamma} at V = {vocab:,}, "
        f"the draft its first 20 of 30 layers, from {source}",
        "",
        "| rule | exact | largest distance, every window and position | mean tokens "
        "per target call | seconds |",
        "|---|---|---|---|---|",
    ]
    for name, verifier in rules.items():
        start = time.perf_counter()
        found = [
            es.evaluation.evaluate_verifier(
                verifier, rows.draft_probs[w], rows.target_probs[w]
            )
            for w in range(count)
        ]
        seconds = time.perf_counter() - start
        assert all(e.method == "closed-form" for e in found)
        distance = max(
            d for e in found for d in e.distance_per_position if d is not None
        )
        tokens = np.mean([e.tokens_per_step for e in found])
        lines.append(
            f"| {name} | {verifier.exact} | {distance:.1e} | {tokens:.3f} | "
            f"{seconds:.1f} |"
        )
    sampled = es.evaluation.evaluate_verifier(
        es.Verifier(),
        rows.draft_probs[0],
        rows.target_probs[0],
        method="monte-carlo",
        num_draws=args.draws,
    )
    measured = sum(not u for u in sampled.under_sampled)
    headline = "none" if sampled.distance is None else f"{sampled.distance:.3f}"
    lines += [
        "",
        f"Monte Carlo on the standard rule, window 0, {args.draws:,} draws: "
        f"{measured} of {len(sampled.under_sampled)} positions drawn often enough to "
        f"measure (5 draws per token the target can emit); headline distance: "
        f"{headline}.",
    ]
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
