"""Every verifier knows whether it is exact, and no composition is silently lossy.

The table is every ratio test x prefix counter x residual sampler the library ships, with
a user-style subclass in each family. Each combination is either refused when it is
built (an exact test with a counter or sampler that does not fit it), exact (`exact` is
True) or lossy by declaration (`exact` is False). Exact quadrature then checks the
claims: every exact combination emits its target to float rounding, every refused one
(built anyway, by name) and every lossy rule is measurably off."""

import itertools

import jax
import numpy as np
import pytest
from helpers import accept_from_key
from user_stages import (
    ArgminPrefixCounter,
    LenientRatioTest as UserLenientRatioTest,
    SearchsortedSampler,
    TopKArgmaxSampler,
)

import eqx_specdec as es


RATIO_TESTS = {
    "standard": es.RatioTest(),
    "greedy": es.GreedyRatioTest(),
    "block": es.BlockRatioTest(),
    "lenient": es.LenientRatioTest(0.5),
    "typical": es.TypicalRatioTest(),
    "synthetic": es.SyntheticRatioTest(0.5),
    "top-n": es.TopNRelaxedRatioTest(),
    "fly": es.FLyRatioTest(window=1),  # the default window of 6 exceeds G
    "scheduled": es.ScheduledRatioTest(),
    "user-lenient": UserLenientRatioTest(0.5),
}
COUNTERS = {
    "first-failure": es.PrefixCounter(),
    "last-success": es.LastSuccessCounter(),
    "user-argmin": ArgminPrefixCounter(),
}
SAMPLERS = {
    "residual": es.ResidualSampler(),
    "gumbel": es.GumbelSampler(),
    "argmax": es.ArgmaxSampler(),
    "typical": es.TypicalSampler(),
    "user-searchsorted": SearchsortedSampler(),
    "user-top-k-argmax": TopKArgmaxSampler(),
}
COMBINATIONS = list(itertools.product(RATIO_TESTS, COUNTERS, SAMPLERS))

# G = 2, V = 3: rows that differ by position, where every lossy rule and every misfit
# moves the emitted distribution by more than 0.01 (checked below).
TARGET = np.array([[0.5, 0.3, 0.2], [0.15, 0.25, 0.6], [0.3, 0.45, 0.25]])
DRAFT = np.array([[0.2, 0.2, 0.6], [0.5, 0.35, 0.15]])


def _fits(test, counter, sampler) -> bool:
    return counter.counts == test.counter.counts and sampler.draws == test.sampler.draws


def _build(names, allow_mismatch=False):
    test, counter, sampler = (
        table[name] for table, name in zip((RATIO_TESTS, COUNTERS, SAMPLERS), names)
    )
    return es.Verifier(test, counter, sampler, allow_mismatch=allow_mismatch)


def law(test):
    """The law an exact composition follows: greedy decoding of the target (the one-hot
    of its argmax) for greedy verification, the target itself for every sampling rule;
    a lossy one is measured against the target."""
    if isinstance(test, es.GreedyRatioTest):
        return np.eye(TARGET.shape[-1])[TARGET.argmax(-1)]
    return TARGET


def test_every_combination_is_refused_exact_or_lossy_by_declaration():
    """The whole table, at construction (nothing compiles): an exact test refuses a
    counter or sampler that does not fit it, naming both; every verifier built says
    whether it is exact, and `allow_mismatch=True` builds the refused ones as lossy."""
    kinds = {"refused": 0, "exact": 0, "lossy": 0}
    for names in COMBINATIONS:
        test, counter, sampler = (
            table[name] for table, name in zip((RATIO_TESTS, COUNTERS, SAMPLERS), names)
        )
        fits = _fits(test, counter, sampler)
        if test.exact and not fits:
            with pytest.raises(ValueError, match="does not fit") as error:
                _build(names)
            message = str(error.value)
            assert type(test).__name__ in message and "allow_mismatch=True" in message
            misfit = sampler if sampler.draws != test.sampler.draws else counter
            assert type(misfit).__name__ in message
            assert not _build(names, allow_mismatch=True).exact
            kinds["refused"] += 1
        else:
            verifier = _build(names)
            assert verifier.exact is (test.exact and fits)
            kinds["exact" if verifier.exact else "lossy"] += 1
    # Standard: 2 counters x 3 samplers (Gumbel and a user's sampler draw the
    # residual); greedy: 2 x 2; block: 1 x 3.
    assert kinds == {"refused": 41, "exact": 13, "lossy": 126}


