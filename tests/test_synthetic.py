"""Synthetic acceptance: the decoding loop runs at the prescribed rates, by exact
quadrature, by the objectives and measured."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_specdec


RATES = {"per position": (0.9, 0.6, 0.3), "one rate": 0.7}


@pytest.mark.parametrize("rates", list(RATES))
def test_reach_probabilities_are_the_rates_products(rates):
    rates = RATES[rates]
    gamma = 3
    expected = np.cumprod(np.broadcast_to(rates, (gamma,)))
    verifier = eqx_specdec.Verifier(
        ratio_test=eqx_specdec.SyntheticRatioTest(jnp.asarray(rates))
    )
    for kind, seed in (("peaked", 0), ("disjoint", 1)):
        q, p, _ = eqx_specdec.evaluation.synthetic_distributions(kind, gamma, 4, seed)
        exact = eqx_specdec.evaluation.evaluate_verifier(
            verifier, q, p, method="quadrature"
        )
        np.testing.assert_allclose(exact.reached[1:], expected, atol=1e-6)
        objective = eqx_specdec.evaluation.acceptance_by_position(
            jnp.asarray(q[None], jnp.float32),
            jnp.asarray(p[None], jnp.float32),
            verifier=verifier,
        )
        np.testing.assert_allclose(np.asarray(objective)[0], expected, atol=1e-6)


def test_the_decoding_loop_runs_at_the_chosen_acceptance_length():
    """Measured tokens per target call within 6 standard errors of 1 + E[n] (a fixed
    key: deterministic), for two rates that differ by far more than that."""
    draft, target = eqx_specdec.demo.builtin_models()
    prompts = np.zeros((32, 4), np.int32)
    for rate in (0.5, 0.9):
        verifier = eqx_specdec.Verifier(
            ratio_test=eqx_specdec.SyntheticRatioTest(jnp.asarray(rate))
        )
        result = eqx_specdec.speculative_decode(
            draft, target, prompts, None, 64, jax.random.key(0), verifier=verifier
        )
        gamma = 4
        reach = rate ** np.arange(1, gamma + 1)
        expected = 1 + reach.sum()
        # A step emits 1 + n tokens: the variance of n from its distribution.
        probs = np.concatenate([[1 - reach[0]], reach[:-1] - reach[1:], reach[-1:]])
        n = np.arange(gamma + 1)
        std = np.sqrt((probs * n**2).sum() - (probs * n).sum() ** 2)
        calls = int(np.asarray(result.accepted_histogram).sum())
        measured = result.tokens_per_call()
        assert abs(measured - expected) < 6 * std / np.sqrt(calls)
        np.testing.assert_allclose(
            result.theoretical_tokens_per_call(), expected, rtol=1e-5
        )


def test_rates_are_checked():
    with pytest.raises(ValueError, match=r"`rates` must lie in \[0, 1\]"):
        eqx_specdec.SyntheticRatioTest(1.5)
    inputs = eqx_specdec.example_inputs(batch=2, gamma=4, vocab=8)
    with pytest.raises(ValueError, match="SyntheticRatioTest has 3 `rates` for 4"):
        eqx_specdec.speculative_accept(
            *inputs,
            verifier=eqx_specdec.Verifier(
                ratio_test=eqx_specdec.SyntheticRatioTest(jnp.asarray([0.5, 0.5, 0.5]))
            ),
        )
