"""Trees in the losslessness tools: exact quadrature (every token assignment, cells at
every reachable pass threshold) and Monte Carlo, through `evaluate_verifier`, for the
library's node rules and a user's."""

from typing import ClassVar

import jax
import numpy as np
import pytest
from helpers import caught_false_claim
from user_stages import UserIIDCandidates

import eqx_specdec as es


RULES = [
    es.IIDCandidates(),
    es.WithoutReplacementCandidates(),
    es.DeterministicCandidates(),
    UserIIDCandidates(),
]
TREES = [(-1,), (-1, -1, 0), (-1, 0, -1, 2)]


def _case(tree, vocab=3, seed=0):
    rng = np.random.default_rng(seed)
    rows = len(tree) + 1
    q = rng.dirichlet(np.full(vocab, 0.8), size=rows).astype(np.float32)
    p = rng.dirichlet(np.full(vocab, 0.8), size=rows).astype(np.float32)
    return q.astype(np.float64), p.astype(np.float64)


class _ForgetfulRule(es.AbstractNodeRule):
    """A lossy control: a rejected candidate leaves the target unchanged."""

    exact: ClassVar[bool] = True  # a false claim, which the tools catch
    uses_draft_probs: ClassVar[bool] = True

    def ratio(self, state, token, child):
        return es.IIDCandidates().ratio(state, token, child)

    def reject(self, state, token, child):
        return state

    def candidate_law(self, draft, drafted):
        return draft


@pytest.mark.parametrize("tree", TREES, ids=str)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: type(r).__name__)
def test_tree_quadrature_is_exact_and_lossless(rule, tree):
    q, p = _case(tree)
    result = es.evaluation.evaluate_verifier(es.TreeVerifier(rule, tree=tree), q, p)
    assert result.method == "quadrature"
    assert result.distance < 1e-6
    assert result.reached[0] == pytest.approx(1.0, abs=1e-9)
    assert 1.0 < result.tokens_per_step <= 1 + len(result.reached) - 1


def test_one_node_acceptance_is_the_overlap():
    q, p = _case((-1,))
    result = es.evaluation.evaluate_verifier(es.TreeVerifier(tree=(-1,)), q, p)
    assert result.tokens_per_step == pytest.approx(
        1 + np.minimum(p[0], q[0]).sum(), abs=1e-6
    )


def test_a_chain_tree_is_the_standard_verifier():
    q, p = _case((-1, 0))
    chain = es.evaluation.evaluate_verifier(es.Verifier(), q[:2], p)
    tree = es.evaluation.evaluate_verifier(es.TreeVerifier(tree=(-1, 0)), q, p)
    assert tree.tokens_per_step == pytest.approx(chain.tokens_per_step, abs=1e-6)
    np.testing.assert_allclose(tree.reached, chain.reached, atol=1e-6)


def test_top_k_children_accept_with_their_target_mass():
    """Two deterministic children: some child is accepted with probability
    p(c_1) + p(c_2), the target mass of the draft's two most likely tokens."""
    q, p = _case((-1, -1))
    result = es.evaluation.evaluate_verifier(
        es.TreeVerifier(es.DeterministicCandidates(), tree=(-1, -1)), q, p
    )
    top = np.argsort(-q[0])[:2]
    assert result.reached[1] == pytest.approx(p[0, top].sum(), abs=1e-6)


def test_quadrature_catches_a_lossy_rule():
    """A rule that declares itself exact and is not: quadrature measures it lossy, and
    the tool raises on the false claim."""
    q, p = _case((-1, -1, 0), seed=1)
    verifier = es.TreeVerifier(_ForgetfulRule(), tree=(-1, -1, 0))
    distance = caught_false_claim(
        lambda: es.evaluation.evaluate_verifier(verifier, q, p), verifier
    )
    assert distance > 0.02


@pytest.mark.parametrize(
    "rule, lossless",
    [
        (es.WithoutReplacementCandidates(), True),
        (es.SpecTrKSeq(), True),
        (_ForgetfulRule(), False),
    ],
    ids=["without replacement", "K-SEQ", "forgetful (lossy)"],
)
def test_monte_carlo_on_a_tree(rule, lossless):
    tree = (-1, -1, 0)
    q, p = _case(tree, vocab=8, seed=2)
    verifier = es.TreeVerifier(rule, tree=tree)

    def evaluate():
        return es.evaluation.evaluate_verifier(
            verifier, q, p, method="monte-carlo", num_draws=40_000,
            key=jax.random.key(3),
        )  # fmt: skip

    if lossless:
        assert evaluate().chi_square.passed
    else:  # the chi-square test rejects the counts, and the false claim is caught
        caught_false_claim(evaluate, verifier)


def test_bad_tree_arguments_are_named():
    q, p = _case((-1, 0))
    with pytest.raises(
        ValueError, match="the tree evaluation tools needs the tree's shape"
    ):
        es.evaluation.emission_by_quadrature(es.TreeVerifier(), q, p)
    with pytest.raises(ValueError, match="evaluate_verifier needs the tree's shape"):
        es.evaluation.evaluate_verifier(es.TraversalVerifier(), q, p)
    with pytest.raises(ValueError, match="depth-first order"):
        es.TreeVerifier(tree=(0, -1))
    with pytest.raises(
        ValueError, match=r"`target_probs` must have shape \(N \+ 1, V\)"
    ):
        es.evaluation.emission_by_quadrature(es.TreeVerifier(tree=(-1, 0)), q, p[:2])


def test_tree_evaluation_refuses_the_arguments_it_does_not_use():
    """Every evaluation argument is honoured for trees or refused by name, never
    silently ignored."""
    verifier = es.TreeVerifier(tree=(-1, 0))
    p = np.full((3, 3), 1 / 3)
    for name, value in [
        ("draft_law", p[:2]),
        ("log_inputs", True),
        ("accept_breakpoints", np.zeros((2, 1))),
        ("sample_breakpoints", np.zeros(1)),
        ("subdivisions", 3),
    ]:
        with pytest.raises(ValueError, match=f"does not use `{name}`"):
            es.evaluation.emission_by_quadrature(verifier, p, p, **{name: value})
    for name, value in [("draft_law", p[:2]), ("log_inputs", False)]:
        with pytest.raises(ValueError, match=f"does not use `{name}`"):
            es.evaluation.emission_by_monte_carlo(
                verifier, p, p, jax.random.key(0), 10, **{name: value}
            )