def test_a_rule_brings_the_stages_its_law_needs():
    """The issue's example: the block test alone is block verification, exact."""
    block = es.Verifier(ratio_test=es.BlockRatioTest())
    assert isinstance(block.prefix_counter, es.LastSuccessCounter) and block.exact
    greedy = es.Verifier(es.GreedyRatioTest())
    assert isinstance(greedy.residual_sampler, es.ArgmaxSampler) and greedy.exact
    assert not es.Verifier(es.TypicalRatioTest()).exact
    sharded = es.ShardedVerifier(block, jax.make_mesh((1,), ("batch",)), "batch")
    assert sharded.exact


def _quadrature_cases():
    cases = []
    for names in COMBINATIONS:
        test, counter, sampler = (
            table[name] for table, name in zip((RATIO_TESTS, COUNTERS, SAMPLERS), names)
        )
        if names[2] == "gumbel":
            continue  # key-driven: by Monte Carlo below
        user = any(name.startswith("user") for name in names)
        if test.exact and _fits(test, counter, sampler):
            cases.append(pytest.param(names, "exact", id="-".join(names)))
        elif test.exact and not user:
            cases.append(pytest.param(names, "refused", id="-".join(names)))
    for name, test in RATIO_TESTS.items():
        if not test.exact:  # each lossy rule with its own stages
            cases.append(pytest.param((name,), "lossy", id=f"{name}-own-stages"))
    return cases


@pytest.mark.parametrize("names, kind", _quadrature_cases())
def test_exactness_agrees_with_quadrature(names, kind):
    if len(names) == 1:
        verifier = es.Verifier(RATIO_TESTS[names[0]])
    else:
        verifier = _build(names, allow_mismatch=kind == "refused")
    assert verifier.exact is (kind == "exact")
    test = verifier.ratio_test
    extra = {}
    if isinstance(test, UserLenientRatioTest):  # a user's rule, without breakpoints
        with np.errstate(divide="ignore"):
            extra["accept_breakpoints"] = TARGET[:-1] / (0.5 * DRAFT)
    if isinstance(verifier.residual_sampler, (SearchsortedSampler, TopKArgmaxSampler)):
        # Users' samplers without breakpoints: the residual's cuts (which the
        # quadrature always makes) are all they need.
        extra["sample_breakpoints"] = np.zeros(0)
    estimate = es.evaluation.emission_by_quadrature(verifier, DRAFT, TARGET, **extra)
    error = estimate.max_error(law(test))
    if kind == "exact":
        assert error < 1e-6
    else:
        assert error > 0.01


@pytest.mark.parametrize(
    "verifier",
    [
        es.Verifier(residual_sampler=es.GumbelSampler()),
        es.Verifier(es.BlockRatioTest(), residual_sampler=es.GumbelSampler()),
        es.Verifier(es.RatioTest(), ArgminPrefixCounter(), es.GumbelSampler()),
    ],
    ids=["standard", "block", "user-counter"],
)
def test_exact_key_driven_combinations_by_monte_carlo(verifier):
    assert verifier.exact
    estimate = es.evaluation.emission_by_monte_carlo(
        verifier, DRAFT, TARGET, jax.random.key(7), 30_000
    )
    stats = estimate.chi_square(TARGET)
    reached = estimate.reached > 0
    assert np.all(stats["statistic"][reached] < stats["threshold"][reached])


def test_exact_only_refuses_every_lossy_verifier_on_every_entry_point():
    tokens, q, p, u, s = es.example_inputs(batch=2, gamma=2, vocab=5)
    lossy = es.Verifier(es.LenientRatioTest(0.5))
    mismatched = es.Verifier(
        es.RatioTest(), residual_sampler=es.ArgmaxSampler(), allow_mismatch=True
    )
    for verifier, why in ((lossy, "LenientRatioTest declares"), (mismatched, "fit")):
        with pytest.raises(ValueError, match=f"exact_only=True.*{why}"):
            es.speculative_accept(
                tokens, q, p, u, s, verifier=verifier, exact_only=True
            )
        with pytest.raises(ValueError, match=r"verify\(exact_only=True\)"):
            accept_from_key(
                jax.random.key(0), tokens, q, p, verifier=verifier, exact_only=True
            )
    draft, target = es.demo.builtin_models()
    prompts = np.zeros((1, 2), np.int32)
    with pytest.raises(ValueError, match="speculative_decode.*not exact"):
        es.speculative_decode(
            draft, target, prompts, None, 4, jax.random.key(0),
            verifier=lossy, exact_only=True,
        )  # fmt: skip
    # An exact verifier passes, and gives what it gives without the switch.
    exact = es.speculative_accept(tokens, q, p, u, s, exact_only=True)
    plain = es.speculative_accept(tokens, q, p, u, s)
    np.testing.assert_array_equal(exact["tokens"], plain["tokens"])
    with pytest.raises(TypeError, match="exact_only"):
        es.speculative_accept(tokens, q, p, u, s, exact_only="yes")
