"""Multi-draft verification: the optimum alpha* against exhaustive search over token sets,
the one-node table of the Trees page (docs/trees.md, multi-draft verification) reproduced by the rules and by the optimum, and the
multi-draft node rules lossless by exact quadrature."""

import itertools

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import caught_false_claim

import eqx_specdec as es


# The one-node case of the Trees page (docs/trees.md): V = 5, total variation 0.560.
P = np.array([0.432092, 0.163163, 0.283039, 0.115148, 0.006558])
Q = np.array([0.192869, 0.285426, 0.051213, 0.025701, 0.444792])
# (rule, K): (measured acceptance, alpha* of that draft law), to 1e-4.
TABLE = {
    (es.IIDCandidates(), 2): (0.5907, 0.6365),
    (es.WithoutReplacementCandidates(), 2): (0.6986, 0.7634),
    (es.GreedyMultiDraft(2), 2): (0.6556, 0.6556),
    (es.SpecHub(), 2): (0.6556, 0.6556),
    (es.IIDCandidates(), 3): (0.7011, 0.7804),
    (es.WithoutReplacementCandidates(), 3): (0.8385, 0.9767),
    (es.GreedyMultiDraft(3), 3): (0.8869, 0.8869),
}
# K-SEQ's and importance sampling's entries of the table, checked with their references
# in test_k_seq_and_importance_sampling_accept_as_their_papers_say.
PAPERS_TABLE = {
    ("SpecTrKSeq", 2): 0.6083,
    ("ImportanceSampling", 2): 0.6084,
    ("SpecTrKSeq", 3): 0.7277,
    ("ImportanceSampling", 3): 0.7168,
}
DRAFTING = {
    "iid": es.IIDCandidates(),
    "without replacement": es.WithoutReplacementCandidates(),
}


def _inclusion(q, subset, k, drafting):
    """P(every one of k drafts lies in `subset`), by enumerating the draws."""
    if drafting == "iid":
        return q[list(subset)].sum() ** k
    total = 0.0
    for draws in itertools.permutations(subset, k):
        probability, removed = 1.0, 0.0
        for a in draws:
            probability *= q[a] / (1 - removed)
            removed += q[a]
        total += probability
    return total


def _exhaustive(p, q, k, drafting):
    """min over every token set H of p(H) + 1 - P(S in H)."""
    vocab = len(p)
    return min(
        p[list(h)].sum() + 1 - _inclusion(q, h, k, drafting)
        for r in range(vocab + 1)
        for h in itertools.combinations(range(vocab), r)
    )


@pytest.mark.parametrize("drafting", list(DRAFTING))
def test_optimal_acceptance_equals_exhaustive_search(drafting):
    rng = np.random.default_rng(5)
    for vocab in (3, 5, 6):
        # Flat, peaked and sparse rows, batched in one call per K.
        concentration = np.repeat([0.3, 1.0, 3.0], 3)[:, None]
        p = np.stack([rng.dirichlet(np.full(vocab, c)) for c in concentration[:, 0]])
        q = np.stack([rng.dirichlet(np.full(vocab, c)) for c in concentration[::-1, 0]])
        for k in range(1, min(vocab, 4) + 1):
            got = np.asarray(
                es.evaluation.optimal_acceptance(p, q, k, drafting=drafting)
            )
            expected = [_exhaustive(p[b], q[b], k, drafting) for b in range(len(p))]
            np.testing.assert_allclose(got, expected, atol=2e-6, err_msg=(vocab, k))
    # K = 1: one draft, for either law, accepts sum min(p, q).
    np.testing.assert_allclose(
        es.evaluation.optimal_acceptance(P, Q, 1, drafting=drafting),
        np.minimum(P, Q).sum(),
        atol=2e-6,
    )


def test_the_one_node_table():
    """Each rule's acceptance at a root with K children, by exact quadrature, and alpha*
    (of the public function and of the rule's capability, which evaluate_verifier
    reports) reproduce the Trees page's table to 1e-4; no rule beats its optimum."""
    for (rule, k), (acceptance, optimum) in TABLE.items():
        result = es.evaluation.evaluate_verifier(
            es.TreeVerifier(rule, tree=(-1,) * k),
            np.tile(Q, (k + 1, 1)),
            np.tile(P, (k + 1, 1)),
            method="quadrature",
        )
        name = f"{type(rule).__name__}, K = {k}"
        assert result.distance < 1e-6, name
        assert abs(result.root_acceptance - acceptance) < 1e-4, name
        assert abs(result.optimal_acceptance - optimum) < 1e-4, name
        assert result.root_acceptance <= result.optimal_acceptance + 1e-6, name
    for drafting, k, optimum in [
        ("iid", 2, 0.6365),
        ("without replacement", 2, 0.7634),
        ("iid", 3, 0.7804),
        ("without replacement", 3, 0.9767),
    ]:
        assert (
            abs(
                float(es.evaluation.optimal_acceptance(P, Q, k, drafting=drafting))
                - optimum
            )
            < 1e-4
        )


