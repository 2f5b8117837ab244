"""The verifier against the NumPy reference of the contract (docs/contract.md,
section 1), on random cases."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import float_dtypes, random_case, reference
from user_stages import (
    ArgminPrefixCounter,
    LenientRatioTest,
    ScatterTokenAssembler,
    SearchsortedSampler,
)

import eqx_specdec


SHAPES = [
    (0, 1, 1, 2),
    (1, 4, 4, 6),
    (2, 16, 1, 1000),
    (3, 16, 8, 1000),
    (4, 8, 5, 257),
    (5, 13, 3, 50),
    (6, 16, 8, 32),
    (7, 3, 2, 999),
    (8, 16, 6, 100),
    (9, 16, 8, 16),
]

RATIO_TESTS = [eqx_specdec.RatioTest(), LenientRatioTest(1.0)]
PREFIX_COUNTERS = [eqx_specdec.PrefixCounter(), ArgminPrefixCounter()]
SAMPLERS = [eqx_specdec.ResidualSampler(), SearchsortedSampler()]
ASSEMBLERS = [eqx_specdec.TokenAssembler(), ScatterTokenAssembler()]
# Every combination of the library's standard stages with user-written equivalents.
VERIFIERS = [
    eqx_specdec.Verifier(*stages)
    for stages in itertools.product(RATIO_TESTS, PREFIX_COUNTERS, SAMPLERS, ASSEMBLERS)
]


def _compare(out, expected_n, expected_tokens, ambiguous):
    clear = ~ambiguous
    np.testing.assert_array_equal(
        np.asarray(out["num_accepted"])[clear], expected_n[clear]
    )
    np.testing.assert_array_equal(
        np.asarray(out["tokens"])[clear], expected_tokens[clear]
    )
    return clear.sum()


@pytest.mark.parametrize("dtype", float_dtypes())
@pytest.mark.parametrize("seed, batch, gamma, vocab", SHAPES)
def test_standard_against_reference(seed, batch, gamma, vocab, dtype):
    x, q, p, u, s = random_case(seed, batch, gamma, vocab, dtype=dtype)
    expected_n, expected_tokens, ambiguous = reference(x, q, p, u, s)
    out = jax.jit(eqx_specdec.speculative_accept)(x, q, p, u, s)
    compared = _compare(out, expected_n, expected_tokens, ambiguous)
    assert compared >= batch // 2


def test_reference_cases_cover_every_regime():
    """The random cases hold all-accept rows, first-reject rows and rows in between,
    among the rows compared exactly."""
    counts = np.zeros(3, int)
    for seed, batch, gamma, vocab in SHAPES:
        x, q, p, u, s = random_case(seed, batch, gamma, vocab)
        n, _, ambiguous = reference(x, q, p, u, s)
        n = n[~ambiguous]
        gammas = np.full_like(n, gamma)
        counts += [np.sum(n == gammas), np.sum(n == 0), np.sum((n > 0) & (n < gammas))]
    assert np.all(counts >= 10), counts


@pytest.mark.parametrize(
    "verifier",
    VERIFIERS,
    ids=lambda v: "-".join(
        type(stage).__name__
        for stage in jax.tree.leaves(v, is_leaf=lambda m: m is not v)
    ),
)
def test_user_stage_combinations_agree(verifier):
    x, q, p, u, s = random_case(11, 16, 6, 300)
    expected_n, expected_tokens, ambiguous = reference(x, q, p, u, s)
    out = eqx_specdec.speculative_accept(x, q, p, u, s, verifier=verifier)
    assert _compare(out, expected_n, expected_tokens, ambiguous) >= 8


@pytest.mark.parametrize("lenience", [1.0, 0.7, 0.3])
def test_lenient_user_ratio_test_against_adapted_reference(lenience):
    x, q, p, u, s = random_case(21, 16, 5, 200)
    expected_n, expected_tokens, ambiguous = reference(x, q, p, u, s, lenience=lenience)
    verifier = eqx_specdec.Verifier(ratio_test=LenientRatioTest(lenience))
    out = jax.jit(eqx_specdec.speculative_accept)(x, q, p, u, s, verifier=verifier)
    assert _compare(out, expected_n, expected_tokens, ambiguous) >= 8


def test_lenience_accepts_more():
    x, q, p, u, s = random_case(22, 16, 5, 200)
    counts = [
        int(
            eqx_specdec.speculative_accept(
                x, q, p, u, s, verifier=eqx_specdec.Verifier(LenientRatioTest(lenience))
            )["num_accepted"].sum()
        )
        for lenience in (1.0, 0.5, 0.05)
    ]
    # With the same uniforms a smaller l passes a superset of tokens: monotone in l.
    assert counts[0] <= counts[1] <= counts[2]
    assert counts[0] < counts[2]


@pytest.mark.parametrize("seed, batch, gamma, vocab", SHAPES)
def test_one_hot_drafts_against_reference(seed, batch, gamma, vocab):
    x, _, p, u, s = random_case(seed, batch, gamma, vocab)
    expected_n, expected_tokens, ambiguous = reference(x, None, p, u, s)
    out = jax.jit(eqx_specdec.speculative_accept)(x, None, p, u, s)
    assert _compare(out, expected_n, expected_tokens, ambiguous) >= batch // 2


def test_one_hot_drafts_equal_dense_one_hot_q():
    x, _, p, u, s = random_case(31, 16, 4, 64)
    dense = jax.nn.one_hot(x, 64, dtype=jnp.float32)
    implicit = eqx_specdec.speculative_accept(x, None, p, u, s)
    explicit = eqx_specdec.speculative_accept(x, dense, p, u, s)
    for key in ("num_accepted", "tokens"):
        np.testing.assert_array_equal(implicit[key], explicit[key])
