"""The base every tree verifier shares, and the navigation of a tree's layout."""

import abc
import typing
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._capabilities import capability
from .._custom_types import (
    NodeTokensRow,
    NodeUniformsRow,
    ParentsRow,
    SampleUniform,
    TreeOutputs,
    TreeProbsRow,
)
from .node_rules import AbstractNodeRule


class AbstractTreeVerifier(eqx.Module):
    """A verifier of a tree of draft tokens. [`eqx_specdec.TreeVerifier`][] (top-down,
    one node rule) and [`eqx_specdec.TraversalVerifier`][] (leaves first) implement it;
    [`eqx_specdec.verify`][], [`eqx_specdec.speculative_decode`][] with `tree` and
    the evaluation tools take any subclass.

    **Tree layout** (one row; `N` nodes at most, fixed shapes, traced contents): node `i`
    holds `node_tokens[i]`; `parents[i]` is `-1` for a child of the root, the index of its
    parent otherwise, and any value below `-1` for padding. Nodes are in depth-first order
    (a parent before its children, siblings in the order they were drafted).
    `target_probs[0]` is the target's distribution at the root and `target_probs[i + 1]`
    the one after node `i`; `draft_probs` likewise (the law the node's children were drawn
    from; `None` where the drafting rule reads no draft).

    **Declared by every subclass:** `row`, `drafting_rule`, `exact` (a property: whether
    the verifier is exact, a Python bool), and the field `tree`: the
    shape of the trees it verifies in [`eqx_specdec.speculative_decode`][] and the
    evaluation tools, the parent of each node in depth-first order as a tuple of Python
    ints (validated when the verifier is built), or `None`
    when the shape comes with each call ([`eqx_specdec.verify`][]'s `parents`).

    **Capabilities** (default raises [`eqx_specdec.MissingCapabilityError`][]):
    `forced_walk` (exact evaluation of trees). A verifier that delegates a capability
    to a field declares it in the class attribute `capabilities_from`.

    **Class attribute:** `draft_shape = "tree"`, the shape of the drafts it verifies
    (what the proposals read).
    """

    draft_shape: ClassVar[str] = "tree"
    tree: eqx.AbstractVar[tuple[int, ...] | None]
    capabilities_from: ClassVar[dict[str, tuple[tuple[str, str], ...]]] = {}

    @property
    @abc.abstractmethod
    def exact(self) -> bool:
        """Whether the verifier is exact: with children drafted by its `drafting_rule`,
        the emitted tokens follow the target exactly. A Python bool, known before
        tracing."""

    def __check_init__(self):
        if self.tree is not None:
            check_static_depth(self, self.tree)

    @abc.abstractmethod
    def row(
        self,
        node_tokens: NodeTokensRow,
        parents: ParentsRow,
        draft_probs: TreeProbsRow | None,
        target_probs: TreeProbsRow,
        accept_uniforms: NodeUniformsRow,
        sample_uniform: SampleUniform,
    ) -> TreeOutputs:
        """Verifies one tree.

        **Arguments:**

        - `node_tokens`, `parents`: the tree (see the layout above).
        - `draft_probs`, `target_probs`: `(N + 1, V)`, per context.
        - `accept_uniforms`: `(N,)`, one uniform per node.
        - `sample_uniform`: the correction's uniform.

        **Returns:**

        `{"num_accepted": int32 scalar (the accepted path's length),
        "tokens": int32 (nodes + 1,) (the path's tokens, the correction, then -1),
        "path": int32 (nodes,) (the accepted nodes' indices, then -1)}`.
        """

    @abc.abstractmethod
    def drafting_rule(self) -> AbstractNodeRule:
        """The node rule whose `candidate_law` says how this verifier's trees must be
        drafted (the decoding loop and the evaluation tools draft with it), and whose
        `uses_draft_probs` says whether `draft_probs` is read.

        **Returns:**

        An [`eqx_specdec.AbstractNodeRule`][].
        """

    def depth_limit(self, nodes: int) -> int:
        """The deepest tree this verifier can walk, for trees of `nodes` nodes (a
        deeper one is an error of [`eqx_specdec.verify`][]'s checks). By default any
        depth.

        **Arguments:**

        - `nodes`: the number of nodes `N`, a Python int.

        **Returns:**

        A Python int.
        """
        return nodes

    @capability
    def forced_walk(
        self,
        node_tokens: NodeTokensRow,
        parents: ParentsRow,
        draft_probs: TreeProbsRow | None,
        target_probs: TreeProbsRow,
        outcomes: Bool[Array, " nodes"],
    ) -> tuple[Float[Array, " nodes"], Float[Array, " V"]]:
        """Capability for exact evaluation of trees
        ([`eqx_specdec.evaluation.emission_by_quadrature`][] with a tree): the walk of `row` with
        the test of each node forced to `outcomes[i]`. Traced.

        **Arguments:**

        - as for `row`, with `outcomes` instead of the uniforms.

        **Returns:**

        `(thresholds, correction)`: for each node the value $t$ such that the test it
        was given passes exactly when its uniform is below $t$ (NaN for a node not
        tested), and the (unnormalised) distribution the correction is drawn from.
        """

    def __call__(self, *inputs) -> dict[str, Int[Array, "..."]]:
        """Verifies a batch of trees: `row` vmapped."""
        return jax.vmap(self.row)(*inputs)


