"""Exact evaluation of a tree verifier on context-dependent (second-order Markov) models:
every assignment of tokens to the nodes, weighted by its probability under drafting
without replacement; every cell of the uniforms, cut at every pass threshold the verifier
reports (`forced_walk`) and at every breakpoint of the correction's distribution; the
verifier's own `row` run at each cell's midpoint."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from eqx_specdec._evaluation.tree_evaluation import quadrature_cells
from eqx_specdec._misc import numpy_softmax


def markov_models(seed, vocab=3, sharpness=1.5):
    """A random second-order Markov target and draft: `(V, V, V)` tables of the next
    token's distribution given the previous two."""
    rng = np.random.default_rng(seed)
    target = numpy_softmax(rng.normal(size=(vocab, vocab, vocab)) * sharpness)
    draft = numpy_softmax(rng.normal(size=(vocab, vocab, vocab)) * sharpness)
    return target, draft


NODES = 6  # every tree is padded to this many nodes, so that all share two programs


def _paths(tree):
    paths = []
    for i in range(len(tree)):
        if tree[i] < -1:  # padding
            paths.append([])
            continue
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = tree[node]
        paths.append(path[::-1])
    return paths


def _rows(table, prompt, tree, tokens):
    """`(N + 1, V)`: the table's distribution at the root and after each node."""
    rows = [table[prompt[-2], prompt[-1]]]
    for path in _paths(tree):
        if not path:
            rows.append(rows[0])
            continue
        history = list(prompt) + [tokens[a] for a in path]
        rows.append(table[history[-2], history[-1]])
    return np.stack(rows)


def _drafting_probability(tree, tokens, q_rows):
    """P(tokens) when each node's children are drawn without replacement from q."""
    probability, drafted = 1.0, {}
    for i, parent in enumerate(tree):
        if parent < -1:
            continue
        law = q_rows[parent + 1].copy()
        for t in drafted.get(parent, []):
            law[t] = 0
        if law.sum() <= 0:
            return 0.0
        probability *= law[tokens[i]] / law.sum()
        drafted.setdefault(parent, []).append(tokens[i])
    return probability


class TreeResult:
    """Exact emission of one verifier on one tree: the conditional law of each emitted
    token given the tokens emitted before it, and the expected accepted length."""

    def __init__(self, emitted, reached, accepted_length):
        self.emitted, self.reached, self.accepted_length = (
            emitted,
            reached,
            accepted_length,
        )

    def max_error(self, target, prompt):
        """The largest gap between an emitted token's law and the target's, over every
        prefix emitted with positive probability."""
        error = 0.0
        for prefix, mass in self.reached.items():
            if mass < 1e-9:
                continue
            history = list(prompt) + list(prefix)
            law = self.emitted[prefix] / mass
            error = max(error, np.abs(law - target[history[-2], history[-1]]).max())
        return error


@eqx.filter_jit
def _forced_walks(verifier, x, parents, q, p, outcomes):
    walk = jax.vmap(
        jax.vmap(verifier.forced_walk, (None, None, None, None, 0)),
        (0, None, 0, 0, None),
    )
    return walk(x, parents, q, p, outcomes)


@eqx.filter_jit
def _verify(verifier, x, parents, q, p, u, s):
    return jax.vmap(verifier.row, in_axes=(0, None, 0, 0, 0, 0))(x, parents, q, p, u, s)


def _pad(a, size):
    return np.concatenate([a, np.repeat(a[:1], size - len(a), 0)])


def exact_tree(verifier, tree, target, draft, prompt=(0, 1)) -> TreeResult:
    """Exact emission of `verifier` on `tree` (at most `NODES` nodes, padded)."""
    tree = tuple(tree) + (-2,) * (NODES - len(tree))
    nodes, vocab = len(tree), target.shape[-1]
    real = [i for i, parent in enumerate(tree) if parent >= -1]
    rows_p, rows_q, xs, weights = [], [], [], []
    for assignment in itertools.product(range(vocab), repeat=len(real)):
        tokens = [0] * nodes
        for i, t in zip(real, assignment):
            tokens[i] = t
        q = _rows(draft, prompt, tree, tokens)
        probability = _drafting_probability(tree, tokens, q)
        if probability > 0:
            rows_p.append(_rows(target, prompt, tree, tokens))
            rows_q.append(q)
            xs.append(tokens)
            weights.append(probability)
    # Padded to a fixed count, so that every tree of up to NODES nodes shares one program.
    count = max(512, 1 << (len(xs) - 1).bit_length())
    p = jnp.asarray(_pad(np.stack(rows_p), count), jnp.float32)
    q = jnp.asarray(_pad(np.stack(rows_q), count), jnp.float32)
    x = jnp.asarray(_pad(np.array(xs), count), jnp.int32)
    parents = jnp.asarray(tree, jnp.int32)
    outcomes = jnp.asarray(list(itertools.product([False, True], repeat=nodes)))
    thresholds, corrections = (
        np.asarray(a, np.float64)
        for a in _forced_walks(verifier, x, parents, q, p, outcomes)
    )
    cdfs = np.cumsum(corrections, -1) / corrections.sum(-1, keepdims=True)
    which, u, w = quadrature_cells(thresholds, cdfs, np.array(weights))
    u = u.astype(np.float32)
    size = 1 << 17
    total = len(w)
    outs = []
    for start in range(0, total, size):
        part = slice(start, min(start + size, total))
        idx = _pad(which[part], size)
        uu = _pad(u[part], size)
        out = _verify(
            verifier, x[idx], parents, q[idx], p[idx], uu[:, :nodes], uu[:, nodes]
        )
        outs.append(
            {k: np.asarray(v)[: part.stop - part.start] for k, v in out.items()}
        )
    out = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    tokens = np.asarray(out["tokens"])
    n = np.asarray(out["num_accepted"])
    emitted, reached = {}, {}
    for k in range(nodes + 1):
        live = n >= k
        codes = tokens[live, :k] @ (vocab ** np.arange(k))
        table = np.zeros((vocab**k, vocab))
        np.add.at(table, (codes, tokens[live, k]), w[live])
        for code in np.nonzero(table.sum(1))[0]:
            prefix = tuple(int(code) // vocab**j % vocab for j in range(k))
            emitted[prefix] = table[code]
            reached[prefix] = table[code].sum()
    return TreeResult(emitted, reached, float((w * n).sum()))
