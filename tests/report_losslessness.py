"""Prints the losslessness statistics quoted in docs/correctness.md.

    python tests/report_losslessness.py

The same cases, keys and thresholds as tests/test_lossless.py.
"""

import jax
import numpy as np
from lossless_cases import (
    acceptance_products,
    distributions,
    MONTE_CARLO_CASES,
    MONTE_CARLO_VOCAB,
    NUM_DRAWS,
    QUADRATURE_CASES,
    TargetOnlySampler,
)
from user_stages import LenientRatioTest

import eqx_specdec


def quadrature_table():
    print(
        "| case | G | V | max error of P(tokens[k] = v \\| n >= k) | max error of P(n >= k) |"
    )
    print("|---|---|---|---|---|")
    for case in QUADRATURE_CASES:
        kind, gamma, vocab, _ = case
        q, p, law = distributions(*case)
        est = eqx_specdec.evaluation.emission_by_quadrature(
            eqx_specdec.Verifier(), q, p, draft_law=law
        )
        reach = np.max(np.abs(est.reached - acceptance_products(q, p, law)))
        print(f"| {kind} | {gamma} | {vocab} | {est.max_error(p):.1e} | {reach:.1e} |")


def monte_carlo_table():
    print(
        "| case | G | k | draws reaching k | chi-square / threshold (df) "
        "| P(n >= k), observed / expected |"
    )
    print("|---|---|---|---|---|---|")
    for case in MONTE_CARLO_CASES:
        kind, gamma, vocab, seed = case
        q, p, law = distributions(*case)
        est = eqx_specdec.evaluation.emission_by_monte_carlo(
            eqx_specdec.Verifier(), q, p, jax.random.key(seed), NUM_DRAWS, draft_law=law
        )
        stats = est.chi_square(p)
        expected = acceptance_products(q, p, law)
        for k in range(gamma + 1):
            if est.reached[k] == 0:
                print(f"| {kind} | {gamma} | {k} | 0 | - | 0 / {expected[k]:.4f} |")
                continue
            print(
                f"| {kind} | {gamma} | {k} | {int(est.reached[k])} | "
                f"{stats['statistic'][k]:.0f} / {stats['threshold'][k]:.0f} "
                f"({stats['df'][k]:.0f}) | {est.reached[k] / NUM_DRAWS:.4f} / "
                f"{expected[k]:.4f} |"
            )


def controls_table():
    print(
        "| lossy verifier | quadrature max error (peaked, G=2, V=5) | chi-square / "
        f"threshold (peaked, G=1, V={MONTE_CARLO_VOCAB}) |"
    )
    print("|---|---|---|")
    for name, verifier in [
        ("lenience l = 0.5", eqx_specdec.Verifier(ratio_test=LenientRatioTest(0.5))),
        (
            "correction drawn from p_n",
            eqx_specdec.Verifier(
                residual_sampler=TargetOnlySampler(), allow_mismatch=True
            ),
        ),
    ]:
        q, p, law = distributions("peaked", 2, 5, 0)
        # As in the test: the user's lenient test declares no breakpoints.
        with np.errstate(divide="ignore", invalid="ignore"):
            cuts = p[:-1] / (0.5 * q)
        quad = eqx_specdec.evaluation.emission_by_quadrature(
            verifier, q, p, draft_law=law, accept_breakpoints=cuts
        ).max_error(p)
        q, p, law = distributions("peaked", 1, MONTE_CARLO_VOCAB, 7)
        est = eqx_specdec.evaluation.emission_by_monte_carlo(
            verifier, q, p, jax.random.key(1), NUM_DRAWS, draft_law=law
        )
        stats = est.chi_square(p)
        print(
            f"| {name} | {quad:.3f} | {stats['statistic'][0]:.0f} / "
            f"{stats['threshold'][0]:.0f} |"
        )


if __name__ == "__main__":
    print("## Quadrature\n")
    quadrature_table()
    print("\n## Monte Carlo\n")
    monte_carlo_table()
    print("\n## Lossy controls\n")
    controls_table()
