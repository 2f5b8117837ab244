"""Traversal verification: block verification on chains, lossless by exact enumeration on
small trees of second-order Markov models, never below top-down verification, and a
lossy parent update caught by the same test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case, tree_accept
from tree_exact import exact_tree, markov_models

import eqx_specdec as es


# (tree, seed): 2-3 children per node, depth 2-3; the parent of each node in depth-first
# order.
TREES = [
    ((-1, 0, 0, -1, 3), 0),
    ((-1, 0, 0, -1, 3), 1),
    ((-1, 0, 1, -1, -1), 2),
    ((-1, 0, 0, 1, -1, 4), 3),
    ((-1, 0, 0, 0, -1, 4), 4),
]
TOP_DOWN = es.TreeVerifier(es.WithoutReplacementCandidates())


class LossyParentUpdate(es.TraversalVerifier):
    """The parent update of one public port, `min(1, S / (1 - Ms(x | y)))`: not
    lossless."""

    def parent_update(self, pa, total, removed):
        return jnp.minimum(1, total / jnp.maximum(1 - removed, 1e-30))


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_a_chain_is_block_verification(gamma):
    x, q, p, u, s = random_case(gamma, 64, gamma, 50)
    parents = np.tile(np.arange(-1, gamma - 1), (64, 1)).astype(np.int32)
    tree_q = np.concatenate([q, q[:, -1:]], axis=1)  # the last row is never read
    got = tree_accept(x, parents, tree_q, p, u, s, verifier=es.TraversalVerifier())
    block = es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter())
    expected = es.speculative_accept(x, q, p, u, s, verifier=block)
    np.testing.assert_array_equal(got["tokens"], expected["tokens"])
    np.testing.assert_array_equal(got["num_accepted"], expected["num_accepted"])


@pytest.mark.execution_bound
def test_lossless_and_never_below_top_down():
    """Exact enumeration (every token assignment, every cell of the uniforms): each
    emitted token follows the Markov target given the tokens before it, and the expected
    accepted length is at least top-down verification's (without replacement)."""
    gains = []
    for tree, seed in TREES:
        target, draft = markov_models(seed)
        traversal = exact_tree(es.TraversalVerifier(), tree, target, draft)
        top_down = exact_tree(TOP_DOWN, tree, target, draft)
        assert traversal.max_error(target, (0, 1)) < 1e-5, tree
        assert top_down.max_error(target, (0, 1)) < 1e-5, tree
        assert traversal.accepted_length >= top_down.accepted_length - 1e-6, tree
        gains.append(traversal.accepted_length / top_down.accepted_length - 1)
    # Strictly better on these trees (a verifier equal to top-down would fail here).
    assert min(gains) > 0.005 and max(gains) > 0.04, gains


def test_the_lossy_parent_update_is_caught():
    tree, seed = TREES[0]
    target, draft = markov_models(seed)
    lossy = exact_tree(LossyParentUpdate(), tree, target, draft)
    assert lossy.max_error(target, (0, 1)) > 0.05


def _batch_of_trees(batch=16, vocab=7):
    """Random trees of one layout with padding in the middle, and their inputs."""
    rng = np.random.default_rng(3)
    parents = np.array([-1, 0, -5, 0, 1, -1, 5], np.int32)
    nodes = len(parents)
    tokens = np.zeros((batch, nodes), np.int32)
    for b in range(batch):  # siblings distinct, as drafting without replacement gives
        for parent in set(parents.tolist()):
            children = np.nonzero(parents == parent)[0]
            tokens[b, children] = rng.permutation(vocab)[: len(children)]
    p = rng.dirichlet(np.ones(vocab), (batch, nodes + 1)).astype(np.float32)
    q = rng.dirichlet(np.ones(vocab), (batch, nodes + 1)).astype(np.float32)
    u = rng.uniform(size=(batch, nodes)).astype(np.float32)
    s = rng.uniform(size=batch).astype(np.float32)
    return tokens, np.tile(parents, (batch, 1)), q, p, u, s


