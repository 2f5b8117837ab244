"""A rule written once, as its acceptance function: the capped rule of "Writing a custom
stage" (docs/custom_stage.md), `Capped`, is five lines, and the library derives the
rest. Its verdict is the standard one at c = 1 bit for bit, on probabilities and on
logits; its derived correction makes it lossless (quadrature, chains and trees, sampled
and one-hot drafts); its closed-form emission equals quadrature's, for the lossy lenient
rule too; the same rule object verifies a chain-shaped tree with the chain's tokens; a
rule that lies about its exactness is caught at run time and by the evaluation tools; a
stage that would not see the test's parameters is refused."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_logits, caught_false_claim, random_case, tree_accept
from lossless_cases import distributions
from user_stages import Capped

import eqx_specdec as es


class Overeager(es.AbstractThresholdRule):
    """A lossy rule that does not say so: t = 2p accepts more than p where p < q."""

    def acceptance(self, p, q, context):
        return context.times(p, 2.0)


class _CappedSampler(es.AbstractResidualSampler):
    """The capped rule's correction written by hand, norm((p - min(q, c p))_+), with
    its own copy of c."""

    c: float = 1.0
    randomness: ClassVar[str] = "uniform"
    draws: ClassVar[str] = "residual"

    def __call__(self, n, verdict, x, q, p, s, context=es.RowContext()):
        gamma, row = x.shape[0], p[n]
        q_n = q[jnp.minimum(n, gamma - 1)]
        kept = jnp.maximum(row - jnp.minimum(q_n, self.c * row), 0)
        weights = jnp.where((n < gamma) & (jnp.sum(kept) > 0), kept, row)
        cdf = jnp.cumsum(weights) / jnp.sum(weights)
        y = jnp.searchsorted(cdf, s.astype(cdf.dtype), side="right")
        return jnp.minimum(y, row.shape[0] - 1).astype(jnp.int32)


class _CappedWithClassSampler(es.AbstractRatioTest):
    """The capped test naming its correction at class level, where it cannot see c."""

    c: float
    exact: ClassVar[bool] = True
    sampler: ClassVar[es.AbstractResidualSampler] = _CappedSampler(1.0)

    def __call__(self, x, q, p, u, context=es.RowContext()):
        return Capped(jnp.asarray(self.c))(x, q, p, u, context)


def _capped(c):
    return es.Verifier(Capped(jnp.asarray(c, jnp.float32)))


def test_at_c_one_the_capped_rule_is_the_standard_rule_bit_for_bit():
    """Probabilities and logits (log space), sampled and one-hot drafts: the derived
    verdict and correction give the standard rule's tokens."""
    x, q, p, u, s = random_case(0, 16, 4, 50)
    for draft in (q, None):
        ours = es.speculative_accept(x, draft, p, u, s, verifier=_capped(1.0))
        standard = es.speculative_accept(x, draft, p, u, s)
        np.testing.assert_array_equal(ours["tokens"], standard["tokens"])
    logits = (jnp.log(q), jnp.log(p))
    ours = accept_logits(x, *logits, u, s, verifier=_capped(1.0))
    standard = accept_logits(x, *logits, u, s)
    np.testing.assert_array_equal(ours["tokens"], standard["tokens"])


def test_a_sweep_of_c_compiles_once_and_accepts_less():
    x, q, p, u, s = random_case(1, 64, 4, 50)

    @eqx.debug.assert_max_traces(max_traces=1)
    def accepted(verifier):
        out = es.speculative_accept(x, q, p, u, s, verifier=verifier)
        return out["num_accepted"].mean()

    step = eqx.filter_jit(accepted)
    means = [float(step(_capped(c))) for c in (1.0, 0.5, 0.25)]
    assert means[0] > means[1] > means[2] > 0


