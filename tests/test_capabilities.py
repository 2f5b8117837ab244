"""A user's rule is as first-class as the library's own.

A lenient rule written from scratch against the abstract base (the worked example of
"Writing a custom stage", docs/custom_stage.md) equals `LenientRatioTest` bit for bit
wherever the library uses a rule's capabilities: one-device verification, vocabulary-
sharded verification, the decoding loop's theory and exact quadrature. A rule without a
capability gets `MissingCapabilityError` naming the method to write, on every path."""

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case
from lossless_cases import distributions
from user_stages import (
    DraftlessIIDRule,
    LenientRatioTest as BareLenientRatioTest,
    MyLenientRatioTest,
)

import eqx_specdec as es
from eqx_specdec._capabilities import has_capability


LENIENCES = [0.3, 0.7, 1.0]


def _pair(lenience):
    """The library's rule and the user's, in otherwise identical verifiers."""
    return (
        es.Verifier(es.LenientRatioTest(lenience)),
        es.Verifier(MyLenientRatioTest(lenience)),
    )


def _assert_same(a, b):
    for key in ("num_accepted", "tokens"):
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))


@pytest.mark.parametrize("one_hot", [False, True], ids=["sampled", "one-hot"])
@pytest.mark.parametrize("lenience", LENIENCES)
def test_one_device_verification_is_bit_for_bit(lenience, one_hot):
    x, q, p, u, s = random_case(3, 32, 5, 64)
    q = None if one_hot else q
    library, user = _pair(lenience)
    out_library = es.speculative_accept(x, q, p, u, s, verifier=library)
    out_user = es.speculative_accept(x, q, p, u, s, verifier=user)
    _assert_same(out_library, out_user)
    assert 0 < np.asarray(out_user["num_accepted"]).mean() < 5  # both outcomes occur


@pytest.mark.parametrize("lenience", [0.5, 1.0])
def test_vocabulary_sharded_verification_is_bit_for_bit(lenience):
    mesh = jax.make_mesh((8,), ("vocab",))
    x, q, p, u, s = random_case(4, 16, 4, 512)
    library, user = _pair(lenience)
    outs = [
        es.speculative_accept(
            x, q, p, u, s, verifier=es.ShardedVerifier(v, mesh, vocab_axis="vocab")
        )
        for v in (library, user)
    ]
    _assert_same(*outs)
    # And equal to one device, on this case (no uniform near a rounding boundary).
    _assert_same(outs[1], es.speculative_accept(x, q, p, u, s, verifier=library))


def test_decoding_loop_theory_is_bit_for_bit():
    draft, target = es.demo.builtin_models()
    prompts = np.stack([es.demo.encode("the "), es.demo.encode("and ")])
    results = [
        es.speculative_decode(
            draft, target, prompts, None, 24, jax.random.key(1), verifier=v
        )  # fmt: skip
        for v in _pair(0.5)
    ]
    np.testing.assert_array_equal(results[0].tokens, results[1].tokens)
    np.testing.assert_array_equal(results[0].theory_reached, results[1].theory_reached)
    assert results[1].theory == "exact"
    assert np.isfinite(results[1].theoretical_tokens_per_call())


@pytest.mark.parametrize("lenience", [0.4, 0.8])
def test_exact_quadrature_is_bit_for_bit(lenience):
    q, p, _ = distributions("peaked", 2, 5, 0)
    library, user = _pair(lenience)
    results = [es.evaluation.evaluate_verifier(v, q, p) for v in (library, user)]
    assert results[0].method == results[1].method == "quadrature"
    assert results[0].as_dict() == results[1].as_dict()
    # Exact: the lenient rule's emission has a closed form at the first position,
    # P(x) = q(x) min(1, p/(l q)) + (1 - sum) residual(x) / total.
    accept = np.minimum(1, p[0] / (lenience * q[0]))
    passed = q[0] * accept
    residual = np.maximum(p[0] - q[0], 0)
    emitted = passed + (1 - passed.sum()) * residual / residual.sum()
    tv = 0.5 * np.abs(emitted - p[0]).sum()
    assert abs(results[1].distance_per_position[0] - tv) < 1e-6


def _decode_theory(verifier):
    draft, target = es.demo.builtin_models()
    result = es.speculative_decode(
        draft, target, es.demo.encode("the ")[None], None, 8, jax.random.key(0),
        verifier=verifier,
    )  # fmt: skip
    assert result.theory == "none"
    return result.theoretical_tokens_per_call()


def _tree_case():
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(3), size=4)
    p = rng.dirichlet(np.ones(3), size=4)
    return q, p


