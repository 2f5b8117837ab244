"""Traversal verification (Weng et al., NeurIPS 2025): a lossless tree verifier that
works leaves first, testing whole paths instead of single children."""

import typing

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Bool, Float, Int, jaxtyped

from .._custom_types import (
    NodeTokensRow,
    NodeUniformsRow,
    ParentsRow,
    SampleUniform,
    TreeOutputs,
    TreeProbsRow,
)
from .._misc import compute_dtype
from .._search import has_mass, inverse_cdf
from .abstract_tree_verifier import AbstractTreeVerifier, tree_field, tree_navigation
from .node_rules import AbstractNodeRule, WithoutReplacementCandidates


class _Walk(typing.NamedTuple):
    depth: Int[Array, ""]  # the accepted path's length
    path: Int[Array, " nodes"]  # the accepted nodes, then -1
    thresholds: Float[Array, " nodes"]  # each tested node's pa (NaN if not tested)
    correction: Float[Array, " V"]  # the distribution the correction follows


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
        error of [`eqx_specdec.verify`][]'s checks.
    - `tree`: the shape of the trees it verifies in
        [`eqx_specdec.speculative_decode`][] and the evaluation tools, as for
        [`eqx_specdec.TreeVerifier`][]; `None` (the default) when each call gives it.
    """

    max_depth: int | None = eqx.field(default=None, static=True)
    tree: tuple[int, ...] | None = tree_field(default=None)

    def __check_init__(self):
        if self.max_depth is not None and (
            not isinstance(self.max_depth, int) or self.max_depth < 1
        ):
            raise ValueError(
                "TraversalVerifier(`max_depth`=...) must be a positive Python int (the "
                f"largest depth of the trees) or None; got {self.max_depth!r}."
            )

    @property
    def exact(self) -> bool:
        """Always: traversal verification is exact."""
        return True

    def drafting_rule(self) -> AbstractNodeRule:
        return WithoutReplacementCandidates()

    def depth_limit(self, nodes: int) -> int:
        """The deepest tree the walk can hold, for trees of `nodes` nodes."""
        return nodes if self.max_depth is None else min(self.max_depth, nodes)

    def parent_update(
        self,
        pa: Float[Array, "*B"],
        total: Float[Array, "*B"],
        removed: Float[Array, "*B"],
    ) -> Float[Array, "*B"]:
        """The parent's path acceptance probability after a child was deleted
        (elementwise: the walk calls it on a batch of trees).

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
        """The walk on a batch `(B, ...)`, batched by hand and compacted: each step of
        the loop takes the first `_chunk(B)` trees still walking (in batch order),
        gathers their state by index, tests one node of each and writes one vocabulary
        row per rejection. A step costs $O(\\text{chunk} \\cdot V)$ whatever the batch,
        so the trees that finished early cost nothing while the others walk on (a
        `vmap` of a per-tree `while_loop` would select over the whole carry, the
        residual stack included, at every step). `decide(rows, nodes, pa)` is the test
        outcome of the trees `rows` at their nodes."""
        batch, nodes = node_tokens.shape
        vocab = target_probs.shape[-1]
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)
        p_rows, q_rows = target_probs, draft_probs
        tokens = node_tokens.astype(jnp.int32)
        nav = jax.vmap(tree_navigation)(parents.astype(jnp.int32))
        limit = self.depth_limit(nodes)
        chunk = _chunk(batch)
        # The pristine p_parent(x) and q_parent(x) of each node.
        p_at = _gather(p_rows, nav.parents + 1, tokens).astype(dtype)
        q_at = _gather(q_rows, nav.parents + 1, tokens).astype(dtype)

        def descend(r, moving, node, depth, stack_nodes, stack_pa):
            """For the trees `r` that are `moving`, from `node` (just entered at
            `depth`, its pa set) down the first children to the first leaf of its
            subtree (every node entered is fresh, so its ratio is the pristine one).
            The stacks are the trees' own, `(len(r), limit + 1)`."""
            local = jnp.arange(r.shape[0])
            first_child, p_r, q_r = nav.first_child[r], p_at[r], q_at[r]

            def can(state):
                node, depth, _, _ = state
                child = first_child[local, jnp.maximum(node, 0)]
                return moving & (node >= 0) & (child >= 0) & (depth < limit)

            def body(state):
                node, depth, stack_nodes, stack_pa = state
                go = can(state)
                child = jnp.maximum(first_child[local, jnp.maximum(node, 0)], 0)
                pa = _path_probability(
                    stack_pa[local, depth], p_r[local, child], q_r[local, child]
                )
                below = jnp.minimum(depth + 1, limit)
                return (
                    jnp.where(go, child, node),
                    jnp.where(go, below, depth),
                    stack_nodes.at[local, below].set(
                        jnp.where(go, child, stack_nodes[local, below])
                    ),
                    stack_pa.at[local, below].set(
                        jnp.where(go, pa, stack_pa[local, below])
                    ),
                )

            return jax.lax.while_loop(
                lambda state: jnp.any(can(state)),
                body,
                (node, depth, stack_nodes, stack_pa),
            )

        def residual_rows(r, node, depth, mb, ms, modified):
            """The current target and draft rows of the trees `r` at `node`, on their
            path at `depth`: the stack's if a child of it was deleted, else the
            inputs'."""
            keep = modified[:, None]
            row = jnp.maximum(node + 1, 0)
            target = jnp.where(keep, mb[r, depth], p_rows[r, row].astype(dtype))
            draft = jnp.where(keep, ms[r, depth], q_rows[r, row].astype(dtype))
            return target, draft

        everyone = jnp.arange(batch)
        start = nav.first_child_of_root
        has_start = start >= 0
        first = jnp.maximum(start, 0)
        stack_nodes = jnp.full((batch, limit + 1), -1, jnp.int32).at[:, 1].set(start)
        stack_pa = jnp.zeros((batch, limit + 1), dtype).at[:, 0].set(1)
        stack_pa = stack_pa.at[:, 1].set(
            _path_probability(
                jnp.ones((batch,), dtype), p_at[everyone, first], q_at[everyone, first]
            )
        )
        node, depth, stack_nodes, stack_pa = descend(
            everyone,
            has_start,
            jnp.where(has_start, first, -1),
            jnp.where(has_start, 1, 0).astype(jnp.int32),
            stack_nodes,
            stack_pa,
        )
        mb = jnp.zeros((batch, limit + 1, vocab), dtype)
        ms = jnp.zeros((batch, limit + 1, vocab), dtype)
        modified = jnp.zeros((batch, limit + 1), bool)
        thresholds = jnp.full((batch, nodes), jnp.nan, dtype)
        ids = jnp.arange(vocab, dtype=jnp.int32)
        local = jnp.arange(chunk)

        def active_rows(state):
            node, _, _, _, _, _, _, _, done = state
            return ~done & (node >= 0)

        def body(state):
            node, depth, stack_nodes, stack_pa, mb, ms, modified, thresholds, done = (
                state
            )
            # The first `chunk` walking trees; `batch` pads (written nowhere).
            (sel,) = jnp.nonzero(active_rows(state), size=chunk, fill_value=batch)
            live = sel < batch
            r = jnp.minimum(sel, batch - 1)
            node_r, depth_r, done_r = node[r], depth[r], done[r]
            nodes_r, pa_r, modified_r = stack_nodes[r], stack_pa[r], modified[r]
            tokens_r = tokens[r]
            at = jnp.maximum(node_r, 0)
            pa = pa_r[local, depth_r]
            thresholds_r = thresholds[r].at[local, at].set(pa)
            accept = live & decide(r, at, pa)
            reject = live & ~accept
            # A rejection: the parent (one level up) takes the residual.
            up = jnp.maximum(depth_r - 1, 0)
            parent = nodes_r[local, up]
            target, draft = residual_rows(r, parent, up, mb, ms, modified_r[local, up])
            pa_parent = pa_r[local, up]
            residual = jnp.maximum(pa_parent[:, None] * target - draft, 0)
            total = jnp.sum(residual, axis=1)
            keep = has_mass(total, dtype)[:, None]
            new_target = jnp.where(
                keep, residual / jnp.where(keep, total[:, None], 1), target
            )
            token = tokens_r[local, at]
            removed = draft[local, token]
            remaining = (1 - removed)[:, None]
            new_draft = jnp.where(
                (ids[None, :] == token[:, None]) | (remaining <= 0),
                0,
                draft / jnp.where(remaining > 0, remaining, 1),
            )
            new_pa = jnp.where(
                up == 0,
                jnp.ones((), dtype),
                self.parent_update(pa_parent, total, removed),
            )
            written = jnp.where(reject, sel, batch)
            mb = mb.at[written, up].set(new_target, mode="drop")
            ms = ms.at[written, up].set(new_draft, mode="drop")
            # Only the current path's ancestors with a deleted child are modified: the
            # parent now is, the deleted node's level no longer.
            modified_r = modified_r.at[local, up].set(modified_r[local, up] | reject)
            modified_r = modified_r.at[local, depth_r].set(
                modified_r[local, depth_r] & ~reject
            )
            pa_r = pa_r.at[local, up].set(jnp.where(reject, new_pa, pa_r[local, up]))
            # The next node in post-order: the next sibling's first leaf, or the parent.
            sibling = nav.next_sibling[r, at]
            to_sibling = reject & (sibling >= 0)
            to_parent = reject & (sibling < 0)
            s = jnp.maximum(sibling, 0)
            pa_sibling = _path_probability(
                new_pa,
                new_target[local, tokens_r[local, s]],
                new_draft[local, tokens_r[local, s]],
            )
            nodes_r = nodes_r.at[local, depth_r].set(
                jnp.where(
                    to_sibling,
                    s,
                    jnp.where(to_parent, -1, nodes_r[local, depth_r]),
                )
            )
            pa_r = pa_r.at[local, depth_r].set(
                jnp.where(to_sibling, pa_sibling, pa_r[local, depth_r])
            )
            node_r = jnp.where(to_sibling, s, jnp.where(to_parent, parent, node_r))
            depth_r = jnp.where(to_parent, up, depth_r)
            node_r, depth_r, nodes_r, pa_r = descend(
                r, to_sibling, node_r, depth_r, nodes_r, pa_r
            )

            def put(whole, part):
                return whole.at[sel].set(part, mode="drop")

            return (
                put(node, node_r),
                put(depth, depth_r),
                put(stack_nodes, nodes_r),
                put(stack_pa, pa_r),
                mb,
                ms,
                put(modified, modified_r),
                put(thresholds, thresholds_r),
                put(done, done_r | accept),
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
            jnp.zeros((batch,), bool),
        )
        node, depth, stack_nodes, _, mb, ms, modified, thresholds, done = (
            jax.lax.while_loop(lambda state: jnp.any(active_rows(state)), body, init)
        )
        depth = jnp.where(done, depth, 0)
        node = jnp.where(done, node, -1)
        correction, _ = residual_rows(
            everyone, node, depth, mb, ms, modified[everyone, depth]
        )
        positions = jnp.arange(nodes, dtype=jnp.int32)
        on_path = (
            jnp.full((batch, nodes), -1, jnp.int32)
            .at[:, :limit]
            .set(stack_nodes[:, 1:])
        )
        path = jnp.where(positions[None, :] < depth[:, None], on_path, -1)
        return _Walk(depth, path, thresholds, correction)

    @jaxtyped(typechecker=beartype)
    def row(
        self,
        node_tokens: NodeTokensRow,
        parents: ParentsRow,
        draft_probs: TreeProbsRow | None,
        target_probs: TreeProbsRow,
        accept_uniforms: NodeUniformsRow,
        sample_uniform: SampleUniform,
    ) -> TreeOutputs:
        """Verifies one tree (outputs as for [`eqx_specdec.TreeVerifier.row`][])."""
        _require_draft(draft_probs)
        one = [a[None] for a in (node_tokens, parents, draft_probs, target_probs)]
        out = self._verify(*one, accept_uniforms[None], sample_uniform[None])
        return {key: value[0] for key, value in out.items()}

    def _verify(self, node_tokens, parents, draft_probs, target_probs, u, s):
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)

        def decide(rows, node, pa):
            return u[rows, node].astype(dtype) < pa

        walk = self._walk(node_tokens, parents, draft_probs, target_probs, decide)
        return jax.vmap(_outputs)(walk, node_tokens, s)

    def __call__(self, *inputs) -> dict[str, Int[Array, "..."]]:
        """Verifies a batch of trees, batched by hand (the same outputs as `row`
        vmapped, without the whole-carry selects a vmapped walk would make)."""
        node_tokens, parents, draft_probs, target_probs, u, s = inputs
        _require_draft(draft_probs)
        return self._verify(node_tokens, parents, draft_probs, target_probs, u, s)

    def forced_walk(
        self,
        node_tokens: NodeTokensRow,
        parents: ParentsRow,
        draft_probs: TreeProbsRow | None,
        target_probs: TreeProbsRow,
        outcomes: Bool[Array, " nodes"],
    ) -> tuple[Float[Array, " nodes"], Float[Array, " V"]]:
        one = [a[None] for a in (node_tokens, parents, draft_probs, target_probs)]
        walk = self._walk(*one, lambda rows, n, pa: outcomes[n])
        return walk.thresholds[0], walk.correction[0]


