"""The differentiable acceptance objectives: equal to the library's exact quadrature,
gradients equal to finite differences, a user's stages as first-class as the library's,
and clear errors."""

import itertools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import eqx_specdec


X64 = jax.config.jax_enable_x64
FLOAT = jnp.float64 if X64 else jnp.float32


class UserLenientTest(eqx_specdec.AbstractRatioTest):
    """A user's lenient test with the capabilities the objective and the quadrature
    read."""

    exact: ClassVar[bool] = False
    lenience: Float[Array, ""] | float = 1.0

    def __call__(
        self, draft_tokens, draft_probs, target_probs, accept_uniforms, context
    ):
        p, q = context.gather(draft_tokens, draft_probs, target_probs)
        lenience = jnp.asarray(self.lenience, p.dtype)
        return eqx_specdec.Verdict(accept_uniforms.astype(p.dtype) * lenience * q < p)

    def pass_probabilities(self, draft_law, target_probs):
        lenience = jnp.asarray(self.lenience, draft_law.dtype)
        return jnp.minimum(1.0, target_probs / (lenience * draft_law))

    def quadrature_breakpoints(self, draft_probs, target_probs):
        with np.errstate(divide="ignore"):  # q = 0: the test always passes
            ratios = target_probs[:-1] / (self.lenience * draft_probs)
        return dict(accept_breakpoints=ratios)


class UserFirstFailureCounter(eqx_specdec.AbstractPrefixCounter):
    """The first failure by `argmin`, and its reach probabilities in log space."""

    counts: ClassVar[str] = "first failure"

    def __call__(self, passed):
        first_failure = jnp.argmin(passed).astype(jnp.int32)
        return jnp.where(jnp.all(passed), passed.shape[0], first_failure)

    def reach_probabilities(self, pass_probs):
        return jnp.exp(jnp.cumsum(jnp.log(pass_probs)))


BLOCK = eqx_specdec.Verifier(
    ratio_test=eqx_specdec.BlockRatioTest(),
    prefix_counter=eqx_specdec.LastSuccessCounter(),
)
# (verifier, whether its objective is given the draft tokens)
RULES = {
    "standard": (eqx_specdec.Verifier(), False),
    "lenient 0.6": (
        eqx_specdec.Verifier(ratio_test=eqx_specdec.LenientRatioTest(jnp.asarray(0.6))),
        False,
    ),
    "greedy": (
        eqx_specdec.Verifier(
            ratio_test=eqx_specdec.GreedyRatioTest(),
            residual_sampler=eqx_specdec.ArgmaxSampler(),
        ),
        False,
    ),
    "user test and counter": (
        eqx_specdec.Verifier(
            ratio_test=UserLenientTest(0.8), prefix_counter=UserFirstFailureCounter()
        ),
        False,
    ),
    "block (given the drafts)": (BLOCK, True),
    "standard (given the drafts)": (eqx_specdec.Verifier(), True),
}
CASES = [("peaked", 0), ("flat", 1), ("disjoint", 2)]
GAMMA, VOCAB = 3, 3


def _mean_over_drafts(verifier, q, p):
    """The objective given the drafts, averaged over all V^G drafts weighted by their
    probability under q: exact enumeration."""
    drafts = np.array(list(itertools.product(range(VOCAB), repeat=GAMMA)), np.int32)
    weights = np.prod([q[i, drafts[:, i]] for i in range(GAMMA)], axis=0)
    count = len(drafts)
    reached = eqx_specdec.evaluation.acceptance_by_position(
        jnp.asarray(np.broadcast_to(q, (count,) + q.shape), FLOAT),
        jnp.asarray(np.broadcast_to(p, (count,) + p.shape), FLOAT),
        verifier=verifier,
        draft_tokens=jnp.asarray(drafts),
    )
    return (weights[:, None] * np.asarray(reached, np.float64)).sum(0)


