"""Trees as data: per-row parent arrays in one compiled program, the EAGLE-2 dynamic tree
builder against a NumPy reference, its trees lossless by exact quadrature with the
deterministic-candidate rule (and the q-ratio on them caught), and its errors. The whole
decoding loop with a dynamic tree is in tests/test_decoding.py's chi-square table."""

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import caught_false_claim, tree_accept

import eqx_specdec as es
from eqx_specdec._proposal.abstract_proposal import Models


def _reference_tree(draft, tokens, length, nodes, layers, branching):
    """EAGLE-2's expansion written out in NumPy: candidates layer by layer, the best
    `branching` of each layer expanded, the best `nodes` kept, laid out depth first
    with siblings from the most to the least likely."""

    def q_after(path):
        buf = np.array(tokens)
        buf[length : length + len(path)] = path
        return np.asarray(
            draft(jnp.asarray(buf), jnp.asarray([length - 1 + len(path)]))
        )[0]

    def top(q):
        return np.argsort(-q, kind="stable")[:branching]

    # Each candidate: (log path probability, creation index, path tuple).
    candidates, layer = [], []
    q = q_after(())
    for t in top(q):
        candidates.append((np.log(q[t]), len(candidates), (int(t),)))
    layer = list(candidates)
    for _ in range(1, layers):
        frontier = sorted(layer, key=lambda c: (-c[0], c[1]))[:branching]
        layer = []
        for score, _, path in frontier:
            q = q_after(path)
            for t in top(q):
                layer.append((score + np.log(q[t]), len(candidates), path + (int(t),)))
                candidates.append(layer[-1])
    kept = sorted(candidates, key=lambda c: (-c[0], c[1]))[:nodes]
    rank = {c[2]: i for i, c in enumerate(kept)}  # the try order among siblings

    def key(path):
        return tuple(
            sorted(
                (rank[c] for c in rank if c[:-1] == path[: d - 1]),
            ).index(rank[path[:d]])
            for d in range(1, len(path) + 1)
        )

    order = sorted((c[2] for c in kept), key=key)
    index = {path: i for i, path in enumerate(order)}
    parents = [index[path[:-1]] if len(path) > 1 else -1 for path in order]
    return [path[-1] for path in order], parents


def _prompts():
    """Six prompts, cut after different characters (so the trees differ)."""
    texts = [text[: 9 + 2 * i] for i, text in enumerate(es.demo.BUILTIN_PROMPTS[:6])]
    width = max(map(len, texts)) + 8
    tokens = np.zeros((len(texts), width), np.int32)
    for i, text in enumerate(texts):
        tokens[i, : len(text)] = es.demo.encode(text)
    return tokens, [len(t) for t in texts]


@pytest.mark.parametrize("shape", [(7, 3, 3), (9, 4, 3)], ids=str)
def test_the_builder_is_eagle_2(shape):
    """The builder's trees equal the NumPy reference, per row, and differ between rows
    (per-row shapes from one call)."""
    draft, target = es.demo.builtin_models()
    proposal = es.DynamicTree(*shape)
    tokens, lengths = _prompts()
    models = Models(draft, target, ("probs", "probs"))
    build = jax.jit(jax.vmap(lambda t, n: proposal.build(models, t, n)))
    node_tokens, parents, q, p = build(jnp.asarray(tokens), jnp.asarray(lengths))
    for b in range(len(lengths)):
        expected_tokens, expected_parents = _reference_tree(
            draft, tokens[b], lengths[b], *shape
        )
        np.testing.assert_array_equal(node_tokens[b], expected_tokens)
        np.testing.assert_array_equal(parents[b], expected_parents)
    assert len({tuple(np.asarray(row)) for row in parents}) > 1
    # Row i + 1 of the target is its distribution after node i.
    buf = np.array(tokens[0])
    buf[lengths[0]] = node_tokens[0, 0]
    after = target(jnp.asarray(buf), jnp.asarray([lengths[0]]))[0]
    np.testing.assert_allclose(p[0, 1], after, rtol=1e-6)


