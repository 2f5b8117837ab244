"""A tree of draft tokens: drafted node by node with its node rule's candidate law,
every context scored by the target, walked by a tree verifier."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Key

from .._capabilities import require
from .._inputs.checks import invalid_distributions
from .._inputs.logprobs import emitted_logprobs, tree_rows
from .._misc import no_type_check
from .._search import draw as draw_token
from .._tree.abstract_tree_verifier import (
    AbstractTreeVerifier,
    check_static_depth,
    check_tree_shape,
    tree_depths,
    tree_of,
)
from .._tree.node_rules import AbstractNodeRule
from .abstract_proposal import (
    AbstractProposal,
    as_probs,
    default_proposal,
    Models,
    StepOutcome,
    Theory,
    uniforms,
)


@no_type_check  # its fields are checked by `__check_init__`
class Tree(AbstractProposal):
    """A tree of draft tokens per step, verified by a tree verifier
    ([`eqx_specdec.TreeVerifier`][], [`eqx_specdec.TraversalVerifier`][]): the
    default proposal of [`eqx_specdec.speculative_decode`][] for a tree verifier is
    `Tree(verifier.tree)`.

    Each step drafts the tree in depth-first order (the children of a node drawn from
    the draft after it by the verifier's node rule's
    [`eqx_specdec.AbstractNodeRule.candidate_law`][]: i.i.d. for
    [`eqx_specdec.IIDCandidates`][], without replacement for
    [`eqx_specdec.WithoutReplacementCandidates`][], the top-$k$ for
    [`eqx_specdec.DeterministicCandidates`][]), scores the root and every node with the
    target (one call per node, vmapped; a transformer would use a tree attention
    mask), and commits the accepted path and the correction. A tree has no theory
    (`DecodeResult.theory` is `"none"`).

    **Arguments:**

    - `parents`: the parent of each node in depth-first order, -1 for a child of the
        root: `(-1, -1, 0)` is two candidates at the root, the first with one child. A
        tuple of Python ints.
    """

    parents: tuple[int, ...] = eqx.field(static=True, converter=check_tree_shape)

    def __check_init__(self):
        if self.parents is None:
            raise ValueError(
                "Tree(`parents`=...) must be a non-empty tuple of Python ints, the "
                "parent of each node in depth-first order; got None."
            )

    def slots(self) -> int:
        return max(tree_depths(self.parents)) + 1

    def depth(self) -> int:
        return max(tree_depths(self.parents))

    def check(self, verifier) -> None:
        if getattr(verifier, "draft_shape", None) != "tree":
            raise TypeError(
                "The proposal is a Tree, so `verifier` must be a tree verifier "
                "(TreeVerifier or TraversalVerifier, an eqx_specdec.AbstractTreeVerifier); "
                f"got {type(verifier).__name__}."
            )
        if verifier.tree is not None and verifier.tree != self.parents:
            raise ValueError(
                f"`proposal` is Tree({self.parents}), but the verifier's own `tree` is "
                f"{verifier.tree}: give the shape once, as the verifier's `tree` (and "
                "leave `proposal` out)."
            )
        rule = verifier.drafting_rule()
        require(rule, "candidate_law", "drafting a tree in the decoding loop")
        check_static_depth(verifier, self.parents)

    def theory(self, verifier) -> Theory:
        return "none"

    def step(
        self,
        models,
        verifier,
        buffer,
        lengths,
        keys,
        generated,
        states=(None, None),
        active=None,
    ) -> StepOutcome:
        del active  # every row's tree is drafted: the tree's shape is static
        rule = verifier.drafting_rule()
        nodes, dq, p = jax.vmap(
            lambda t, n, k: draft_tree(models, t, n, k, self.parents, rule)
        )(buffer, lengths, keys[:, 0])
        parents = jnp.broadcast_to(jnp.asarray(self.parents, jnp.int32), nodes.shape)
        # The target's row at every context, the draft's at those with children (the
        # draft rows of leaves are zeros): each may be read by the walk.
        with_children = [
            c in set(self.parents) for c in [-1, *range(len(self.parents))]
        ]
        used = jnp.broadcast_to(jnp.asarray(with_children), dq.shape[:-1])
        return verify_tree(
            models, verifier, nodes, parents, dq, p, keys, used,
            depth=self.depth(), slots=self.slots(),
        )  # fmt: skip


def verify_tree(
    models: Models,
    verifier: AbstractTreeVerifier,
    nodes: Int[Array, "B nodes"],
    parents: Int[Array, "B nodes"],
    dq: Float[Array, "B nodes+1 V"],
    p: Float[Array, "B nodes+1 V"],
    keys: Key[Array, "B 4"],
    used: Bool[Array, "B nodes+1"],
    *,
    depth: int,
    slots: int,
) -> StepOutcome:
    """Verifies a batch of drafted trees and hands the step's outcome to the loop: the
    uniforms from the step's keys, the verifier on the trees, the path's slots, the
    emitted log-probabilities (when asked) and the flags of invalid rows (the draft's
    where `used`)."""
    rule = verifier.drafting_rule()
    accept, sample = uniforms(keys, nodes.shape[1], False)
    draft_rows = dq if rule.uses_draft_probs else None
    out = verifier(nodes, parents, draft_rows, p, accept, sample)
    batch = nodes.shape[0]
    reached = jnp.full((batch, depth + 1), jnp.nan, jnp.float32)
    drafted = jnp.full((batch,), nodes.shape[1], jnp.int32)
    # The verifier's tokens cover every node; a step writes the path's slots.
    tokens = out["tokens"][:, :slots]
    logprobs = None
    if models.logprobs:
        rows = tree_rows(out["path"])[:, :slots]
        emitted_rows = jnp.take_along_axis(p, rows[..., None], axis=1)
        logprobs = emitted_logprobs(tokens, emitted_rows)
    invalid = (invalid_distributions(dq, used), invalid_distributions(p))
    return StepOutcome(
        out["num_accepted"],
        tokens,
        reached,
        drafted,
        jnp.asarray(batch * (nodes.shape[1] + 1), jnp.int32),
        invalid=invalid,
        logprobs=logprobs,
    )


def draft_tree(
    models: Models,
    tokens: Int[Array, " width"],
    length: Int[Array, ""],
    key: Key[Array, ""],
    tree: tuple[int, ...],
    node_rule: AbstractNodeRule,
):
    """Drafts one tree in depth-first order after `tokens[:length]`: each child drawn
    from its rule's `candidate_law` (given the draft after its parent and the siblings
    drafted before it), then scores the root and every node with the target (one
    branch buffer each: the reference model interface has no tree attention).

    **Returns:**

    `(node_tokens, q, p)`: int32 `(N,)`, and `(N + 1, V)` draft and target rows (row 0
    at the root, row `i + 1` after node `i`; draft rows of leaves are zeros).
    """
    depths = tree_depths(tree)
    keys = jax.random.split(key, len(tree))
    node_tokens: list = []

    def context(node):
        """The row's buffer with the path to `node` written in."""
        path, buf = [], tokens
        while node >= 0:
            path.append(node)
            node = tree[node]
        for a in path:
            buf = buf.at[length + depths[a] - 1].set(node_tokens[a])
        return buf

    def position(node):
        return length - 1 + (0 if node < 0 else depths[node])

    laws: dict = {}
    drafted: dict = {}
    for i, parent in enumerate(tree):
        if parent not in laws:
            q = models.draft(context(parent), position(parent)[None])[0]
            laws[parent] = as_probs(q, models.outputs[0])
            drafted[parent] = jnp.zeros(laws[parent].shape, bool)
        law = node_rule.candidate_law(laws[parent], drafted[parent])
        x = jnp.maximum(
            draw_token(keys[i], law), 0
        )  # -1 (invalid law): the check stops the row
        ids = jnp.arange(law.shape[0], dtype=jnp.int32)
        drafted[parent] = drafted[parent] | (ids == x)
        node_tokens.append(x)
    contexts = [-1] + list(range(len(tree)))
    buffers = jnp.stack([context(c) for c in contexts])
    positions = jnp.stack([position(c) for c in contexts])
    p = jax.vmap(lambda b, pos: models.target(b, pos[None])[0])(buffers, positions)
    p = as_probs(p, models.outputs[1])
    zeros = jnp.zeros(p.shape[-1:], p.dtype)
    q: Float[Array, "nodes+1 V"] = jnp.stack(
        [laws.get(c, zeros).astype(p.dtype) for c in contexts]
    )
    return jnp.stack(node_tokens), q, p


@default_proposal.register
def _tree_for(verifier: AbstractTreeVerifier) -> Tree:
    return Tree(tree_of(verifier, "speculative_decode"))