@pytest.mark.parametrize("rule", list(RULES))
def test_equals_exact_quadrature(rule):
    verifier, given_drafts = RULES[rule]
    for kind, seed in CASES:
        q, p, _ = eqx_specdec.evaluation.synthetic_distributions(
            kind, GAMMA, VOCAB, seed
        )
        exact = eqx_specdec.evaluation.evaluate_verifier(
            verifier, q, p, method="quadrature"
        )
        if given_drafts:
            reached = _mean_over_drafts(verifier, q, p)
        else:
            reached = np.asarray(
                eqx_specdec.evaluation.acceptance_by_position(
                    jnp.asarray(q[None], FLOAT),
                    jnp.asarray(p[None], FLOAT),
                    verifier=verifier,
                )
            )[0]
        np.testing.assert_allclose(reached, exact.reached[1:], atol=1e-5)
        if not given_drafts:
            length = eqx_specdec.evaluation.expected_accepted_length(
                jnp.asarray(q[None], FLOAT),
                jnp.asarray(p[None], FLOAT),
                verifier=verifier,
            )
            np.testing.assert_allclose(
                float(length[0]), exact.tokens_per_step - 1, atol=1e-5
            )


def test_block_given_the_drafts_beats_standard_and_is_not_the_upper_bound():
    """Block's objective is at least the standard one (Sun et al., Theorem 2), strictly
    above it here, and below the bound 1 - TV of the prefix laws, which it does not
    reach: a closed form in the rows alone would be that bound, and it is wrong."""
    q, p, _ = eqx_specdec.evaluation.synthetic_distributions("peaked", GAMMA, VOCAB, 0)
    block = _mean_over_drafts(BLOCK, q, p)
    standard = _mean_over_drafts(eqx_specdec.Verifier(), q, p)
    bound = [
        sum(
            min(np.prod(p[range(k), x]), np.prod(q[range(k), x]))
            for x in itertools.product(range(VOCAB), repeat=k)
        )
        for k in range(1, GAMMA + 1)
    ]
    assert np.all(block >= standard - 1e-6) and block.sum() > standard.sum() + 1e-3
    assert np.all(block <= np.asarray(bound) + 1e-6)
    assert block[-1] < bound[-1] - 1e-2


def _logit_case(seed, batch=2, gamma=3, vocab=5):
    rng = np.random.default_rng(seed)
    draft = jnp.asarray(rng.normal(size=(batch, gamma, vocab)), FLOAT)
    target = jnp.asarray(rng.normal(size=(batch, gamma + 1, vocab)), FLOAT)
    tokens = jnp.asarray(rng.integers(0, vocab, (batch, gamma)), jnp.int32)
    return draft, target, tokens


def _directional_check(f, x, seed):
    """`grad f . d` against the central difference of `f` along a random `d`."""
    direction = jnp.asarray(np.random.default_rng(seed).normal(size=x.shape), x.dtype)
    # The objectives are piecewise smooth (min, max, clipping): the steps are small
    # enough that no kink lies within them on these fixed cases.
    step = 1e-6 if X64 else 1e-3
    numeric = (f(x + step * direction) - f(x - step * direction)) / (2 * step)
    analytic = jnp.vdot(jax.grad(f)(x), direction)
    np.testing.assert_allclose(
        float(analytic), float(numeric), rtol=1e-6 if X64 else 1e-2, atol=1e-7
    )
    assert abs(float(analytic)) > 1e-3  # a gradient that could be wrong


@pytest.mark.parametrize(
    "rule", ["standard", "lenient 0.6", "block (given the drafts)"]
)
def test_gradients_equal_finite_differences(rule):
    verifier, given_drafts = RULES[rule]
    draft, target, tokens = _logit_case(3)
    tokens = tokens if given_drafts else None

    def objective(draft_logits, target_logits):
        return jnp.sum(
            eqx_specdec.evaluation.expected_accepted_length(
                eqx_specdec.Logits(draft_logits),
                eqx_specdec.Logits(target_logits),
                verifier=verifier,
                draft_tokens=tokens,
            )
        )

    _directional_check(lambda d: objective(d, target), draft, 0)
    _directional_check(lambda t: objective(draft, t), target, 1)


def test_logits_take_the_warps_of_verification():
    """The objectives on Logits warp as `verify` does: equal to the
    probabilities objectives on the warped softmax, with the temperature's gradient
    equal to its finite difference."""
    draft, target, _ = _logit_case(5)
    target_warp = eqx_specdec.Warp(0.7, top_k=3)
    draft_warp = eqx_specdec.Warp(1.3)
    got = eqx_specdec.evaluation.acceptance_by_position(
        eqx_specdec.Logits(draft, draft_warp), eqx_specdec.Logits(target, target_warp)
    )
    expected = eqx_specdec.evaluation.acceptance_by_position(
        eqx_specdec.Probabilities(jnp.exp(draft_warp(draft))),
        jnp.exp(target_warp(target)),
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="in one form"):
        eqx_specdec.evaluation.acceptance_by_position(
            eqx_specdec.Logits(draft), jnp.exp(target_warp(target))
        )

    def length(temperature):
        warp = eqx_specdec.Warp(temperature)
        return eqx_specdec.evaluation.expected_accepted_length(
            eqx_specdec.Logits(draft), eqx_specdec.Logits(target, warp)
        ).sum()

    _directional_check(length, jnp.asarray(0.8, FLOAT), 2)