@pytest.mark.parametrize("kind", ["flat", "one-hot implicit"])
def test_the_derived_correction_makes_the_capped_rule_lossless(kind):
    """Quadrature of the verifier's own tokens (not a formula) finds the target, and
    the closed form, computed from the rule alone, equals quadrature's emission."""
    q, p, law = distributions(kind, 2, 3, 0)
    verifier = _capped(0.5)
    assert verifier.exact
    by_quadrature = es.evaluation.emission_by_quadrature(verifier, q, p, draft_law=law)
    assert by_quadrature.max_error(p) < 1e-6
    closed = es.evaluation.emission_in_closed_form(verifier, q, p, draft_law=law)
    np.testing.assert_allclose(closed.emitted, by_quadrature.emitted, atol=1e-6)
    np.testing.assert_allclose(closed.reached, by_quadrature.reached, atol=1e-6)


def test_a_lossy_rule_is_exactly_as_far_from_the_target_as_its_excess():
    """Lenient acceptance, lossy by declaration: closed form and quadrature agree, and
    the distance at the first position is its excess sum (min(q, p / l) - p)_+, the
    least any correction allows."""
    q, p, _ = distributions("peaked", 2, 4, 1)
    verifier = es.Verifier(es.LenientRatioTest(0.5))
    assert not verifier.exact
    closed = es.evaluation.evaluate_verifier(verifier, q, p, method="closed-form")
    exact = es.evaluation.evaluate_verifier(verifier, q, p, method="quadrature")
    np.testing.assert_allclose(
        closed.distance_per_position[:2], exact.distance_per_position[:2], atol=1e-6
    )
    excess = np.maximum(np.minimum(q[0], p[0] / 0.5) - p[0], 0).sum()
    assert closed.distance_per_position[0] == pytest.approx(excess, abs=1e-6)
    assert excess > 0.01
    assert closed.tokens_per_step == pytest.approx(exact.tokens_per_step, abs=1e-6)


def test_one_rule_on_a_chain_and_a_tree():
    """The same rule object: on a chain-shaped tree, i.i.d. and without replacement,
    the chain's tokens; on a tree of two candidates and a grandchild, lossless by
    quadrature; its threshold is the chain's."""
    rule = Capped(jnp.asarray(0.5, jnp.float32))
    x, q, p, u, s = random_case(2, 16, 3, 20)
    chain = es.speculative_accept(x, q, p, u, s, verifier=es.Verifier(rule))
    parents = jnp.broadcast_to(jnp.arange(-1, 2, dtype=jnp.int32), x.shape)
    rows = jnp.concatenate([q, q[:, -1:]], axis=1)  # the tree's row after each node
    for node_rule in (es.IIDCandidates(rule), es.WithoutReplacementCandidates(rule)):
        tree = tree_accept(
            x, parents, rows, p, u, s, verifier=es.TreeVerifier(node_rule)
        )
        np.testing.assert_array_equal(tree["tokens"], chain["tokens"])
    q, p, _ = distributions("flat", 4, 3, 3)
    verifier = es.TreeVerifier(es.IIDCandidates(rule), tree=(-1, -1, 0))
    assert verifier.exact
    assert es.evaluation.evaluate_verifier(verifier, q, p[:4]).distance < 1e-6


def test_a_false_claim_is_caught_at_run_time_and_by_the_tools():
    """A rule that declares itself exact (by default) and accepts more than the target
    holds: the entry points' checks raise naming it, called directly and under a
    caller's `jax.jit`; unchecked it runs; the evaluation tools raise on the claim."""
    x, q, p, u, s = random_case(3, 8, 3, 20)
    verifier = es.Verifier(Overeager())
    assert verifier.exact
    with pytest.raises(RuntimeError, match="Overeager \\(the ratio test\\)"):
        es.speculative_accept(x, q, p, u, s, verifier=verifier)
    with pytest.raises(Exception, match="min\\(q, t\\) > p"):
        jax.jit(lambda *a: es.speculative_accept(*a, verifier=verifier))(x, q, p, u, s)
    es.speculative_accept(x, q, p, u, s, verifier=verifier, check_inputs="off")
    # Asked for exactness, with the checks off, an unproven claim is refused.
    with pytest.raises(ValueError, match="Overeager's exactness rests on the bound"):
        es.speculative_accept(
            x, q, p, u, s, verifier=verifier, check_inputs="off", exact_only=True
        )
    q, p, _ = distributions("flat", 2, 3, 0)
    distance = caught_false_claim(
        lambda: es.evaluation.evaluate_verifier(verifier, q, p), verifier
    )
    assert distance > 0.01


