"""`evaluate_verifier`'s result: a typed module whose fields are always present, and
Monte Carlo distances read against the sampling noise, with positions reached too
rarely to measure reported as such."""

import dataclasses
import json

import jax
import numpy as np

import eqx_specdec as es


def _evaluate(verifier, draws):
    q, p, _ = es.evaluation.synthetic_distributions("peaked", 2, 8, 0)
    return es.evaluation.evaluate_verifier(
        verifier, q, p, method="monte-carlo", num_draws=draws, key=jax.random.key(3)
    )


def test_monte_carlo_distances_are_read_against_their_noise():
    lossless = _evaluate(es.Verifier(), 20_000)
    lossy = _evaluate(es.Verifier(es.LenientRatioTest(0.5)), 20_000)
    for result in (lossless, lossy):
        assert not any(result.under_sampled)
    noise = np.array(lossless.distance_noise_per_position)
    # A lossless verifier's distance is noise: within a few times its mean.
    assert np.all(np.array(lossless.distance_per_position) < 3 * noise)
    # The lossy one's first position is far beyond it (and the chi-square rejects).
    assert lossy.distance_per_position[0] > 10 * noise[0]
    assert lossless.chi_square.passed and not lossy.chi_square.passed


def test_positions_reached_too_rarely_are_flagged_and_left_out_of_the_distance():
    result = _evaluate(es.Verifier(), 300)
    reached = np.array(result.reached) * 300
    assert result.under_sampled == tuple(bool(r < 5 * 8) for r in reached)
    assert any(result.under_sampled) and not result.under_sampled[0]
    kept = [
        d
        for d, u in zip(result.distance_per_position, result.under_sampled)
        if d is not None and not u
    ]
    assert result.distance == max(kept)


def test_every_field_is_present_and_the_dict_is_json():
    q, p, _ = es.evaluation.synthetic_distributions("peaked", 2, 5, 0)
    exact = es.evaluation.evaluate_verifier(es.Verifier(), q, p)
    sampled = _evaluate(es.Verifier(), 2_000)
    names = {f.name for f in dataclasses.fields(es.evaluation.Evaluation)}
    for result in (exact, sampled):
        assert set(result.as_dict()) == names
        json.dumps(result.as_dict())
    assert exact.method == "quadrature" and exact.draws is None
    assert exact.chi_square is None and exact.under_sampled is None
    assert sampled.draws == 2_000 and isinstance(
        sampled.chi_square, es.evaluation.ChiSquare
    )
    assert exact.root_acceptance is None  # a chain
    assert str(exact).startswith("method: exact quadrature")
