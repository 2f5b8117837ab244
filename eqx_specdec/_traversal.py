"""Traversal verification (Weng et al., NeurIPS 2025): a lossless tree verifier that
works leaves first, testing whole paths instead of single children."""

import typing

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Bool, Float, Int, Integer, jaxtyped

from ._abstract_tree_verifier import AbstractTreeVerifier, tree_navigation
from ._misc import compute_dtype
from ._node_rules import AbstractNodeRule, WithoutReplacementCandidates
from ._search import has_mass, inverse_cdf


class _Walk(typing.NamedTuple):
    depth: Int[Array, ""]  # the accepted path's length
    path: Int[Array, " nodes"]  # the accepted nodes, then -1
    thresholds: Float[Array, " nodes"]  # each tested node's pa (NaN if not tested)
    correction: Float[Array, " vocab"]  # the distribution the correction follows


def _path_probability(pa_parent, p, q):
    """`min(1, pa_parent * p / q)`, with 1 where `q = 0` (a token the draft could not
    have drawn)."""
    num = pa_parent * p
    return jnp.where(num >= q, jnp.ones_like(num), num / jnp.where(q > 0, q, 1))


class TraversalVerifier(AbstractTreeVerifier):
    """Traversal verification (Weng et al., NeurIPS 2025): verifies a tree leaves first.

    Each node $c$ carries a path acceptance probability
    $\\pi(c) = \\min(1, \\pi(\\text{parent}) M_b(c) / M_s(c))$ (the root has 1), with $M_b$
    the target at the parent and $M_s$ the draft law of the parent's remaining children.
    The nodes are tested in post-order (the first live leaf in depth-first order): a
    node that passes, $\\eta < \\pi(x)$, accepts its whole path and the correction is drawn
    from $M_b(\\cdot \\mid x)$. A node that fails is deleted, and its parent $y$ takes the
    residual: with $S = \\sum_v (\\pi(y) M_b(v \\mid y) - M_s(v \\mid y))_+$,

    - $M_b(\\cdot \\mid y) \\leftarrow \\operatorname{norm}((\\pi(y) M_b - M_s)_+)$,
    - $M_s(\\cdot \\mid y) \\leftarrow M_s$ without the deleted token, renormalised,
    - $\\pi(y) \\leftarrow S / (S + 1 - \\pi(y))$ (`parent_update`; the root keeps 1).

    A node whose children are all deleted is a leaf and is tested next; if every child of
    the root is deleted, nothing is accepted and the correction follows the root's
    residual. Lossless when each node's children are drawn without replacement from the
    draft (its `drafting_rule`); on a chain it is block verification, and its expected
    accepted length is never below top-down verification of the same tree.

    The same tree layout, inputs and outputs as [`eqx_specdec.TreeVerifier`][]; one
    uniform per node (each node is tested at most once). Each rejection costs $O(V)$ (the
    parent's residual); moving to the next leaf costs $O(1)$ per node.

    **Arguments:**

    - `max_depth`: the largest depth of the trees it verifies (a child of the root has
        depth 1), a Python int, or `None` for the number of nodes (any tree). The walk
        keeps the residuals of the current path, `2 (max_depth + 1)` rows of the
        vocabulary per tree: set it for wide trees of many nodes. A deeper tree is an
        error of [`eqx_specdec.tree_accept`][]'s checks.
    """

    max_depth: int | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        if self.max_depth is not None and (
            not isinstance(self.max_depth, int) or self.max_depth < 1
        ):
            raise ValueError(
                "TraversalVerifier(`max_depth`=...) must be a positive Python int (the "
                f"largest depth of the trees) or None; got {self.max_depth!r}."
            )

    def drafting_rule(self) -> AbstractNodeRule:
        return WithoutReplacementCandidates()

    def depth_limit(self, nodes: int) -> int:
        """The deepest tree the walk can hold, for trees of `nodes` nodes."""
        return nodes if self.max_depth is None else min(self.max_depth, nodes)

    def parent_update(
        self,
        pa: Float[Array, ""],
        total: Float[Array, ""],
        removed: Float[Array, ""],
    ) -> Float[Array, ""]:
        """The parent's path acceptance probability after a child was deleted.

        **Arguments:**

        - `pa`: its previous value $\\pi(y)$.
        - `total`: the residual's mass $S$.
        - `removed`: the draft probability $M_s(x \\mid y)$ of the deleted child.

        **Returns:**

        $S / (S + 1 - \\pi(y))$ (1 where the denominator is 0). The extension point for
        research variants (and the test suite's lossy control); the root keeps 1
        whatever it returns.
        """
        del removed
        denominator = total + 1 - pa
        return jnp.where(
            denominator > 0, total / jnp.where(denominator > 0, denominator, 1), 1
        )

    def _walk(self, node_tokens, parents, draft_probs, target_probs, decide) -> _Walk:
        nodes, vocab = node_tokens.shape[0], target_probs.shape[1]
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)
        p_rows, q_rows = target_probs, draft_probs
        tokens = node_tokens.astype(jnp.int32)
        nav = tree_navigation(parents.astype(jnp.int32))
        limit = self.depth_limit(nodes)
        # The pristine ratio of each node at its parent: p_parent(x) and q_parent(x).
        p_at = p_rows[nav.parents + 1, tokens].astype(dtype)
        q_at = q_rows[nav.parents + 1, tokens].astype(dtype)

        def descend(node, depth, stack_nodes, stack_pa):
            """From `node` (just entered, at `depth`, its pa set), down the first
            children to the first leaf of its subtree; every node entered is fresh."""

            def cond(state):
                node, depth, _, _ = state
                return (nav.first_child[node] >= 0) & (depth < limit)

            def body(state):
                node, depth, stack_nodes, stack_pa = state
                child = nav.first_child[node]
                pa = _path_probability(stack_pa[depth], p_at[child], q_at[child])
                depth = depth + 1
                return (
                    child,
                    depth,
                    stack_nodes.at[depth].set(child),
                    stack_pa.at[depth].set(pa),
                )

            return jax.lax.while_loop(cond, body, (node, depth, stack_nodes, stack_pa))

        def residual_rows(node, depth, mb, ms, modified):
            keep = modified[depth]
            row = jnp.maximum(node + 1, 0)
            target = jnp.where(keep, mb[depth], p_rows[row].astype(dtype))
            draft = jnp.where(keep, ms[depth], q_rows[row].astype(dtype))
            return target, draft

        stack_nodes = jnp.full((limit + 1,), -1, jnp.int32)
        stack_pa = jnp.zeros((limit + 1,), dtype).at[0].set(1)
        mb = jnp.zeros((limit + 1, vocab), dtype)
        ms = jnp.zeros((limit + 1, vocab), dtype)
        modified = jnp.zeros((limit + 1,), bool)
        thresholds = jnp.full((nodes,), jnp.nan, dtype)
        start = nav.first_child_of_root
        has_start = start >= 0
        node, depth, stack_nodes, stack_pa = descend(
            jnp.maximum(start, 0),
            jnp.int32(1),
            stack_nodes.at[1].set(start),
            stack_pa.at[1].set(
                _path_probability(
                    jnp.ones((), dtype),
                    p_at[jnp.maximum(start, 0)],
                    q_at[jnp.maximum(start, 0)],
                )
            ),
        )
        node = jnp.where(has_start, node, -1)
        depth = jnp.where(has_start, depth, 0)

        def cond(state):
            node, _, _, _, _, _, _, _, done = state
            return ~done & (node >= 0)

        def body(state):
            node, depth, stack_nodes, stack_pa, mb, ms, modified, thresholds, _ = state
            pa = stack_pa[depth]
            thresholds = thresholds.at[node].set(pa)
            accept = decide(node, pa)
            # The rejection: the parent (one level up) takes the residual.
            up = depth - 1
            parent = stack_nodes[up]
            target, draft = residual_rows(parent, up, mb, ms, modified)
            pa_parent = stack_pa[up]
            residual = jnp.maximum(pa_parent * target - draft, 0)
            total = jnp.sum(residual)
            keep = has_mass(total, dtype)
            new_target = jnp.where(keep, residual / jnp.where(keep, total, 1), target)
            token = tokens[node]
            remaining = 1 - draft[token]
            ids = jnp.arange(vocab, dtype=jnp.int32)
            new_draft = jnp.where(
                (ids == token) | (remaining <= 0),
                0,
                draft / jnp.where(remaining > 0, remaining, 1),
            )
            new_pa = jnp.where(
                up == 0,
                jnp.ones((), dtype),
                self.parent_update(pa_parent, total, draft[token]),
            )
            # One row written per step (never a select over the whole stack).
            mb = mb.at[up].set(jnp.where(accept, mb[up], new_target))
            ms = ms.at[up].set(jnp.where(accept, ms[up], new_draft))
            # Only the current path's ancestors with a deleted child are modified: the
            # parent now is, the deleted node's level no longer.
            modified = jnp.where(
                accept, modified, modified.at[up].set(True).at[depth].set(False)
            )
            stack_pa = jnp.where(accept, stack_pa, stack_pa.at[up].set(new_pa))
            # The next node in post-order: the next sibling's first leaf, or the parent.
            sibling = nav.next_sibling[node]
            has_sibling = sibling >= 0
            s = jnp.maximum(sibling, 0)
            pa_sibling = _path_probability(
                new_pa, new_target[tokens[s]], new_draft[tokens[s]]
            )
            entered = descend(
                s,
                depth,
                stack_nodes.at[depth].set(s),
                stack_pa.at[depth].set(pa_sibling),
            )
            cleared = stack_nodes.at[depth].set(-1)
            next_node = jnp.where(has_sibling, entered[0], parent)
            next_depth = jnp.where(has_sibling, entered[1], up)
            next_nodes = jnp.where(has_sibling, entered[2], cleared)
            next_pa = jnp.where(has_sibling, entered[3], stack_pa)
            return (
                jnp.where(accept, node, next_node),
                jnp.where(accept, depth, next_depth),
                jnp.where(accept, stack_nodes, next_nodes),
                jnp.where(accept, stack_pa, next_pa),
                mb,
                ms,
                modified,
                thresholds,
                accept,
            )

        init = (
            node,
            depth,
            stack_nodes,
            stack_pa,
            mb,
            ms,
            modified,
            thresholds,
            jnp.zeros((), bool),
        )
        node, depth, stack_nodes, _, mb, ms, modified, thresholds, done = (
            jax.lax.while_loop(cond, body, init)
        )
        depth = jnp.where(done, depth, 0)
        node = jnp.where(done, node, -1)
        correction, _ = residual_rows(node, depth, mb, ms, modified)
        positions = jnp.arange(nodes, dtype=jnp.int32)
        on_path = jnp.full((nodes,), -1, jnp.int32).at[:limit].set(stack_nodes[1:])
        path = jnp.where(positions < depth, on_path, -1)
        return _Walk(depth, path, thresholds, correction)

    @jaxtyped(typechecker=beartype)
    def row(
        self,
        node_tokens: Integer[Array, " nodes"],
        parents: Integer[Array, " nodes"],
        draft_probs: Float[Array, "nodes+1 vocab"] | None,
        target_probs: Float[Array, "nodes+1 vocab"],
        accept_uniforms: Float[Array, " nodes"],
        sample_uniform: Float[Array, ""],
    ) -> dict[str, Int[Array, "..."]]:
        """Verifies one tree (outputs as for [`eqx_specdec.TreeVerifier.row`][])."""
        if draft_probs is None:
            raise TypeError(
                "TraversalVerifier reads the draft distributions: pass `draft_probs`, "
                "float (N + 1, V), the law each node's children were drawn from."
            )
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)

        def decide(node, pa):
            return accept_uniforms[node].astype(dtype) < pa

        walk = self._walk(node_tokens, parents, draft_probs, target_probs, decide)
        return _outputs(walk, node_tokens, sample_uniform)

    def forced_walk(
        self,
        node_tokens: Integer[Array, " nodes"],
        parents: Integer[Array, " nodes"],
        draft_probs: Float[Array, "nodes+1 vocab"] | None,
        target_probs: Float[Array, "nodes+1 vocab"],
        outcomes: Bool[Array, " nodes"],
    ) -> tuple[Float[Array, " nodes"], Float[Array, " vocab"]]:
        walk = self._walk(
            node_tokens, parents, draft_probs, target_probs, lambda n, pa: outcomes[n]
        )
        return walk.thresholds, walk.correction


def _outputs(walk: _Walk, node_tokens, sample_uniform):
    tokens_in = node_tokens.astype(jnp.int32)
    on_path = walk.path >= 0
    path_tokens = jnp.where(on_path, tokens_in[jnp.maximum(walk.path, 0)], -1)
    correction = inverse_cdf(walk.correction, sample_uniform)
    tokens = jnp.concatenate([path_tokens, jnp.full((1,), -1, jnp.int32)])
    tokens = tokens.at[walk.depth].set(correction.astype(jnp.int32))
    return {"num_accepted": walk.depth, "tokens": tokens, "path": walk.path}