def test_a_parameterised_class_level_sampler_is_refused():
    """The sampler a test names at class level cannot see the test's fields: refused,
    naming both classes, instead of verifying with the class attribute's c."""
    with pytest.raises(
        ValueError, match="_CappedWithClassSampler names _CappedSampler"
    ):
        es.Verifier(_CappedWithClassSampler(0.5))
    # Passed explicitly it is the caller's choice, and the tools hold it to the claim.
    verifier = es.Verifier(
        _CappedWithClassSampler(0.5), residual_sampler=_CappedSampler()
    )
    q, p, _ = distributions("peaked", 2, 3, 0)
    caught_false_claim(
        lambda: es.evaluation.evaluate_verifier(verifier, q, p, num_draws=20_000),
        verifier,
    )


def test_evaluation_beyond_quadrature_tells_the_truth():
    """V = 4,096, G = 3: quadrature does not apply, and the closed form is exact. Monte
    Carlo with too few draws for its vocabulary (V = 64: fewer than 5 draws per token)
    reports its positions as not measured, never as the headline distance."""
    q, p, _ = distributions("flat", 3, 4096, 4)
    exact = es.evaluation.evaluate_verifier(es.Verifier(), q, p)
    assert exact.method == "closed-form" and exact.distance < 1e-6
    q, p, _ = distributions("flat", 1, 64, 4)
    sampled = es.evaluation.evaluate_verifier(
        es.Verifier(), q, p, method="monte-carlo", num_draws=200
    )
    assert all(sampled.under_sampled) and sampled.distance is None
    assert "not measured" in str(sampled)
    closed = es.evaluation.evaluate_verifier(es.Verifier(), q, p, method="closed-form")
    assert sampled.tokens_per_step == pytest.approx(closed.tokens_per_step, abs=0.1)


def test_with_the_checks_off_an_invalid_row_is_never_a_token():
    """The derived correction keeps a row's invalid values visible: an infinite draft
    probability or a NaN target on the row a correction is drawn from gives -1, for the
    standard and the capped rule alike; with the checks on it is an error."""
    x, q, p, u, s = random_case(5, 4, 3, 40)
    q, p = np.array(q), np.array(p)
    for i in range(3):  # every row of sequence 0's q, at a token not drafted there
        q[0, i, (x[0, i] + 1) % 40] = np.inf
    p[1, :, 3] = np.nan  # every row of sequence 1's p
    for verifier in (es.Verifier(), _capped(0.5)):
        out = es.speculative_accept(
            x, q, p, u, s, verifier=verifier, check_inputs="off"
        )
        n, tokens = np.asarray(out["num_accepted"]), np.asarray(out["tokens"])
        np.testing.assert_array_equal(tokens[[0, 1], n[:2]], [-1, -1])
        with pytest.raises(RuntimeError):
            es.speculative_accept(x, q, p, u, s, verifier=verifier)


def test_greedy_with_the_checks_off_gives_no_token_for_a_row_without_a_maximum():
    """Greedy verification reads the argmax alone (on logits, the warped logits as they
    are): a row holding a NaN or +inf, or one without mass (every logit -inf, every
    probability 0), has no most likely token, so its position never passes and the
    correction drawn from it is -1, on logits and on probabilities."""
    batch, gamma, vocab = 4, 3, 40
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((batch, gamma + 1, vocab)).astype(np.float32)
    tokens = np.argmax(logits[:, :gamma], -1).astype(np.int32)  # every draft passes
    logits[0, 1, 5] = np.nan
    logits[1, 0] = -np.inf
    logits[2, 2, tokens[2, 2]] = np.inf
    greedy = es.Verifier(es.GreedyRatioTest())
    key = jax.random.key(0)
    out = es.verify(
        es.Logits(jnp.asarray(logits), es.Warp(0.7, top_k=5)),
        es.Draft(jnp.asarray(tokens)),
        key,
        verifier=greedy,
        check_inputs="off",
    )
    np.testing.assert_array_equal(out.num_accepted, [1, 0, 2, gamma])
    np.testing.assert_array_equal(
        np.asarray(out.tokens)[[0, 1, 2], [1, 0, 2]], [-1, -1, -1]
    )
    probs = np.array(jax.nn.softmax(jnp.asarray(logits), -1))
    probs[1, 0] = 0.0
    out = es.verify(
        es.Probabilities(jnp.asarray(probs)),
        es.Draft(jnp.asarray(tokens)),
        key,
        verifier=greedy,
        check_inputs="off",
    )
    np.testing.assert_array_equal(out.num_accepted[:2], [1, 0])
    np.testing.assert_array_equal(np.asarray(out.tokens)[[0, 1], [1, 0]], [-1, -1])