def test_through_tree_accept_jit_and_vmap():
    # More trees than the walk advances per step, so that the compacted batch walk is
    # checked against the per-tree one (`row`, vmapped).
    inputs = _batch_of_trees(batch=40)
    verifier = es.TraversalVerifier()
    out = tree_accept(*inputs, verifier=verifier)
    jitted = jax.jit(lambda *a: tree_accept(*a, verifier=verifier))(*inputs)
    rows = jax.jit(jax.vmap(verifier.row))(*(jnp.asarray(a) for a in inputs))
    for key in ("num_accepted", "tokens", "path"):
        assert out[key].dtype == jnp.int32
        np.testing.assert_array_equal(out[key], jitted[key])
        np.testing.assert_array_equal(out[key], rows[key])
    tokens, parents = inputs[0], inputs[1]
    n, path = np.asarray(out["num_accepted"]), np.asarray(out["path"])
    for b in range(len(n)):
        # The path is a chain of real nodes from the root; the tokens are its tokens.
        chain = path[b, : n[b]]
        assert all(
            parents[b, c] == (chain[i - 1] if i else -1) for i, c in enumerate(chain)
        )
        np.testing.assert_array_equal(out["tokens"][b, : n[b]], tokens[b, chain])
        assert (path[b, n[b] :] == -1).all() and (
            out["tokens"][b, n[b] + 1 :] == -1
        ).all()


def test_max_depth_bounds_the_walk_and_is_checked():
    inputs = _batch_of_trees()
    deep_enough = tree_accept(*inputs, verifier=es.TraversalVerifier(max_depth=3))
    any_depth = tree_accept(*inputs, verifier=es.TraversalVerifier())
    for key in any_depth:
        np.testing.assert_array_equal(deep_enough[key], any_depth[key])
    with pytest.raises(RuntimeError, match="deeper than TraversalVerifier walks"):
        tree_accept(*inputs, verifier=es.TraversalVerifier(max_depth=2))
    with pytest.raises(ValueError, match="`max_depth`"):
        es.TraversalVerifier(max_depth=0)


def test_exact_evaluation_and_monte_carlo_tools():
    """The library's own tools on a context-free tree: quadrature is lossless to
    rounding, and Monte Carlo agrees with it."""
    rng = np.random.default_rng(0)
    tree = (-1, 0, 0, -1)
    p = rng.dirichlet(np.ones(3), 5)
    q = rng.dirichlet(np.ones(3), 5)
    verifier = es.TraversalVerifier(tree=tree)
    exact = es.evaluation.evaluate_verifier(verifier, q, p, method="quadrature")
    assert exact.distance < 1e-6
    top_down = es.TreeVerifier(es.WithoutReplacementCandidates(), tree=tree)
    top_down = es.evaluation.evaluate_verifier(top_down, q, p, method="quadrature")
    assert exact.tokens_per_step >= top_down.tokens_per_step - 1e-7
    sampled = es.evaluation.evaluate_verifier(
        verifier, q, p, method="monte-carlo", num_draws=50_000
    )
    assert abs(sampled.tokens_per_step - exact.tokens_per_step) < 0.02
    # The Monte Carlo estimate carries its standard error, and is within 5 of them.
    assert 0 < sampled.tokens_per_step_error < 0.01
    error = abs(sampled.tokens_per_step - exact.tokens_per_step)
    assert error < 5 * sampled.tokens_per_step_error
    assert exact.tokens_per_step_error is None
    assert sampled.chi_square.passed


def test_errors_name_the_verifier_and_the_fix():
    tokens, parents, q, p, u, s = _batch_of_trees()
    verifier = es.TraversalVerifier()
    with pytest.raises(TypeError, match=r"^TraversalVerifier \(its trees drafted by"):
        tree_accept(tokens, parents, None, p, u, s, verifier=verifier)
    with pytest.raises(RuntimeError, match="`node_tokens` holds a token id"):
        tree_accept(tokens + 100, parents, q, p, u, s, verifier=verifier)
    with pytest.raises(ValueError, match="deeper than TraversalVerifier walks"):
        es.TraversalVerifier(max_depth=1, tree=(-1, 0, -1))
    shallow = es.TraversalVerifier(max_depth=1)
    draft, target = es.demo.builtin_models()
    with pytest.raises(ValueError, match="raise its `max_depth` to at least 2"):
        es.speculative_decode(
            draft,
            target,
            np.zeros((2, 2), np.int32),
            None,
            4,
            jax.random.key(0),
            verifier=shallow,
            proposal=es.Tree((-1, 0)),
        )
