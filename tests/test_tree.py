"""Tree (multi-candidate) verification: chains equal the standard verifier, one-node
acceptance rates match the rules exactly, and small trees are lossless (chi-square)."""

import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import message_line, random_case, tree_accept, tree_accept_logits

import eqx_specdec
from eqx_specdec._chain.logits import token_counts
from eqx_specdec._evaluation.emission import EmissionEstimate
from eqx_specdec._misc import numpy_softmax
from eqx_specdec._tree.step import path_counts


RULES = {
    "iid": eqx_specdec.IIDCandidates(),
    "without replacement": eqx_specdec.WithoutReplacementCandidates(),
    "deterministic": eqx_specdec.DeterministicCandidates(),
}


def test_a_chain_is_the_standard_verifier():
    x, q, p, u, s = random_case(3, 16, 5, 300)
    parents = np.tile(np.arange(-1, 4), (16, 1)).astype(np.int32)
    tree_q = np.concatenate([q, q[:, -1:]], axis=1)  # the last row is never read
    tree = tree_accept(x, parents, tree_q, p, u, s)
    standard = eqx_specdec.speculative_accept(x, q, p, u, s)
    np.testing.assert_array_equal(tree["tokens"], standard["tokens"])
    np.testing.assert_array_equal(tree["num_accepted"], standard["num_accepted"])
    n = np.asarray(standard["num_accepted"])
    for b in range(16):
        np.testing.assert_array_equal(
            tree["path"][b], [*range(n[b]), *[-1] * (5 - n[b])]
        )


def _children(rule, key, q, k):
    """k candidates for a node whose draft is q, drawn as `rule` says."""
    if rule == "iid":
        return jax.random.categorical(key, jnp.log(q), shape=(k,)).astype(jnp.int32)
    if (
        rule == "without replacement"
    ):  # Gumbel top-k: a draw without replacement, in order
        scores = jnp.log(q) + jax.random.gumbel(key, q.shape, q.dtype, mode="high")
        return jnp.argsort(-scores)[:k].astype(jnp.int32)
    return jnp.argsort(-q)[:k].astype(jnp.int32)  # deterministic: the draft's top k


def _exact_node_acceptance(rule, p, q, k):
    if rule == "deterministic":
        return float(p[np.argsort(-q)[:k]].sum())
    if rule == "iid":
        total, reach = 0.0, 1.0
        for _ in range(k):
            alpha = np.minimum(p, q).sum()
            total += reach * alpha
            reach *= 1 - alpha
            residual = np.maximum(p - q, 0)
            p = residual / residual.sum() if residual.sum() > 0 else p
        return total

    def recurse(p, q, depth):
        if depth == k:
            return 0.0
        total = 0.0
        for c in np.nonzero(q)[0]:
            accept = min(1.0, p[c] / q[c])
            residual = np.maximum(p - q, 0)
            p_next = residual / residual.sum() if residual.sum() > 0 else p
            q_next = np.where(np.arange(len(q)) == c, 0, q) / (1 - q[c])
            total += q[c] * (accept + (1 - accept) * recurse(p_next, q_next, depth + 1))
        return total

    return recurse(p, q, 0)


NODE_P = numpy_softmax(np.random.default_rng(7).normal(size=6) * 1.2)
NODE_Q = numpy_softmax(np.random.default_rng(8).normal(size=6) * 1.2)


@pytest.mark.parametrize("rule", list(RULES))
def test_one_node_acceptance_rates(rule):
    """Root with K = 1..4 candidate children (V = 6): P(some child accepted), by exact
    quadrature over every draw of the children and every uniform, equals the exact value
    from the rule's own recursion (to 1e-6), and the emitted token follows the target."""
    rates = []
    p64 = NODE_P.astype(np.float32).astype(np.float64)
    q64 = NODE_Q.astype(np.float32).astype(np.float64)
    for k in range(1, 5):
        tree = (-1,) * k
        result = eqx_specdec.evaluation.evaluate_verifier(
            eqx_specdec.TreeVerifier(RULES[rule], tree=tree),
            np.tile(q64, (k + 1, 1)),
            np.tile(p64, (k + 1, 1)),
            method="quadrature",
        )
        exact = _exact_node_acceptance(rule, p64, q64, k)
        assert abs(result.reached[1] - exact) < 1e-6, (k, result.reached, exact)
        assert result.distance < 1e-6
        rates.append(exact)
    assert rates == sorted(rates) and rates[-1] > rates[0]


# A small tree: the root's children are nodes 0, 3, 4; node 0's children are 1, 2.
PARENTS = jnp.asarray([-1, 0, 0, -1, -1], jnp.int32)