def test_gradient_in_a_rule_parameter_under_jit():
    """The lenience's gradient: zero through the verification step (integer outputs),
    non-zero and right through the objective, under `jax.jit`."""
    draft, target, _ = _logit_case(4)
    q, p = jax.nn.softmax(draft, -1), jax.nn.softmax(target, -1)

    @jax.jit
    def objective(lenience):
        verifier = eqx_specdec.Verifier(
            ratio_test=eqx_specdec.LenientRatioTest(lenience)
        )
        return jnp.mean(
            eqx_specdec.evaluation.expected_accepted_length(q, p, verifier=verifier)
        )

    _directional_check(objective, jnp.asarray(0.7, FLOAT), 2)
    # A smaller lenience accepts more.
    assert float(jax.grad(objective)(jnp.asarray(0.7, FLOAT))) < 0


def test_one_hot_drafts_and_batch_rows():
    """One-hot drafts (`draft_probs=None`) equal dense one-hot rows, and each row of a
    batch is computed on its own."""
    draft, target, tokens = _logit_case(5)
    p = jax.nn.softmax(target, -1)
    one_hot = jax.nn.one_hot(tokens, p.shape[-1], dtype=p.dtype)
    implicit = eqx_specdec.evaluation.acceptance_by_position(
        None, p, draft_tokens=tokens
    )
    dense = eqx_specdec.evaluation.acceptance_by_position(
        one_hot, p, draft_tokens=tokens
    )
    np.testing.assert_allclose(np.asarray(implicit), np.asarray(dense), rtol=1e-6)
    expected = np.cumprod(
        np.take_along_axis(np.asarray(p)[:, :-1], np.asarray(tokens)[..., None], -1)[
            ..., 0
        ],
        axis=-1,
    )
    np.testing.assert_allclose(np.asarray(implicit), expected, rtol=1e-5)
    full = eqx_specdec.evaluation.expected_accepted_length(jax.nn.softmax(draft, -1), p)
    single = eqx_specdec.evaluation.expected_accepted_length(
        jax.nn.softmax(draft[1:2], -1), p[1:2]
    )
    np.testing.assert_allclose(float(full[1]), float(single[0]), rtol=1e-6)


class CountOnly(eqx_specdec.AbstractPrefixCounter):
    counts: ClassVar[str] = "passes"

    def __call__(self, passed):
        return jnp.sum(passed, dtype=jnp.int32)


def test_errors_name_the_argument_and_the_fix():
    draft, target, tokens = _logit_case(6)
    q, p = jax.nn.softmax(draft, -1), jax.nn.softmax(target, -1)
    with pytest.raises(ValueError, match="BlockRatioTest.*Pass `draft_tokens`"):
        eqx_specdec.evaluation.expected_accepted_length(q, p, verifier=BLOCK)
    with pytest.raises(
        eqx_specdec.MissingCapabilityError,
        match="^CountOnly does not implement `reach_probabilities`",
    ):
        eqx_specdec.evaluation.expected_accepted_length(
            q,
            p,
            verifier=eqx_specdec.Verifier(
                prefix_counter=CountOnly(), allow_mismatch=True
            ),
        )
    with pytest.raises(
        ValueError, match=r"^expected_accepted_length: `draft_probs` must have shape"
    ):
        eqx_specdec.evaluation.expected_accepted_length(q[:, 1:], p)
    with pytest.raises(ValueError, match="`draft_tokens` must have shape"):
        eqx_specdec.evaluation.acceptance_by_position(q, p, draft_tokens=tokens[:, 1:])
    with pytest.raises(ValueError, match=r"`draft_probs=None`\) need `draft_tokens`"):
        eqx_specdec.evaluation.acceptance_by_position(None, p)
    with pytest.raises(TypeError, match="`verifier` must verify chains"):
        eqx_specdec.evaluation.acceptance_by_position(
            q, p, verifier=eqx_specdec.TreeVerifier()
        )