def _outputs(walk: _Walk, node_tokens, sample_uniform):
    tokens_in = node_tokens.astype(jnp.int32)
    on_path = walk.path >= 0
    path_tokens = jnp.where(on_path, tokens_in[jnp.maximum(walk.path, 0)], -1)
    correction = inverse_cdf(walk.correction, sample_uniform)
    tokens = jnp.concatenate([path_tokens, jnp.full((1,), -1, jnp.int32)])
    tokens = tokens.at[walk.depth].set(correction.astype(jnp.int32))
    return {"num_accepted": walk.depth, "tokens": tokens, "path": walk.path}


def _require_draft(draft_probs):
    if draft_probs is None:
        raise TypeError(
            "TraversalVerifier reads the draft distributions: pass `draft_probs`, "
            "float (N + 1, V), the law each node's children were drawn from."
        )


def _chunk(batch: int) -> int:
    """Trees advanced per step of the walk: an eighth of the batch, at least 8 (at most
    the batch). Small enough that the trees which finished early cost little, large
    enough that the loop's own per-step overhead stays small (measured at B = 64,
    V = 32,000 on CPU: 8 rows per step against 16, 32 and 64 in `bench_trees.py`)."""
    return min(batch, max(8, batch // 8))


def _gather(probs, contexts, tokens):
    """`probs[b, contexts[b, i], tokens[b, i]]`: `(B, N)`."""
    rows = jnp.arange(probs.shape[0])[:, None]
    return probs[rows, contexts, tokens]