@pytest.mark.execution_bound
@pytest.mark.parametrize("rule", list(RULES))
def test_small_trees_are_lossless(rule):
    """Chi-square (V = 16, 200,000 steps): the first emitted token follows the root's
    target, and the second, given that node 0 was accepted first, follows the target
    after node 0."""
    vocab, draws = 16, 200_000
    rng = np.random.default_rng(11)
    p = numpy_softmax(rng.normal(size=(6, vocab)) * 1.5).astype(np.float32)
    q = numpy_softmax(rng.normal(size=(6, vocab)) * 1.5).astype(np.float32)
    verifier = eqx_specdec.TreeVerifier(RULES[rule])
    p_j, q_j = jnp.asarray(p), jnp.asarray(q)

    @jax.jit
    def run(key):
        k_c, k_d, k_u, k_s = jax.random.split(key, 4)

        def tree(k1, k2):
            root = _children(rule, k1, q_j[0], 3)  # nodes 0, 3, 4
            inner = _children(rule, k2, q_j[1], 2)  # nodes 1, 2 (children of node 0)
            return jnp.stack([root[0], inner[0], inner[1], root[1], root[2]])

        tokens = jax.vmap(tree)(
            jax.random.split(k_c, draws), jax.random.split(k_d, draws)
        )
        u = jax.random.uniform(k_u, (draws, 5), jnp.float32)
        s = jax.random.uniform(k_s, (draws,), jnp.float32)
        draft = None if rule == "deterministic" else q_j
        row = jax.vmap(verifier.row, in_axes=(0, None, None, None, 0, 0))
        out = row(tokens, PARENTS, draft, p_j, u, s)
        return out["tokens"], out["path"]

    tokens, path = (np.asarray(a) for a in run(jax.random.key(0)))
    first = np.bincount(tokens[:, 0], minlength=vocab)[None]
    estimate = EmissionEstimate(first.astype(float), np.array([draws], float), draws)
    stats = estimate.chi_square(p[:1].astype(np.float64))
    assert stats["statistic"][0] < stats["threshold"][0]
    after_node_0 = tokens[path[:, 0] == 0, 1]
    assert after_node_0.size > 2_000
    second = np.bincount(after_node_0, minlength=vocab)[None]
    estimate = EmissionEstimate(
        second.astype(float), np.array([after_node_0.size], float), draws
    )
    stats = estimate.chi_square(p[1:2].astype(np.float64))
    assert stats["statistic"][0] < stats["threshold"][0]


def test_lossy_tree_rule_is_caught():
    """Control: without replacement drafting checked as if i.i.d. fails the same test."""

    class WrongRule(eqx_specdec.AbstractNodeRule):
        exact: ClassVar[bool] = True  # a false claim, which the test catches
        uses_draft_probs: ClassVar[bool] = True

        def ratio(self, state, token, child):
            return eqx_specdec.IIDCandidates().ratio(state, token, child)

        def reject(self, state, token, child):
            return state  # forgets to update the target

    vocab, draws = 16, 100_000
    p = numpy_softmax(np.random.default_rng(1).normal(size=(4, vocab)) * 1.5).astype(
        np.float32
    )
    q = numpy_softmax(np.random.default_rng(2).normal(size=(4, vocab)) * 1.5).astype(
        np.float32
    )
    verifier = eqx_specdec.TreeVerifier(WrongRule())
    key = jax.random.key(0)
    children = jax.random.categorical(key, jnp.log(q[0]), shape=(draws, 3)).astype(
        jnp.int32
    )
    u = jax.random.uniform(jax.random.key(1), (draws, 3), jnp.float32)
    s = jax.random.uniform(jax.random.key(2), (draws,), jnp.float32)
    row = jax.jit(jax.vmap(verifier.row, in_axes=(0, None, None, None, 0, 0)))
    out = row(
        children, jnp.full((3,), -1, jnp.int32), jnp.asarray(q), jnp.asarray(p), u, s
    )
    first = np.bincount(np.asarray(out["tokens"][:, 0]), minlength=vocab)[None]
    estimate = EmissionEstimate(first.astype(float), np.array([draws], float), draws)
    stats = estimate.chi_square(p[:1].astype(np.float64))
    assert stats["statistic"][0] > stats["threshold"][0]


def test_padding_and_bad_layouts():
    x, q, p, u, s = random_case(4, 2, 4, 20)
    tree_q = np.concatenate([q, q[:, -1:]], axis=1)
    # Padding (parent below -1) is never visited: a 2-node chain padded to 4 nodes.
    parents = np.array([[-1, 0, -2, -2]] * 2, np.int32)
    padded = tree_accept(x, parents, tree_q, p, u, s)
    assert (np.asarray(padded["num_accepted"]) <= 2).all()
    # JAX surfaces a run-time error from a cached executable as a RuntimeError or, on some
    # dispatch paths, a ValueError; the message is the library's either way.
    with pytest.raises((RuntimeError, ValueError), match="not in depth-first order"):
        bad = np.array([[-1, 2, 0, -2]] * 2, np.int32)
        jax.block_until_ready(tree_accept(x, bad, tree_q, p, u, s))
    with pytest.raises(ValueError, match="`target_probs` must have shape"):
        tree_accept(x, parents, tree_q, p[:, :4], u, s)
    with pytest.raises(
        TypeError, match="reads the draft distributions: pass `draft_probs`"
    ):
        tree_accept(x, parents, None, p, u, s)