def test_traced_parents_compile_once_and_equal_the_static_shapes():
    """tree_accept with per-row parent arrays: one trace for every shape up to N
    nodes (padding below -1), each row's result the static shape's."""
    shapes = [
        (-1, 0, 0, -1, 3),
        (-1, -1, -1, 2, -2),
        (-1, 0, 1, 2, 3),
        (-1, -2, -2, -2, -2),
    ]
    nodes, vocab, batch = 5, 7, 8
    node_tokens, _, target, u, s = es.example_inputs(batch, nodes, vocab)
    verifier = es.TreeVerifier(es.DeterministicCandidates())
    traces = []

    @jax.jit
    def verify(parents):
        traces.append(None)  # at trace time only
        return tree_accept(node_tokens, parents, None, target, u, s, verifier=verifier)

    rng = np.random.default_rng(0)
    for _ in range(3):
        rows = rng.integers(0, len(shapes), batch)
        parents = np.asarray([shapes[r] for r in rows], np.int32)
        out = verify(parents)
        for shape in set(rows.tolist()):
            real = [i for i, parent in enumerate(shapes[shape]) if parent >= -1]
            static = tree_accept(
                node_tokens[:, real], None, None, target[:, [0] + [i + 1 for i in real]],
                u[:, real], s,
                verifier=es.TreeVerifier(
                    es.DeterministicCandidates(), tree=tuple(shapes[shape][i] for i in real)
                ),
            )  # fmt: skip
            mine = rows == shape
            np.testing.assert_array_equal(
                out["num_accepted"][mine], static["num_accepted"][mine]
            )
            width = len(real) + 1
            np.testing.assert_array_equal(
                out["tokens"][mine, :width], static["tokens"][mine]
            )
    assert len(traces) == 1


class _RatioOnDeterministicChildren(es.AbstractNodeRule):
    """A lossy control: children chosen deterministically (the draft's top tokens),
    tested with the q-ratio as if they were sampled from q."""

    exact: ClassVar[bool] = True  # a false claim, which quadrature catches
    uses_draft_probs: ClassVar[bool] = True

    def ratio(self, state, token, child):
        return es.IIDCandidates().ratio(state, token, child)

    def reject(self, state, token, child):
        return es.IIDCandidates().reject(state, token, child)

    def candidate_law(self, draft, drafted):
        return es.DeterministicCandidates().candidate_law(draft, drafted)


def test_dynamic_trees_are_lossless_by_quadrature():
    """On a context-dependent toy (V = 4), the builder's tree at one context, verified
    by the deterministic-candidate rule: exact quadrature finds every position's emitted
    law equal to the target's; the q-ratio on the same children is caught."""
    rng = np.random.default_rng(4)
    vocab, proposal = 4, es.DynamicTree(nodes=4, layers=3, branching=2)
    q_table = rng.dirichlet(np.ones(vocab), size=vocab)
    p_table = rng.dirichlet(np.ones(vocab), size=vocab)

    def bigram(table):
        return lambda tokens, positions: jnp.asarray(table, jnp.float32)[
            tokens[positions]
        ]

    models = Models(bigram(q_table), bigram(p_table), ("probs", "probs"))
    tokens = jnp.asarray([2, 0, 0, 0, 0], jnp.int32)
    node_tokens, parents, q, p = proposal.build(models, tokens, jnp.int32(1))
    tree = tuple(int(x) for x in parents)
    # The evaluation tools draft children from q with the rule's law: the same top
    # tokens the builder chose, given its rows.
    full_q = np.stack([q_table[2]] + [q_table[int(t)] for t in node_tokens])
    exact = es.evaluation.evaluate_verifier(
        es.TreeVerifier(es.DeterministicCandidates(), tree=tree), full_q, np.asarray(p)
    )
    assert exact.method == "quadrature" and exact.distance < 1e-6
    lossy = es.TreeVerifier(_RatioOnDeterministicChildren(), tree=tree)
    distance = caught_false_claim(
        lambda: es.evaluation.evaluate_verifier(lossy, full_q, np.asarray(p)), lossy
    )
    assert distance > 0.01


def test_bad_dynamic_trees_are_named():
    draft, target = es.demo.builtin_models()
    tokens, lengths = _prompts()
    proposal = es.DynamicTree(nodes=4, layers=2, branching=2)

    def decode(verifier, proposal=proposal):
        es.speculative_decode(
            draft, target, tokens, np.asarray(lengths), 4, jax.random.key(0),
            verifier=verifier, proposal=proposal,
        )  # fmt: skip

    with pytest.raises(ValueError, match="node rule IIDCandidates reads the draft's"):
        decode(es.TreeVerifier(es.IIDCandidates()))
    with pytest.raises(ValueError, match="build the verifier without `tree=`"):
        decode(es.TreeVerifier(es.DeterministicCandidates(), tree=(-1, 0)))
    with pytest.raises(TypeError, match="`verifier` must be a tree verifier"):
        decode(es.Verifier())
    with pytest.raises(
        ValueError, match=r"DynamicTree\(`nodes`=7\) is more than the 6"
    ):
        es.DynamicTree(nodes=7, layers=2, branching=2)
    with pytest.raises(ValueError, match=r"DynamicTree\(`branching`=...\) must be"):
        es.DynamicTree(nodes=1, layers=1, branching=0)
    with pytest.raises(ValueError, match=r"\(branching \+ 1\) \*\* layers"):
        es.DynamicTree(nodes=1, layers=12, branching=8)
