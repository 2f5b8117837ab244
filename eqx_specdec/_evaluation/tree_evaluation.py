"""The losslessness tools on trees: exact quadrature (every assignment of tokens to the
nodes, cells cut at every reachable pass threshold) and Monte Carlo."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._capabilities import require
from .._errors import MissingCapabilityError
from .._tree.abstract_tree_verifier import AbstractTreeVerifier, tree_depths, tree_of
from .emission import cells, EmissionEstimate, padded_size
from .validation import check_distributions


# Beyond this many verifier rows, quadrature on a tree is refused (use Monte Carlo).
_MAX_QUADRATURE_ROWS = 4_000_000


def _check(verifier, draft_probs, target_probs, *, exact: bool):
    tree = tree_of(verifier, "the tree evaluation tools")
    rule = verifier.drafting_rule()
    require(rule, "candidate_law", "drafting a tree in the evaluation tools")
    if exact:
        require(
            verifier,
            "forced_walk",
            "exact evaluation of trees",
            'use method="monte-carlo"',
        )
    check_distributions(
        "the tree evaluation tools", draft_probs=draft_probs, target_probs=target_probs
    )
    p = np.asarray(target_probs, np.float64)
    shape = (len(tree) + 1, p.shape[-1])
    if p.shape != shape:
        raise ValueError(
            f"`target_probs` must have shape (N + 1, V) = {shape} for a tree of "
            f"{len(tree)} nodes: row 0 at the root, row i + 1 after node i; got {p.shape}."
        )
    if draft_probs is None:
        raise ValueError(
            "`draft_probs` is required for a tree: the (N + 1, V) draft distributions "
            "the children of each context are drafted from."
        )
    q = np.asarray(draft_probs, np.float64)
    if q.shape != shape:
        raise ValueError(f"`draft_probs` must have shape {shape}; got {q.shape}.")
    return tree, jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32)


def _draft_laws(rule, tree, q, tokens):
    """Each node's candidate law at its parent, given the assignment `tokens` `(N,)`:
    `(N, V)`."""
    vocab = q.shape[-1]
    ids = jnp.arange(vocab, dtype=jnp.int32)
    drafted = {}
    laws = []
    for i, parent in enumerate(tree):
        seen = drafted.get(parent, jnp.zeros((vocab,), bool))
        laws.append(rule.candidate_law(q[parent + 1], seen))
        drafted[parent] = seen | (ids == tokens[i])
    return jnp.stack(laws)


def _accumulate_tree(estimate, out, weights, vocab):
    emitted, reached, accepted = estimate
    tokens, path = np.asarray(out["tokens"]), np.asarray(out["path"])
    n = np.asarray(out["num_accepted"])
    contexts = np.concatenate([np.zeros((len(n), 1), np.int64), path + 1], axis=1)
    for k in range(tokens.shape[1]):
        valid = tokens[:, k] >= 0
        np.add.at(emitted, (contexts[valid, k], tokens[valid, k]), weights[valid])
        np.add.at(reached, contexts[valid, k], weights[valid])
    np.add.at(accepted, n, weights)


def _depth(tree) -> int:
    return max(tree_depths(tree))


def quadrature_cells(thresholds, cdfs, probability):
    """The quadrature grid of a tree verifier, per token assignment `a`: the cells of
    each node's uniform cut at every threshold it can be tested at (`thresholds`
    `(A, O, N)` over the forced outcomes, NaN where untested), times the cells of the
    correction's uniform cut at every breakpoint of its distributions (`cdfs`
    `(A, O, V)`). Returns `(which, uniforms, weights)`: each cell's assignment index,
    midpoint `(N + 1,)` and weight `probability[a]` times its volume."""
    nodes = thresholds.shape[-1]
    which, uniforms, weights = [], [], []
    for a in range(len(probability)):
        grids = []
        for i in range(nodes):
            found = thresholds[a, :, i]
            grids.append(cells(found[np.isfinite(found)], 1))
        grids.append(cells(cdfs[a].ravel(), 1))
        mids = np.meshgrid(*[g[0] for g in grids], indexing="ij")
        widths = np.meshgrid(*[g[1] for g in grids], indexing="ij")
        volume = np.prod([w.ravel() for w in widths], axis=0)
        which.append(np.full(len(volume), a))
        uniforms.append(np.stack([m.ravel() for m in mids], -1))
        weights.append(probability[a] * volume)
    return np.concatenate(which), np.concatenate(uniforms), np.concatenate(weights)


def tree_emission_by_quadrature(
    verifier: AbstractTreeVerifier,
    draft_probs,
    target_probs,
    *,
    chunk_size=1 << 16,
) -> EmissionEstimate:
    """Exact emission of a tree verifier (see `emission_by_quadrature`)."""
    tree, q, p = _check(verifier, draft_probs, target_probs, exact=True)
    rule, nodes, vocab = verifier.drafting_rule(), len(tree), p.shape[-1]
    assignments = np.array(
        list(itertools.product(range(vocab), repeat=nodes)), np.int32
    )
    outcomes = np.array(list(itertools.product([False, True], repeat=nodes)), bool)
    if len(assignments) * len(outcomes) > _MAX_QUADRATURE_ROWS:
        raise ValueError(
            f"Quadrature on a tree of {nodes} nodes over V = {vocab} enumerates "
            f'{len(assignments) * len(outcomes):,} walks; use method="monte-carlo".'
        )
    laws = _all_draft_laws(rule, tree, q, jnp.asarray(assignments))
    chosen = np.take_along_axis(np.asarray(laws, np.float64), assignments[..., None], 2)
    probability = np.prod(chosen[..., 0], axis=1)
    keep = probability > 0
    assignments, probability = assignments[keep], probability[keep]
    walks = _all_forced_walks(verifier, tree, q, p, jnp.asarray(assignments), outcomes)
    thresholds, cdfs = (np.asarray(a, np.float64) for a in walks)
    which, uniforms, weights = quadrature_cells(thresholds, cdfs, probability)
    total = len(weights)
    if total > _MAX_QUADRATURE_ROWS:
        raise ValueError(
            f"Quadrature on this tree needs {total:,} verifier rows; use "
            'method="monte-carlo".'
        )
    xs = assignments[which]
    uniforms = uniforms.astype(np.float32)
    estimate = (
        np.zeros((nodes + 1, vocab)),
        np.zeros(nodes + 1),
        np.zeros(_depth(tree) + 1),
    )
    parents = jnp.asarray(tree, jnp.int32)
    draft = q if rule.uses_draft_probs else None
    size = padded_size(total, chunk_size)
    for start in range(0, total, size):
        stop = min(start + size, total)
        pad = ((0, size - (stop - start)), (0, 0))
        x = jnp.asarray(np.pad(xs[start:stop], pad))
        u = jnp.asarray(np.pad(uniforms[start:stop], pad, constant_values=0.5))
        out = _tree_rows(verifier, x, parents, draft, p, u[:, :nodes], u[:, nodes])
        out = {k: np.asarray(v)[: stop - start] for k, v in out.items()}
        _accumulate_tree(estimate, out, weights[start:stop], vocab)
    emitted, reached, accepted = estimate
    return EmissionEstimate(emitted, reached, None, accepted)


def tree_emission_by_monte_carlo(
    verifier: AbstractTreeVerifier,
    draft_probs,
    target_probs,
    key,
    num_draws,
    chunk_size,
) -> EmissionEstimate:
    """Monte Carlo emission of a tree verifier (see `emission_by_monte_carlo`)."""
    tree, q, p = _check(verifier, draft_probs, target_probs, exact=False)
    nodes, vocab = len(tree), p.shape[-1]
    estimate = (
        np.zeros((nodes + 1, vocab)),
        np.zeros(nodes + 1),
        np.zeros(_depth(tree) + 1),
    )
    chunks = -(-num_draws // chunk_size)
    for i, chunk_key in enumerate(jax.random.split(key, chunks)):
        rows = min(chunk_size, num_draws - i * chunk_size)
        out = _tree_draws(verifier, tree, q, p, jax.random.split(chunk_key, chunk_size))
        out = {k: np.asarray(v)[:rows] for k, v in out.items()}
        _accumulate_tree(estimate, out, np.ones(rows), vocab)
    emitted, reached, accepted = estimate
    return EmissionEstimate(emitted, reached, num_draws, accepted)


def tree_quadrature_problem(verifier, vocab: int):
    """Why exact quadrature does not apply to this tree (the error to raise), or None."""
    try:
        for stage, name in (
            (verifier, "forced_walk"),
            (verifier.drafting_rule(), "candidate_law"),
        ):
            require(
                stage, name, "exact evaluation of trees", 'use method="monte-carlo"'
            )
    except MissingCapabilityError as error:
        return error
    nodes = len(tree_of(verifier, "exact evaluation of trees"))
    if vocab**nodes * 2**nodes > _MAX_QUADRATURE_ROWS:
        return ValueError(
            f'`method="quadrature"` does not apply here: V^N * 2^N = {vocab}^{nodes} '
            f"* 2^{nodes} walks are too many to enumerate."
        )
    return None


@eqx.filter_jit
def _all_draft_laws(rule, tree, q, assignments):
    return jax.vmap(lambda x: _draft_laws(rule, tree, q, x))(assignments)


@eqx.filter_jit
def _all_forced_walks(verifier, tree, q, p, assignments, outcomes):
    parents = jnp.asarray(tree, jnp.int32)
    draft = q if verifier.drafting_rule().uses_draft_probs else None

    def walk(x, o):
        thresholds, residual = verifier.forced_walk(x, parents, draft, p, o)
        return thresholds, jnp.cumsum(residual) / jnp.sum(residual)

    return jax.vmap(jax.vmap(walk, (None, 0)), (0, None))(assignments, outcomes)


@eqx.filter_jit
def _tree_rows(verifier, node_tokens, parents, draft, p, accept, sample):
    rows = jax.vmap(verifier.row, in_axes=(0, None, None, None, 0, 0))
    return rows(node_tokens, parents, draft, p, accept, sample)


@eqx.filter_jit
def _tree_draws(verifier, tree, q, p, keys):
    """One random step per key: the tree drafted with the rule's `candidate_law`, then
    verified."""
    rule, nodes, vocab = verifier.drafting_rule(), len(tree), p.shape[-1]
    parents = jnp.asarray(tree, jnp.int32)
    draft = q if rule.uses_draft_probs else None
    ids = jnp.arange(vocab, dtype=jnp.int32)

    def draw(key):
        keys = jax.random.split(key, nodes + 2)
        drafted, tokens = {}, []
        for i, parent in enumerate(tree):
            seen = drafted.get(parent, jnp.zeros((vocab,), bool))
            law = rule.candidate_law(q[parent + 1], seen)
            x = jax.random.categorical(keys[i], jnp.log(law)).astype(jnp.int32)
            drafted[parent] = seen | (ids == x)
            tokens.append(x)
        u = jax.random.uniform(keys[nodes], (nodes,), jnp.float32)
        s = jax.random.uniform(keys[nodes + 1], (), jnp.float32)
        return verifier.row(jnp.stack(tokens), parents, draft, p, u, s)

    return jax.vmap(draw)(keys)