def test_a_bad_node_token_names_node_tokens():
    x, q, p, u, s = random_case(12, 2, 3, 10)
    parents = np.array([[-1, 0, 1]] * 2, np.int32)
    tree_q = np.concatenate([q, q[:, :1]], axis=1)
    x[1, 2] = 10  # outside [0, V)
    with pytest.raises(
        (RuntimeError, ValueError), match="`node_tokens` holds a token id"
    ):
        jax.block_until_ready(tree_accept(x, parents, tree_q, p, u, s)["tokens"])


class SecondChildRule(eqx_specdec.AbstractNodeRule):
    """Accepts a node's second child only: it reads which sibling it tests."""

    exact: ClassVar[bool] = False
    uses_draft_probs: ClassVar[bool] = False

    def ratio(self, state, token, child):
        return jnp.where(child == 1, 1.0, 0.0), jnp.ones(())

    def reject(self, state, token, child):
        return state


def test_a_node_rule_is_told_which_sibling_it_tests():
    # Root children 0, 3, 4; node 0 has children 1, 2; node 4 has child 5.
    parents = np.array([[-1, 0, 0, -1, -1, 4]], np.int32)
    tokens = np.array([[1, 2, 3, 4, 5, 6]], np.int32)
    p = np.full((1, 7, 8), 1 / 8, np.float32)
    u = np.zeros((1, 6), np.float32)
    out = tree_accept(
        tokens, parents, None, p, u, np.zeros(1, np.float32),
        verifier=eqx_specdec.TreeVerifier(SecondChildRule()),
    )  # fmt: skip
    # The root's second child (node 3) has no children: the walk stops there.
    np.testing.assert_array_equal(out["path"][0], [3, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(out["tokens"][0, :1], [4])


# Trees from logits: each context's row warped in the tree's program.


def _numpy_path_counts(history, node_tokens, parents, vocab):
    """Each context's history counts, walking each node's ancestors one by one."""
    batch, nodes = node_tokens.shape
    counts = np.zeros((batch, nodes + 1, vocab), np.int64)
    for b in range(batch):
        seen = history[b][(history[b] >= 0) & (history[b] < vocab)]
        base = np.bincount(seen, minlength=vocab)
        counts[b, 0] = base
        for j in range(nodes):
            counts[b, j + 1] = base
            node = j
            while node >= 0:  # up to the root (a padding node stops at itself)
                counts[b, j + 1, node_tokens[b, node]] += 1
                node = parents[b, node]
    return counts


def _logit_tree_case():
    """Per-row warps (greedy rows among them), penalties with histories, a mask, and a
    different tree in each row (one with padding)."""
    batch, nodes, vocab = 8, 6, 64
    rng = np.random.default_rng(5)
    layouts = [[-1, -1, 0, 0, 2, 1], [-1, 0, 1, 2, 3, 4], [-1, -1, -1, 0, 1, -2]]
    parents = np.array([layouts[b % 3] for b in range(batch)], np.int32)
    target = (rng.normal(size=(batch, nodes + 1, vocab)) * 3).astype(np.float32)
    target[:, :, :8] = np.round(target[:, :, :8])  # ties
    draft = (target + rng.normal(size=target.shape)).astype(np.float32)
    allowed = rng.uniform(size=target.shape) < 0.8
    allowed[:, :, 0] = True
    # Half the nodes hold their context's most likely allowed token (mostly accepted),
    # the others a token among the first 16 (repeated, for the penalties).
    context = np.maximum(parents, -1) + 1
    best = np.argmax(np.where(allowed, target, -np.inf), -1)
    likely = np.take_along_axis(best, context, axis=1)
    x = np.where(rng.uniform(size=(batch, nodes)) < 0.5, likely, 0)
    x = (x + rng.integers(0, 16, (batch, nodes)) * (x == 0)).astype(np.int32)
    u = rng.uniform(size=(batch, nodes)).astype(np.float32)
    s = rng.uniform(size=batch).astype(np.float32)
    history = rng.integers(-1, 16, (batch, 4)).astype(np.int32)
    target_warp = eqx_specdec.Warp(
        jnp.array([0.0, 0.7, 1.0, 1.3] * 2),
        top_k=jnp.array([0, 5, 20, 64] * 2, jnp.int32),
        top_p=jnp.array([1.0, 0.9, 0.5, 0.99] * 2),
        min_p=jnp.array([0.0, 0.05, 0.0, 0.2] * 2),
        repetition_penalty=1.3,
        frequency_penalty=0.2,
    )
    draft_warp = eqx_specdec.Warp(0.8, top_k=30, presence_penalty=0.4)
    return x, parents, draft, target, u, s, target_warp, draft_warp, history, allowed


def test_tree_logits_are_the_tree_on_the_warped_rows():
    """`tree_accept_logits` emits what `tree_accept` does on the warped probabilities,
    each context penalised by its own path's tokens (against a NumPy walk up the
    tree), masked; its log-probabilities are the warped target's, its raw ones the
    logits' own."""
    x, parents, draft, target, u, s, tw, dw, history, allowed = _logit_tree_case()
    vocab = target.shape[-1]
    out = tree_accept_logits(
        x, parents, draft, target, u, s, target_warp=tw, draft_warp=dw,
        history=history, allowed=allowed, logprobs=eqx_specdec.LogProbs(raw=True),
    )  # fmt: skip
    counts = _numpy_path_counts(history, x, parents, vocab)
    arrays = (jnp.asarray(a) for a in (history, x, parents))
    # Compiled, as the entry point runs them (op by op, the references would compile
    # a hundred small programs).
    counted = jax.jit(path_counts, static_argnums=3)
    np.testing.assert_array_equal(counted(*arrays, vocab), counts)
    # A chain (node j's parent is j - 1) counts as the chain's own penalties do.
    chain = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32) - 1, x.shape)
    history_, x_ = jnp.asarray(history), jnp.asarray(x)
    np.testing.assert_array_equal(
        counted(history_, x_, chain, vocab), token_counts(history_, x_, vocab)
    )
    counts = jnp.asarray(counts, jnp.int32)
    masked = [jnp.where(allowed, a, -jnp.inf) for a in (target, draft)]
    log_p, log_q = eqx.filter_jit(
        lambda: (tw(masked[0], counts), dw(masked[1], counts))
    )()
    reference = tree_accept(
        x, parents, jnp.exp(log_q), jnp.exp(log_p), u, s, check_inputs="off"
    )
    for name in ("num_accepted", "tokens", "path"):
        np.testing.assert_array_equal(out[name], reference[name])
    n = np.asarray(out["num_accepted"])
    assert 0 < n.mean() < x.shape[1], n  # acceptances and rejections both
    rows = np.concatenate([np.zeros((8, 1), int), np.asarray(out["path"]) + 1], 1)
    tokens = np.asarray(out["tokens"])
    emitted = tokens >= 0
    at = (np.arange(8)[:, None], np.maximum(rows, 0), np.maximum(tokens, 0))
    raw = jax.nn.log_softmax(jnp.asarray(target, jnp.float32), axis=-1)
    for name, rows_log_probs in (("logprobs", log_p), ("raw_logprobs", raw)):
        expected = np.where(emitted, np.asarray(rows_log_probs)[at], -np.inf)
        np.testing.assert_allclose(out[name], expected, rtol=1e-6, atol=1e-6)


