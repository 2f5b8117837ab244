"""Prints the composition table of `tests/test_exactness.py`: every ratio test x prefix
counter x residual sampler, each refused at construction (with the distance of the
composition built anyway by `allow_mismatch=True`), exact (with its distance) or lossy
by declaration (with its distance), the distance being the largest error of the emitted
tokens against the rule's target by exact quadrature (Monte Carlo's chi-square for the
key-driven Gumbel sampler, whose quadrature does not apply).

    python tests/report_exactness.py
"""

import sys

import numpy as np


sys.path.insert(0, "tests")

import test_exactness as t  # noqa: E402

import eqx_specdec as es  # noqa: E402


def distance(verifier) -> str:
    extra = {}
    if isinstance(verifier.ratio_test, t.UserLenientRatioTest):
        with np.errstate(divide="ignore"):
            extra["accept_breakpoints"] = t.TARGET[:-1] / (0.5 * t.DRAFT)
    if isinstance(
        verifier.residual_sampler, (t.SearchsortedSampler, t.TopKArgmaxSampler)
    ):
        extra["sample_breakpoints"] = np.zeros(0)
    if isinstance(verifier.residual_sampler, es.GumbelSampler):
        return "(key-driven)"
    estimate = es.evaluation.emission_by_quadrature(
        verifier, t.DRAFT, t.TARGET, **extra
    )
    target = t.law(verifier.ratio_test)
    return f"{estimate.max_error(target):.1e}"


def main():
    print("| ratio test | counter | sampler | verdict | quadrature distance |")
    print("|---|---|---|---|---|")
    for names in t.COMBINATIONS:
        test, counter, sampler = (
            table[name]
            for table, name in zip((t.RATIO_TESTS, t.COUNTERS, t.SAMPLERS), names)
        )
        fits = t._fits(test, counter, sampler)
        if test.exact and not fits:
            verdict = "refused"
            verifier = t._build(names, allow_mismatch=True)
        else:
            verifier = t._build(names)
            verdict = "exact" if verifier.exact else "lossy by declaration"
        print(f"| {' | '.join(names)} | {verdict} | {distance(verifier)} |", flush=True)


if __name__ == "__main__":
    main()
