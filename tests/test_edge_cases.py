"""The contract's section 3 (docs/contract.md): the edge-case rules, each tested."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case

import eqx_specdec


def _row(x, q, p, u, s, **kwargs):
    out = eqx_specdec.speculative_accept(
        jnp.asarray([x], jnp.int32),
        None if q is None else jnp.asarray([q], jnp.float32),
        jnp.asarray([p], jnp.float32),
        jnp.asarray([u], jnp.float32),
        jnp.asarray([s], jnp.float32),
        **kwargs,
    )
    return int(out["num_accepted"][0]), np.asarray(out["tokens"][0])


def test_zero_residual_mass_draws_from_p():
    """p_0 == q_0, and the draft token has probability 0 under both (so it is
    rejected): the residual is all zero, and y must follow p_0, not be NaN or 0."""
    p0 = [0.0, 0.5, 0.25, 0.25]
    q = [p0, [0.25] * 4]
    p = [p0, [0.25] * 4, [0.25] * 4]
    cdf = np.cumsum(p0)
    for s in np.linspace(0.01, 0.99, 49):
        n, tokens = _row([0, 1], q, p, [0.5, 0.5], s, check_inputs="read")
        assert n == 0
        assert tokens[0] == np.argmax(cdf > s)
        assert tokens[0] != 0  # token 0 has no mass under p_0


def test_residual_lost_to_rounding_draws_from_p():
    """q = p rounded up by one ulp everywhere: max(p - q, 0) is exactly zero."""
    rng = np.random.default_rng(0)
    p_row = rng.dirichlet(np.ones(50)).astype(np.float32)
    q_row = np.nextafter(p_row, np.float32(1))
    sampler = eqx_specdec.ResidualSampler()
    verdict = eqx_specdec.Verdict(jnp.zeros(1, bool))
    cdf = np.cumsum(p_row.astype(np.float64))
    uniforms = np.linspace(0.005, 0.995, 100)
    uniforms = uniforms[[np.min(np.abs(cdf - s)) >= 1e-5 for s in uniforms]]
    draw = jax.jit(jax.vmap(lambda s: sampler(
        jnp.int32(0), verdict, jnp.zeros(1, jnp.int32), jnp.asarray(q_row[None]),
        jnp.asarray(np.stack([p_row, p_row])), s,
    )))  # fmt: skip
    tokens = np.asarray(draw(jnp.asarray(uniforms, jnp.float32)))
    assert len(uniforms) > 90
    np.testing.assert_array_equal(tokens, [np.argmax(cdf > s) for s in uniforms])


def _bonus_token(weights, s):
    """The sampler at n = G, where it draws from the bonus row p_G = weights."""
    vocab = weights.shape[0]
    p = jnp.stack([jnp.full(vocab, 1.0 / vocab, jnp.float32), weights])
    return eqx_specdec.ResidualSampler()(
        jnp.int32(1), eqx_specdec.Verdict(jnp.ones(1, bool)), jnp.zeros(1, jnp.int32),
        p[:1], p, jnp.asarray(s, jnp.float32),
    )  # fmt: skip


def test_top_of_the_cdf_is_the_last_positive_token():
    """When no cumulative sum exceeds the threshold (forced here with s = 1, which
    makes the threshold equal the total), the answer is the last positive-weight token:
    not a zero-weight token, not V, not 0."""
    weights = np.zeros(1000, np.float32)
    weights[:700] = 1 / 700
    weights[3] = 0.0
    assert int(_bonus_token(jnp.asarray(weights), 1.0)) == 699
    weights[690:700] = 0.0
    assert int(_bonus_token(jnp.asarray(weights), 1.0)) == 689


@pytest.mark.parametrize("vocab", [1000, 131_072])
def test_never_a_zero_weight_token(vocab):
    """Large vocabularies with half the tokens at zero weight (scattered and in a zero
    tail), s near 0, in the middle and within a few float32 ulps of 1."""
    rng = np.random.default_rng(vocab)
    weights = rng.exponential(size=vocab).astype(np.float32)
    weights[rng.random(vocab) < 0.5] = 0.0
    weights[-vocab // 10 :] = 0.0
    weights /= weights.sum()
    one = np.float32(1)
    near_one = [np.nextafter(one, np.float32(0))]
    for _ in range(5):
        near_one.append(np.nextafter(near_one[-1], np.float32(0)))
    uniforms = jnp.asarray([0.0, 1e-9, 0.3, 0.5, 0.999, *near_one], jnp.float32)
    tokens = jax.jit(jax.vmap(lambda s: _bonus_token(jnp.asarray(weights), s)))(
        uniforms
    )
    tokens = np.asarray(tokens)
    assert ((tokens >= 0) & (tokens < vocab)).all()
    assert (weights[tokens] > 0).all()
    last = np.nonzero(weights)[0][-1]
    assert (tokens[-len(near_one) :] >= last - 50).all()


def test_q_zero_passes_and_p_zero_never_passes():
    vocab = 4
    p = [[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25], [0.25] * 4]
    q = [[0.5, 0.0, 0.5, 0.0], [0.25] * 4]
    # x_0 = 1: q(x) = 0 < p(x) = 0.5 passes even at u near 1.
    n, _ = _row([1, 0], q, p, [0.99999, 0.0], 0.5)
    assert n == 2
    # x_0 = 0: p(x) = 0 never passes, even at u = 0.
    n, _ = _row([0, 0], q, p, [0.0, 0.0], 0.5)
    assert n == 0
    # x_0 = 3: p(x) = q(x) = 0 does not pass either (0 < 0 is false).
    n, _ = _row([3, 0], q, p, [0.0, 0.0], 0.5)
    assert n == 0
    del vocab


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_every_float_dtype(dtype):
    """Inputs rounded to `dtype` give the same tokens as the same values in float32 (the
    verifier computes in at least float32), and int32 outputs."""
    x, q, p, u, s = random_case(3, 16, 4, 64)
    rounded = [jnp.asarray(a).astype(dtype) for a in (q, p, u, s)]
    as_f32 = [a.astype(jnp.float32) for a in rounded]
    out = eqx_specdec.speculative_accept(x, *rounded, check_inputs="off")
    expected = eqx_specdec.speculative_accept(x, *as_f32, check_inputs="off")
    for key in out:
        assert out[key].dtype == jnp.int32
        np.testing.assert_array_equal(out[key], expected[key])


def test_half_precision_inputs_pass_the_checks():
    x, q, p, u, s = random_case(4, 8, 3, 512)
    for dtype in (jnp.float16, jnp.bfloat16):
        out = eqx_specdec.speculative_accept(
            x, jnp.asarray(q, dtype), jnp.asarray(p, dtype), u, s
        )
        jax.block_until_ready(out)