@pytest.mark.parametrize(
    "rule, tree",
    [
        (es.GreedyMultiDraft(2), (-1, 0, 0, -1)),
        (es.SpecHub(), (-1, 0, 0, -1)),
        (es.GreedyMultiDraft(3), (-1, 0, -1, -1)),
        # Nodes with 3 and 1 children: each node's own K.
        (es.SpecTrKSeq(), (-1, 0, -1, -1)),
        (es.ImportanceSampling(3), (-1, 0, -1, -1)),
    ],
    ids=["greedy K=2", "SpecHub", "greedy K=3", "K-SEQ", "importance sampling"],
)
def test_multi_draft_rules_are_lossless_on_trees(rule, tree):
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(4), len(tree) + 1)
    q = rng.dirichlet(np.ones(4), len(tree) + 1)
    result = es.evaluation.evaluate_verifier(
        es.TreeVerifier(rule, tree=tree), q, p, method="quadrature"
    )
    assert result.distance < 2e-6
    assert result.root_acceptance <= result.optimal_acceptance + 1e-6


def _k_seq_acceptance(p, q, k):
    """SpecTr's K-SEQ in float64: the least rho in [1, K] with
    rho >= (1 - (1 - beta)^K) / beta on a fine grid refined by bisection, and its
    acceptance 1 - (1 - beta)^K."""

    def beta(rho):
        return np.minimum(q, p / rho).sum()

    def feasible(rho):
        b = beta(rho)
        return rho >= (1 - (1 - b) ** k) / b - 1e-12

    grid = np.linspace(1, k, 2001)
    hi = grid[np.argmax([feasible(r) for r in grid])]
    lo = max(1.0, hi - (k - 1) / 2000)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return 1 - (1 - beta(hi)) ** k


def _importance_acceptance(p, q, k):
    """Khisti et al.'s importance-sampling selection by enumerating every ordered draw
    of K drafts: the law of the selected token, then sum min(p, q_Y)."""
    w = np.where(q > 0, p / np.where(q > 0, q, 1), 0)
    law = np.zeros_like(p)
    for draws in itertools.product(range(len(p)), repeat=k):
        chance = np.prod(q[list(draws)])
        weights = w[list(draws)]
        total = weights.sum()
        for x, weight in zip(draws, weights):
            law[x] += chance * (weight / total if total > 0 else 1 / k)
    return np.minimum(p, law).sum()


@pytest.mark.parametrize("k", [2, 3])
def test_k_seq_and_importance_sampling_accept_as_their_papers_say(k):
    """Root acceptance by exact quadrature against independent float64 references of
    each rule's closed form, on the Trees page's one-node case (its table's entries) and
    two random rows; lossless; K-SEQ is within its (1 - 1/e) guarantee of alpha*."""
    rng = np.random.default_rng(10 + k)
    rows = 3
    p = np.concatenate([P[None], rng.dirichlet(np.full(len(P), 0.7), size=rows - 1)])
    q = np.concatenate([Q[None], rng.dirichlet(np.full(len(P), 0.7), size=rows - 1)])
    tree = (-1,) * k
    for rule, reference in [
        (es.SpecTrKSeq(), _k_seq_acceptance),
        (es.ImportanceSampling(k), _importance_acceptance),
    ]:
        for b in range(rows):
            result = es.evaluation.evaluate_verifier(
                es.TreeVerifier(rule, tree=tree),
                np.tile(q[b], (k + 1, 1)),
                np.tile(p[b], (k + 1, 1)),
                method="quadrature",
            )
            expected = reference(p[b], q[b], k)
            assert abs(result.root_acceptance - expected) < 1e-5, (rule, b)
            assert result.distance < 2e-6
            if b == 0:
                page = PAPERS_TABLE[type(rule).__name__, k]
                assert abs(result.root_acceptance - page) < 1e-4
            assert result.root_acceptance <= result.optimal_acceptance + 1e-6
            if isinstance(rule, es.SpecTrKSeq):
                bound = (1 - 1 / np.e) * result.optimal_acceptance
                assert result.root_acceptance >= bound - 1e-6


class _UnscaledKSeq(es.SpecTrKSeq):
    """A lossy control: K-SEQ with rho = 1, whose residual p - q c_K is negative
    somewhere (clipped to 0)."""

    def init(self, target, draft, tokens, siblings):
        state = super().init(target, draft, tokens, siblings)
        beta = jnp.sum(jnp.minimum(draft, target))
        return eqx.tree_at(
            lambda s: (s.scale, s.beta), state, (jnp.ones_like(beta), beta)
        )


class _NaiveImportance(es.ImportanceSampling):
    """A lossy control: the selected draft verified against q instead of its own law."""

    def selected_law(self, target, draft, count):
        return jnp.where(count > 0, draft, 0)


