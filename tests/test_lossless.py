"""Losslessness, shown deterministically: quadrature over the uniforms on small cases, and
Monte Carlo with fixed keys and chi-square thresholds far in the tail on V = 256 (which
exercises the samplers' two-level search, as every V above 32 does)."""

import jax
import numpy as np
import pytest
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


def _id(case):
    return "-".join(str(c) for c in case)


@pytest.mark.parametrize("case", QUADRATURE_CASES, ids=_id)
def test_quadrature(case):
    q, p, law = distributions(*case)
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        eqx_specdec.Verifier(), q, p, draft_law=law
    )
    # Every reached position emits p_k; the grid is exact up to float32 rounding.
    assert estimate.max_error(p) < 1e-6
    np.testing.assert_allclose(
        estimate.reached, acceptance_products(q, p, law), atol=1e-6
    )
    # The estimate is a probability: each reached position sums to its reach.
    np.testing.assert_allclose(estimate.emitted.sum(-1), estimate.reached, atol=1e-9)


@pytest.mark.parametrize(
    "verifier",
    [
        eqx_specdec.Verifier(ratio_test=LenientRatioTest(0.5)),
        eqx_specdec.Verifier(residual_sampler=TargetOnlySampler(), allow_mismatch=True),
    ],
    ids=["lenience-0.5", "correction-from-p"],
)
def test_quadrature_detects_lossy_verifiers(verifier):
    """The same measurement on verifiers known to be wrong: a test that can fail. (The
    user's lenient test declares no breakpoints: they are passed by hand.)"""
    q, p, law = distributions("peaked", 2, 5, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        cuts = p[:-1] / (0.5 * q)
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        verifier, q, p, draft_law=law, accept_breakpoints=cuts
    )
    assert estimate.max_error(p) > 0.02


def test_quadrature_of_a_user_stage_at_lenience_one_is_exact():
    q, p, law = distributions("sparse", 2, 5, 3)
    verifier = eqx_specdec.Verifier(ratio_test=LenientRatioTest(1.0))
    # Without its breakpoints the quadrature would be silently inexact: it refuses.
    with pytest.raises(
        eqx_specdec.MissingCapabilityError,
        match="LenientRatioTest does not implement `quadrature_breakpoints`",
    ):
        eqx_specdec.evaluation.emission_by_quadrature(verifier, q, p, draft_law=law)
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        verifier, q, p, draft_law=law, accept_breakpoints=np.zeros((2, 0))
    )
    assert estimate.max_error(p) < 1e-6


def _monte_carlo(verifier, case, seed):
    q, p, law = distributions(*case)
    key = jax.random.key(seed)
    estimate = eqx_specdec.evaluation.emission_by_monte_carlo(
        verifier, q, p, key, NUM_DRAWS, draft_law=law
    )
    return q, p, law, estimate


@pytest.mark.execution_bound
@pytest.mark.parametrize("case", MONTE_CARLO_CASES, ids=_id)
def test_monte_carlo_chi_square(case):
    q, p, law, estimate = _monte_carlo(eqx_specdec.Verifier(), case, seed=case[3])
    stats = estimate.chi_square(p)
    reached = estimate.reached > 0
    assert reached[0]
    assert np.all(stats["statistic"][reached] < stats["threshold"][reached]), stats
    # P(n >= k) matches the product of the acceptance probabilities, within 6 sigma.
    expected = acceptance_products(q, p, law)
    observed = estimate.reached / NUM_DRAWS
    sigma = np.sqrt(expected * (1 - expected) / NUM_DRAWS)
    assert np.all(np.abs(observed - expected) <= 6 * sigma + 1e-12), (
        observed,
        expected,
    )


@pytest.mark.parametrize(
    "verifier",
    [
        eqx_specdec.Verifier(ratio_test=LenientRatioTest(0.5)),
        eqx_specdec.Verifier(residual_sampler=TargetOnlySampler(), allow_mismatch=True),
    ],
    ids=["lenience-0.5", "correction-from-p"],
)
@pytest.mark.execution_bound
def test_monte_carlo_detects_lossy_verifiers(verifier):
    _, p, _, estimate = _monte_carlo(
        verifier, ("peaked", 1, MONTE_CARLO_VOCAB, 7), seed=1
    )
    stats = estimate.chi_square(p)
    assert stats["statistic"][0] > stats["threshold"][0]


def test_quadrature_refuses_a_case_too_large_to_evaluate():
    """V = 1000, G = 3 would take hours and gigabytes: a clear error instead, before
    any grid is built."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(1000), size=4)
    q = rng.dirichlet(np.ones(1000), size=3)
    with pytest.raises(
        ValueError, match="would evaluate the verifier on .* rows or more"
    ):
        eqx_specdec.evaluation.emission_by_quadrature(eqx_specdec.Verifier(), q, p)