def tree_of(verifier: AbstractTreeVerifier, feature: str) -> tuple[int, ...]:
    """The verifier's `tree`, or a `ValueError` saying that `feature` needs it and how
    to give it."""
    if verifier.tree is None:
        name = type(verifier).__name__
        raise ValueError(
            f"{feature} needs the tree's shape, and this {name} has none: build it "
            f"with `tree=`, the parent of each node in depth-first order, e.g. "
            f"`{name}(..., tree=(-1, -1, 0))` for two candidates at the root, the "
            "first with one child."
        )
    return verifier.tree


def tree_field(**kwargs):
    """The `tree` field of a tree verifier: static, validated by `check_tree_shape`."""
    return eqx.field(static=True, converter=check_tree_shape, **kwargs)


def check_tree_shape(tree) -> tuple[int, ...] | None:
    """A tree's shape as a tuple of Python ints, the parent of each node in depth-first
    order (or `None`), else a `ValueError` saying what is wrong."""
    if tree is None:
        return None
    tree = tuple(tree)
    if not tree or not all(
        isinstance(p, int) and not isinstance(p, bool) and -1 <= p < i
        for i, p in enumerate(tree)
    ):
        raise ValueError(
            "`tree` must be a non-empty tuple of Python ints, the parent of each node in "
            "depth-first order: -1 for a child of the root, else an earlier node's "
            f"index; got {tree!r}."
        )
    return tree


def tree_depths(tree: tuple[int, ...]) -> list[int]:
    """The depth of each node of a tree shape (1 for the root's children)."""
    depths: list[int] = []
    for parent in tree:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def check_static_depth(verifier: AbstractTreeVerifier, tree: tuple[int, ...]):
    """Trace-time check that a tree of known shape is within the verifier's depth
    limit: a `ValueError` naming the verifier and the fix otherwise."""
    deepest, limit = max(tree_depths(tree)), verifier.depth_limit(len(tree))
    if deepest > limit:
        raise ValueError(
            f"`tree` has depth {deepest}, deeper than {type(verifier).__name__} walks "
            f"({limit}): raise its `max_depth` to at least {deepest}."
        )


class TreeNavigation(typing.NamedTuple):
    """The links of a tree layout, for walking it: `-1` where there is none. Padding
    nodes (and any node below one) do not exist."""

    parents: Int[Array, " nodes"]  # clipped to [-1, N)
    exists: Bool[Array, " nodes"]
    depth: Int[Array, " nodes"]  # 1 for a child of the root
    first_child: Int[Array, " nodes"]
    next_sibling: Int[Array, " nodes"]
    first_child_of_root: Int[Array, ""]


def tree_navigation(parents: Int[Array, " nodes"]) -> TreeNavigation:
    """The links of one tree layout (`parents` in depth-first order). $O(N^2)$ boolean
    work, no vocabulary-sized work."""
    nodes = parents.shape[0]
    clipped = jnp.clip(parents, -1, nodes - 1)

    def step(i, state):
        exists, depth = state
        p = clipped[i]
        parent_ok = (parents[i] == -1) | ((parents[i] >= 0) & exists[jnp.maximum(p, 0)])
        ok = (parents[i] >= -1) & (parents[i] < i) & parent_ok
        d = jnp.where(p >= 0, depth[jnp.maximum(p, 0)] + 1, 1)
        return exists.at[i].set(ok), depth.at[i].set(jnp.where(ok, d, 0))

    exists, depth = jax.lax.fori_loop(
        0,
        nodes,
        step,
        (jnp.zeros((nodes,), bool), jnp.zeros((nodes,), jnp.int32)),
    )
    ids = jnp.arange(nodes, dtype=jnp.int32)
    child = exists[None, :] & (clipped[None, :] == ids[:, None])  # [i, j]: j child of i

    def first(mask, axis):
        found = jnp.min(jnp.where(mask, ids, nodes), axis=axis)
        return jnp.where(found < nodes, found, -1).astype(jnp.int32)

    first_child = first(child, 1)
    sibling = (
        exists[None, :]
        & (clipped[None, :] == clipped[:, None])
        & (ids[None, :] > ids[:, None])
    )
    next_sibling = jnp.where(exists, first(sibling, 1), -1)
    root_children = exists & (clipped == -1)
    first_child_of_root = first(root_children, 0)
    return TreeNavigation(
        clipped, exists, depth, first_child, next_sibling, first_child_of_root
    )