MISSING = [
    (
        "vocabulary sharding",
        lambda: es.ShardedVerifier(
            es.Verifier(BareLenientRatioTest(0.5)),
            jax.make_mesh((8,), ("vocab",)),
            vocab_axis="vocab",
        ),
        "LenientRatioTest does not declare `vocab_parallel = True`",
    ),
    (
        "quadrature",
        lambda: es.evaluation.emission_by_quadrature(
            es.Verifier(BareLenientRatioTest(0.5)), *distributions("flat", 2, 4, 0)[:2]
        ),
        "LenientRatioTest does not implement `quadrature_breakpoints`",
    ),
    (
        "evaluate, quadrature",
        lambda: es.evaluation.evaluate_verifier(
            es.Verifier(BareLenientRatioTest(0.5)),
            *distributions("flat", 2, 4, 0)[:2],
            method="quadrature",
        ),
        "LenientRatioTest does not implement `quadrature_breakpoints`",
    ),
    (
        "decoding-loop theory",
        lambda: _decode_theory(es.Verifier(BareLenientRatioTest(0.5))),
        "no theoretical acceptance .* does not implement `pass_probabilities`",
    ),
    (
        "tree drafting in the loop",
        lambda: es.speculative_decode(
            *es.demo.builtin_models(),
            es.demo.encode("the ")[None],
            None,
            8,
            jax.random.key(0),
            verifier=es.TreeVerifier(DraftlessIIDRule(), tree=(-1, 0)),
        ),  # fmt: skip
        "DraftlessIIDRule does not implement `candidate_law`",
    ),
    (
        "tree drafting in the tools",
        lambda: es.evaluation.emission_by_monte_carlo(
            es.TreeVerifier(DraftlessIIDRule(), tree=(-1, -1, 0)),
            *_tree_case(),
            jax.random.key(0),
            100,
        ),  # fmt: skip
        "DraftlessIIDRule does not implement `candidate_law`",
    ),
    (
        "Gumbel quadrature",
        lambda: es.evaluation.evaluate_verifier(
            es.Verifier(residual_sampler=es.GumbelSampler()),
            *distributions("flat", 2, 4, 0)[:2],
            method="quadrature",
        ),
        "GumbelSampler does not implement `quadrature_breakpoints`",
    ),
    (
        "objective",
        lambda: es.evaluation.expected_accepted_length(
            *(jnp.asarray(a[None]) for a in distributions("flat", 2, 4, 0)[:2]),
            verifier=es.Verifier(BareLenientRatioTest(0.5)),
        ),
        "`pass_probabilities`, which the acceptance objectives "
        r"\(expected_accepted_length\) needs",
    ),
    (
        "schedule of a rule without the capability",
        lambda: es.evaluation.emission_by_quadrature(
            es.Verifier(es.ScheduledRatioTest(relaxed=BareLenientRatioTest(0.5))),
            *distributions("flat", 2, 4, 0)[:2],
        ),
        "LenientRatioTest does not implement `quadrature_breakpoints`",
    ),
]


def test_a_composite_has_a_capability_when_its_parts_have_it():
    """`capabilities_from` is the one way to delegate: a schedule of two tests has
    `pass_probabilities` only if both tests do; declared, so read before tracing. A
    tree verifier's `forced_walk` needs nothing of its node rule (the threshold is
    derived from the rule's `ratio`), but the tree's quadrature drafts its children
    with the rule's `candidate_law`."""
    schedule = es.ScheduledRatioTest()
    assert has_capability(schedule, "pass_probabilities")
    bare = es.ScheduledRatioTest(relaxed=BareLenientRatioTest(0.5))
    assert not has_capability(bare, "pass_probabilities")
    assert schedule.theory == "exact"
    assert es.ScheduledRatioTest(relaxed=es.FLyRatioTest()).theory == "lower bound"
    assert has_capability(es.TreeVerifier(), "forced_walk")
    assert has_capability(es.TreeVerifier(DraftlessIIDRule()), "forced_walk")
    with pytest.raises(
        es.MissingCapabilityError,
        match="DraftlessIIDRule does not implement `candidate_law`",
    ):
        es.evaluation.emission_by_quadrature(
            es.TreeVerifier(DraftlessIIDRule(), tree=(-1, 0)),
            *distributions("flat", 2, 4, 0)[:2],
        )


@pytest.mark.parametrize(
    "call, message", [m[1:] for m in MISSING], ids=[m[0] for m in MISSING]
)
def test_a_missing_capability_is_a_clear_error_naming_the_method(call, message):
    with pytest.raises(es.MissingCapabilityError, match=message):
        call()


def test_evaluation_falls_back_to_monte_carlo_without_breakpoints():
    q, p, _ = distributions("flat", 2, 4, 0)
    result = es.evaluation.evaluate_verifier(
        es.Verifier(BareLenientRatioTest(1.0)), q, p, num_draws=20_000
    )
    assert result.method == "monte-carlo" and result.chi_square.passed


class MissingCutsRatioTest(es.AbstractRatioTest):
    """The lenient test, with breakpoints that leave out its own cuts $p / (l q)$."""

    exact: ClassVar[bool] = False
    inner: es.LenientRatioTest

    def __call__(
        self, draft_tokens, draft_probs, target_probs, accept_uniforms, context
    ):
        return self.inner(
            draft_tokens, draft_probs, target_probs, accept_uniforms, context
        )

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}


def test_quadrature_refuses_cells_on_which_the_tokens_change():
    """Exact quadrature checks its own cells: tokens constant across each cell's
    points. A rule missing a cut raises, naming its class, instead of returning an
    inexact number; where no cut is missing the result equals the library's."""
    rule = MissingCutsRatioTest(es.LenientRatioTest(0.5))
    q, p, _ = distributions("peaked", 2, 5, 0)
    with pytest.raises(
        ValueError, match="MissingCutsRatioTest.*quadrature_breakpoints"
    ):
        es.evaluation.emission_by_quadrature(es.Verifier(rule), q, p)
    q, p, _ = distributions("flat", 2, 5, 0)  # every p / (l q) is above 1: no cut
    ours = es.evaluation.emission_by_quadrature(es.Verifier(rule), q, p)
    library = es.evaluation.emission_by_quadrature(
        es.Verifier(es.LenientRatioTest(0.5)), q, p
    )
    np.testing.assert_allclose(ours.emitted, library.emitted, atol=1e-12)