def test_tree_logits_errors_name_the_argument():
    """A NaN logit names `target_logits`, a negative per-row temperature
    `target_warp.temperature`, a penalty without a history `history`; a history with
    probabilities is refused. The same program as the test above."""
    x, parents, draft, target, u, s, tw, dw, history, allowed = _logit_tree_case()
    call = functools.partial(
        tree_accept_logits,
        draft_warp=dw, allowed=allowed, logprobs=eqx_specdec.LogProbs(raw=True),
    )  # fmt: skip
    nan = target.copy()
    nan[3, 2, 7] = np.nan
    with pytest.raises(RuntimeError) as info:
        call(x, parents, draft, nan, u, s, target_warp=tw, history=history)
    assert "`target_logits` holds a NaN" in message_line(info.value)
    cold = eqx.tree_at(lambda w: w.temperature, tw, tw.temperature.at[5].set(-1.0))
    with pytest.raises(RuntimeError) as info:
        call(x, parents, draft, target, u, s, target_warp=cold, history=history)
    assert "`target_warp.temperature` is negative" in message_line(info.value)
    with pytest.raises(ValueError, match="verify needs `history`"):
        call(x, parents, draft, target, u, s, target_warp=tw)
    with pytest.raises(ValueError, match="`history` counts tokens"):
        eqx_specdec.verify(
            eqx_specdec.Probabilities(jax.nn.softmax(target)),
            eqx_specdec.Draft(
                x, eqx_specdec.Probabilities(jax.nn.softmax(draft)), parents
            ),
            eqx_specdec.Uniforms(u, s),
            verifier=eqx_specdec.TreeVerifier(),
            history=history,
        )