@pytest.mark.parametrize("by_blocks", [True, False], ids=["blocks", "XLA's argmax"])
def test_both_forms_of_the_row_argmax_are_the_first_maximum(by_blocks, monkeypatch):
    """The row argmax in either backend's form (the CPU's through block maxima, XLA's
    argmax elsewhere) is NumPy's first maximum, ties and a shifted last window
    included, and `width` for a row holding a NaN or +inf or without mass."""
    from eqx_specdec import _search

    monkeypatch.setattr(_search, "argmax_by_blocks", lambda: by_blocks)
    rng = np.random.default_rng(9)
    width = 1000  # blocks of 32, the last one shorter
    values = np.round(rng.normal(size=(7, width)) * 2).astype(np.float32)  # ties
    values[1, -3:] = 50.0  # the maximum in the last, shifted window
    values[2, 990] = np.nan
    values[3] = -np.inf
    values[4, 10] = np.inf
    got = _search.first_argmax(jnp.asarray(values), log_space=True)
    expected = np.argmax(values, -1)
    expected[2:5] = width
    np.testing.assert_array_equal(got, expected)
    probs = np.abs(values[[0, 1, 5, 6]])
    probs[2] = 0.0
    got = _search.first_argmax(jnp.asarray(probs), log_space=False)
    np.testing.assert_array_equal(
        got, [*np.argmax(probs[:2], -1), width, probs[3].argmax()]
    )


class _FlippedGather(es.AbstractRatioTest):
    """A user's test declaring it reads the draft tokens' values, gathered from rows
    of its own making (each row reversed): `context.gather` must read those."""

    exact: ClassVar[bool] = False
    reads: ClassVar[str] = "draft tokens"

    def __call__(self, draft_tokens, draft_probs, target_probs, accept, context):
        flipped = None if draft_probs is None else jnp.flip(draft_probs, -1)
        p_x, q_x = context.gather(draft_tokens, flipped, jnp.flip(target_probs, -1))
        return es.Verdict(accept * q_x < p_x)


def test_values_gathered_with_the_batch_are_only_those_of_the_rows_given():
    """Mapping rows one by one, the draft tokens' values are gathered with the whole
    batch's and `RowContext.gather` returns them for the row's own arrays only: a test
    gathering from rows of its own making reads those, as under `vmap` (where nothing
    is gathered ahead) and as NumPy computes it."""
    x, q, p, u, s = random_case(8, 6, 4, 30)
    accepted = {}
    for batching in ("map", "vmap"):
        verifier = es.Verifier(_FlippedGather(), batching=batching, allow_mismatch=True)
        out = es.speculative_accept(
            x, q, p, u, s, verifier=verifier, check_inputs="off"
        )
        accepted[batching] = np.asarray(out["num_accepted"])
    q, p, x, u = (np.asarray(a) for a in (q, p, x, u))
    rows, positions = np.indices(x.shape)
    p_x = p[:, :-1][rows, positions, 29 - x]
    q_x = q[rows, positions, 29 - x]
    expected = np.cumprod(u * q_x < p_x, axis=1).sum(1)
    np.testing.assert_array_equal(accepted["map"], expected)
    np.testing.assert_array_equal(accepted["vmap"], expected)
