"""Each stage on its own, against NumPy, over tables of library and user-style stages."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case
from user_stages import (
    ArgminPrefixCounter,
    LenientRatioTest,
    ScatterTokenAssembler,
    SearchsortedSampler,
)

import eqx_specdec


RATIO_TESTS = [eqx_specdec.RatioTest(), LenientRatioTest(1.0)]
PREFIX_COUNTERS = [eqx_specdec.PrefixCounter(), ArgminPrefixCounter()]
SAMPLERS = [eqx_specdec.ResidualSampler(), SearchsortedSampler()]
ASSEMBLERS = [eqx_specdec.TokenAssembler(), ScatterTokenAssembler()]


def _name(stage):
    return type(stage).__name__


@pytest.mark.parametrize("ratio_test", RATIO_TESTS, ids=_name)
def test_ratio_test(ratio_test):
    x, q, p, u, _ = random_case(0, 1, 6, 5)
    x, q, p, u = x[0], q[0], p[0], u[0]
    # Boundary cases: q(x) = 0 < p(x) passes even for u near 1; p(x) = 0 never passes,
    # even for u = 0; u * q == p exactly fails (strict).
    q[0, x[0]], p[0, x[0]], u[0] = 0.0, 0.25, 0.99
    q[1, x[1]], p[1, x[1]], u[1] = 0.5, 0.0, 0.0
    q[2, x[2]], p[2, x[2]], u[2] = 0.5, 0.25, 0.5
    verdict = jax.jit(ratio_test)(*(jnp.asarray(a) for a in (x, q, p, u)))
    p_x = p[np.arange(6), x].astype(np.float64)
    q_x = q[np.arange(6), x].astype(np.float64)
    np.testing.assert_array_equal(verdict.passed, u * q_x < p_x)
    assert list(np.asarray(verdict.passed[:3])) == [True, False, False]
    np.testing.assert_array_equal(verdict.residual_scale, np.ones(6))


@pytest.mark.parametrize("counter", PREFIX_COUNTERS, ids=_name)
@pytest.mark.parametrize("gamma", [1, 2, 5])
def test_prefix_counter_on_every_pattern(counter, gamma):
    patterns = np.array(list(itertools.product([False, True], repeat=gamma)))
    counts = jax.jit(jax.vmap(counter))(jnp.asarray(patterns))
    expected = [
        next((i for i, ok in enumerate(row) if not ok), gamma) for row in patterns
    ]
    np.testing.assert_array_equal(counts, expected)
    assert jnp.issubdtype(counts.dtype, jnp.integer)


@pytest.mark.parametrize("sampler", SAMPLERS, ids=_name)
def test_residual_sampler_at_every_count(sampler):
    gamma, vocab = 4, 300
    x, q, p, _, _ = random_case(1, 1, gamma, vocab)
    x, q, p = x[0], q[0], p[0]
    verdict = eqx_specdec.Verdict(jnp.zeros(gamma, bool))
    checked = 0
    for n in range(gamma + 1):
        if n < gamma:
            residual = np.maximum(p[n].astype(np.float64) - q[n], 0)
        else:
            residual = p[gamma].astype(np.float64)
        cdf = np.cumsum(residual / residual.sum())
        for s in np.linspace(0.01, 0.99, 25):
            if np.min(np.abs(cdf - s)) < 1e-4:
                continue
            y = jax.jit(sampler)(
                jnp.int32(n),
                verdict,
                jnp.asarray(x),
                jnp.asarray(q),
                jnp.asarray(p),
                jnp.float32(s),
            )
            assert int(y) == np.argmax(cdf > s)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("assembler", ASSEMBLERS, ids=_name)
def test_token_assembler_at_every_count(assembler):
    x = jnp.array([7, 8, 9], jnp.int32)
    for n in range(4):
        tokens = jax.jit(assembler)(jnp.int32(n), x, jnp.int32(42))
        expected = [7, 8, 9][:n] + [42] + [-1] * (3 - n)
        np.testing.assert_array_equal(tokens, expected)
