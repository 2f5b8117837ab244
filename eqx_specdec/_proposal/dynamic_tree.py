"""A tree of draft tokens whose shape is data: built per row and per step by expanding
the draft's most probable continuations (EAGLE-2), verified by the deterministic-candidate
rule."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._misc import no_type_check
from .abstract_proposal import AbstractProposal, as_probs, Models, StepOutcome, Theory
from .tree import verify_tree


@no_type_check  # its fields are checked by `__check_init__`
class DynamicTree(AbstractProposal):
    """A tree of draft tokens built per row and per step by the draft's most probable
    continuations (EAGLE-2; Li et al., EMNLP 2024), with a shape that is traced data:
    every shape up to `nodes` nodes runs in one compiled program.

    Each step expands the tree layer by layer: the root's `branching` most likely
    tokens form the first layer; at each of the next `depth - 1` layers, the
    `branching` nodes of the last layer with the highest path probability (the product
    of the draft's probabilities along the path) are expanded, each with its
    `branching` most likely tokens. Of all the candidates, the `nodes` with the highest
    path probability become the tree (a parent's is never below its child's, so the
    tree is closed under ancestors), laid out in depth-first order with siblings from the
    most to the least likely. The target scores the root and every node (one call per
    node, vmapped), and the tree is verified by the loop's tree verifier.

    The children are chosen deterministically from the draft's distribution, so the
    verifier's node rule must not read $q$: [`eqx_specdec.DeterministicCandidates`][]
    is lossless for any such choice; a rule that tests the children against $q$ (as if
    they were sampled) is lossy on them and is refused.

    **Arguments:**

    - `nodes`: the node budget $N$ (a Python int $\\ge 1$, at most the number of
        candidates, `branching + (layers - 1) * branching**2`).
    - `layers`: the depth of the expansion, the deepest a path can be (a Python int
        $\\ge 1$).
    - `branching`: the tokens each expanded node proposes, and the nodes expanded per
        layer (EAGLE-2's $k$; a Python int $\\ge 1$).
    """

    nodes: int = eqx.field(static=True)
    layers: int = eqx.field(static=True)
    branching: int = eqx.field(static=True)

    def __check_init__(self):
        for name, value in (
            ("nodes", self.nodes),
            ("layers", self.layers),
            ("branching", self.branching),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"DynamicTree(`{name}`=...) must be a Python int >= 1; got "
                    f"{value!r}."
                )
        if self.nodes > self.num_candidates():
            raise ValueError(
                f"DynamicTree(`nodes`={self.nodes}) is more than the "
                f"{self.num_candidates()} candidates that layers={self.layers} and "
                f"branching={self.branching} propose: lower `nodes`, or raise `layers` "
                "or `branching`."
            )
        if (self.branching + 1) ** self.layers >= 2**31:
            raise ValueError(
                f"DynamicTree(layers={self.layers}, branching={self.branching}) is "
                "too large to lay out: (branching + 1) ** layers must stay below 2**31."
            )

    def num_candidates(self) -> int:
        """The candidates of one step's expansion, of which the best `nodes` are kept:
        `branching + (layers - 1) * branching**2`.

        **Returns:**

        A Python int.
        """
        return self.branching + (self.layers - 1) * self.branching**2

    def slots(self) -> int:
        return self.depth() + 1

    def depth(self) -> int:
        return min(self.layers, self.nodes)

    def check(self, verifier) -> None:
        if getattr(verifier, "draft_shape", None) != "tree":
            raise TypeError(
                "The proposal is a DynamicTree, so `verifier` must be a tree verifier "
                "(an eqx_specdec.AbstractTreeVerifier, such as "
                f"TreeVerifier(DeterministicCandidates())); got {type(verifier).__name__}."
            )
        if verifier.tree is not None:
            raise ValueError(
                "`proposal` is a DynamicTree, whose shape changes per row and per step, "
                f"but the verifier has a fixed `tree` {verifier.tree}: build the "
                "verifier without `tree=`."
            )
        rule = verifier.drafting_rule()
        if rule.uses_draft_probs:
            raise ValueError(
                f"DynamicTree chooses its children deterministically, but the "
                f"verifier's node rule {type(rule).__name__} reads the draft's "
                "probabilities, testing the children as if they were sampled from q, "
                "which is lossy on deterministic children: use "
                "TreeVerifier(DeterministicCandidates())."
            )
        if verifier.depth_limit(self.nodes) < self.depth():
            raise ValueError(
                f"DynamicTree trees reach depth {self.depth()}, deeper than "
                f"{type(verifier).__name__} walks ({verifier.depth_limit(self.nodes)})."
            )

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
        del generated, states, active
        node_tokens, parents, q, p = jax.vmap(lambda t, n: self.build(models, t, n))(
            buffer, lengths
        )
        # Which contexts have children: their draft rows are read (by a rule that
        # reads q) and checked.
        ids = jnp.arange(-1, self.nodes, dtype=jnp.int32)
        with_children = jnp.any(parents[:, None, :] == ids[None, :, None], axis=-1)
        return verify_tree(
            models, verifier, node_tokens, parents, q, p, keys, with_children,
            depth=self.depth(), slots=self.slots(),
        )  # fmt: skip

    def build(
        self, models: Models, tokens: Int[Array, " width"], length: Int[Array, ""]
    ) -> tuple[
        Int[Array, " nodes"],
        Int[Array, " nodes"],
        Float[Array, "nodes+1 V"],
        Float[Array, "nodes+1 V"],
    ]:
        """Builds one row's tree after `tokens[:length]` and scores it.

        **Arguments:**

        - `models`: the loop's models.
        - `tokens`, `length`: the row's buffer and its length.

        **Returns:**

        `(node_tokens, parents, q, p)`: int32 `(N,)` each, in depth-first order, and
        the `(N + 1, V)` draft and target rows (row 0 at the root, row `i + 1` after node
        `i`; draft rows of unexpanded nodes are zeros).
        """
        k, depth = self.branching, self.layers
        candidates = self.num_candidates()

        def draft_row(path, d):
            """The draft's distribution after the first `d` tokens of `path`."""
            buf = _with_path(tokens, length, path, d)
            q = models.draft(buf, (length - 1 + d)[None])[0]
            return as_probs(q, models.outputs[0])

        root_q = draft_row(jnp.zeros((depth,), jnp.int32), jnp.int32(0))
        vocab = root_q.shape[-1]
        log_q, first = jax.lax.top_k(jnp.log(root_q), k)
        token = jnp.zeros((candidates,), jnp.int32).at[:k].set(first)
        score = jnp.full((candidates,), -jnp.inf, root_q.dtype).at[:k].set(log_q)
        parent = jnp.full((candidates,), -1, jnp.int32)
        level = jnp.zeros((candidates,), jnp.int32).at[:k].set(1)
        path = jnp.zeros((candidates, depth), jnp.int32).at[:k, 0].set(first)
        # The draft rows of the expanded candidates (zeros elsewhere), row 0 the root's.
        rows = jnp.zeros((candidates + 1, vocab), root_q.dtype).at[0].set(root_q)
        layer = jnp.arange(k, dtype=jnp.int32)  # the last layer's candidates
        start = k
        for d in range(1, depth):
            width = layer.shape[0]
            _, best = jax.lax.top_k(score[layer], min(k, width))
            frontier = layer[best]
            qs = jax.vmap(draft_row, in_axes=(0, None))(path[frontier], jnp.int32(d))
            rows = rows.at[frontier + 1].set(qs)
            log_q, children = jax.lax.top_k(jnp.log(qs), k)  # (k, k)
            new = start + jnp.arange(frontier.shape[0] * k, dtype=jnp.int32)
            owner = jnp.repeat(frontier, k)
            token = token.at[new].set(children.reshape(-1))
            score = score.at[new].set((score[frontier][:, None] + log_q).reshape(-1))
            parent = parent.at[new].set(owner)
            level = level.at[new].set(d + 1)
            path = path.at[new].set(path[owner].at[:, d].set(children.reshape(-1)))
            layer, start = new, start + new.shape[0]

        # The best `nodes` candidates (ties: the earlier, so a parent before its child).
        kept = jnp.argsort(-score, stable=True)[: self.nodes]
        position = (
            jnp.full((candidates,), -1, jnp.int32)
            .at[kept]
            .set(jnp.arange(self.nodes, dtype=jnp.int32))
        )
        kept_parent = jnp.where(parent[kept] >= 0, position[parent[kept]], -1)
        order = _depth_first(kept_parent, level[kept], k, depth)
        new_index = (
            jnp.zeros((self.nodes,), jnp.int32)
            .at[order]
            .set(jnp.arange(self.nodes, dtype=jnp.int32))
        )
        chosen = kept[order]
        old_parent = kept_parent[order]
        parents = jnp.where(old_parent >= 0, new_index[jnp.maximum(old_parent, 0)], -1)
        node_tokens = token[chosen]
        q = jnp.concatenate([rows[:1], rows[chosen + 1]])
        # The target after the root and after every node.
        contexts = jnp.concatenate([jnp.zeros((1, depth), jnp.int32), path[chosen]])
        levels = jnp.concatenate([jnp.zeros((1,), jnp.int32), level[chosen]])
        buffers = jax.vmap(lambda pa, d: _with_path(tokens, length, pa, d))(
            contexts, levels
        )
        p = jax.vmap(lambda b, d: models.target(b, (length - 1 + d)[None])[0])(
            buffers, levels
        )
        p = as_probs(p, models.outputs[1])
        return node_tokens, parents, q.astype(p.dtype), p


def _with_path(tokens, length, path, d):
    """`tokens` with the first `d` tokens of `path` written after `length`."""
    slots = jnp.arange(path.shape[0], dtype=jnp.int32)
    positions = jnp.where(slots < d, length + slots, tokens.shape[0])  # out: dropped
    return tokens.at[positions].set(path, mode="drop")


def _depth_first(parents, levels, branching: int, depth: int):
    """The order that lays a tree out depth first, siblings in their index order, for
    `parents` with every parent before its children: each node's key counts its
    sibling rank at each level of its path, in base `branching + 1` (a node has at most
    `branching` children)."""
    nodes = parents.shape[0]
    ids = jnp.arange(nodes, dtype=jnp.int32)
    siblings = (parents[None, :] == parents[:, None]) & (ids[None, :] < ids[:, None])
    rank = jnp.sum(siblings, axis=1).astype(jnp.int32)  # earlier siblings
    base = branching + 1

    def step(i, key):
        own = (rank[i] + 1) * base ** (depth - levels[i])
        above = jnp.where(parents[i] >= 0, key[jnp.maximum(parents[i], 0)], 0)
        return key.at[i].set(above + own)

    key = jax.lax.fori_loop(0, nodes, step, jnp.zeros((nodes,), jnp.int32))
    return jnp.argsort(key, stable=True).astype(jnp.int32)