@pytest.mark.parametrize(
    "rule", [_UnscaledKSeq(), _NaiveImportance(2)], ids=["K-SEQ, rho = 1", "IS vs q"]
)
def test_quadrature_catches_lossy_k_seq_and_importance_sampling(rule):
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.full(4, 0.7), 3)
    q = rng.dirichlet(np.full(4, 0.7), 3)
    verifier = es.TreeVerifier(rule, tree=(-1, -1))
    distance = caught_false_claim(
        lambda: es.evaluation.evaluate_verifier(verifier, q, p, method="quadrature"),
        verifier,
    )
    assert distance > 0.01


def test_importance_sampling_refuses_what_it_cannot_enumerate():
    rule = es.ImportanceSampling(8)
    p = jnp.full((64,), 1 / 64)
    with pytest.raises(
        ValueError, match=r"ImportanceSampling\(num_drafts=8\) enumerates"
    ):
        rule.init(p, p, jnp.zeros(8, jnp.int32), jnp.ones(8, bool))
    with pytest.raises(ValueError, match=r"ImportanceSampling\(`num_drafts`"):
        es.ImportanceSampling(0)


def _max_flow(p, qs):
    """The best P(Y in S) over couplings of Y ~ p with independent drafts S (draft k
    from qs[k]): the maximum flow from the source through the tokens y (capacity p(y))
    to the draft tuples holding y, then to the sink (capacity P(tuple)), by
    Edmonds-Karp on the explicit network."""
    vocab = len(p)
    tuples = list(itertools.product(range(vocab), repeat=len(qs)))
    nodes = 2 + vocab + len(tuples)  # 0: source, 1: sink
    capacity = np.zeros((nodes, nodes))
    capacity[0, 2 : 2 + vocab] = p
    for j, draws in enumerate(tuples):
        capacity[2 + vocab + j, 1] = np.prod([q[d] for q, d in zip(qs, draws)])
        for y in set(draws):
            capacity[2 + y, 2 + vocab + j] = np.inf
    flow = 0.0
    while True:
        parent = np.full(nodes, -1)
        parent[0] = 0
        queue = [0]
        while queue and parent[1] < 0:
            u = queue.pop(0)
            for v in np.flatnonzero((capacity[u] > 1e-15) & (parent < 0)):
                parent[v] = u
                queue.append(v)
        if parent[1] < 0:
            return flow
        path, v = [], 1
        while v != 0:
            path.append((parent[v], v))
            v = parent[v]
        pushed = min(capacity[u, v] for u, v in path)
        for u, v in path:
            capacity[u, v] -= pushed
            capacity[v, u] += pushed
        flow += pushed


def test_optimal_acceptance_of_independent_drafters_that_differ():
    """Two or three draft models, each proposing one candidate: alpha* (a minimum over
    every token set) equals the maximum flow over the couplings of the target and the
    drafts; with identical drafters it is the i.i.d. optimum, and with different ones
    it differs from the i.i.d. optimum of either."""
    rng = np.random.default_rng(6)
    for vocab, k in ((3, 2), (4, 2), (4, 3)):
        p = rng.dirichlet(np.ones(vocab), size=4)
        qs = np.stack([rng.dirichlet(np.full(vocab, 0.5), size=k) for _ in range(4)])
        got = np.asarray(
            es.evaluation.optimal_acceptance(p, qs, k, drafting="independent")
        )
        expected = [_max_flow(p[b], qs[b]) for b in range(4)]
        np.testing.assert_allclose(got, expected, atol=2e-6, err_msg=(vocab, k))
        same = np.repeat(qs[:, :1], k, axis=1)
        np.testing.assert_allclose(
            es.evaluation.optimal_acceptance(p, same, k, drafting="independent"),
            es.evaluation.optimal_acceptance(p, qs[:, 0], k),
            atol=2e-6,
        )
        for j in range(k):
            iid = np.asarray(es.evaluation.optimal_acceptance(p, qs[:, j], k))
            assert np.all(np.abs(got - iid) > 1e-4)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., K, V\)"):
        es.evaluation.optimal_acceptance(P, Q, 2, drafting="independent")
    with pytest.raises(ValueError, match="for V <= 16; got V = 17"):
        es.evaluation.optimal_acceptance(
            np.full(17, 1 / 17), np.full((2, 17), 1 / 17), 2, drafting="independent"
        )


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="`num_drafts` must be a Python int >= 1"):
        es.evaluation.optimal_acceptance(P, Q, 0)
    with pytest.raises(ValueError, match='`drafting` must be "iid", "without'):
        es.evaluation.optimal_acceptance(P, Q, 2, drafting="top-k")
    with pytest.raises(ValueError, match="same shape"):
        es.evaluation.optimal_acceptance(P, Q[:4], 2)
    with pytest.raises(ValueError, match=r"GreedyMultiDraft\(`num_drafts`"):
        es.GreedyMultiDraft(0)
