"""Drafting inside the decoding loop: a chain of draft tokens, or a tree, for one row,
and the target's distributions for scoring it."""

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Key

from .._tree.node_rules import AbstractNodeRule


ModelOutputs = Literal["probs", "logits"]
ChainDrafting = Literal["sample", "argmax"]


def as_probs(x, outputs: ModelOutputs):
    """A model's output row(s) as probabilities."""
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return jax.nn.softmax(x, axis=-1) if outputs == "logits" else x


def tree_depths(tree: tuple[int, ...]) -> list[int]:
    """The depth of each node (1 for the root's children)."""
    depths = []
    for parent in tree:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def draft_chain(
    draft_model: Callable,
    target_model: Callable,
    tokens: Int[Array, " width"],
    length: Int[Array, ""],
    key: Key[Array, ""],
    *,
    gamma: int,
    drafting: ChainDrafting,
    outputs: ModelOutputs,
):
    """Drafts `gamma` tokens after `tokens[:length]`, one draft call each (sampled from
    $q_i$, or its argmax), then scores the chain with one target call.

    **Returns:**

    `(x, q, p)`: int32 `(gamma,)`, the draft's distributions `(gamma, V)` and the
    target's `(gamma + 1, V)`.
    """

    def one(tokens, i_key):
        i, k = i_key
        q = as_probs(draft_model(tokens, (length - 1 + i)[None])[0], outputs)
        if drafting == "argmax":
            x = jnp.argmax(q).astype(jnp.int32)
        else:
            x = jax.random.categorical(k, jnp.log(q)).astype(jnp.int32)
        return tokens.at[length + i].set(x), (x, q)

    keys = jax.random.split(key, gamma)
    tokens, (xs, qs) = jax.lax.scan(
        one, tokens, (jnp.arange(gamma, dtype=jnp.int32), keys)
    )
    positions = length - 1 + jnp.arange(gamma + 1, dtype=jnp.int32)
    p = as_probs(target_model(tokens, positions), outputs)
    return xs, qs, p


def draft_tree(
    draft_model: Callable,
    target_model: Callable,
    tokens: Int[Array, " width"],
    length: Int[Array, ""],
    key: Key[Array, ""],
    *,
    tree: tuple[int, ...],
    node_rule: AbstractNodeRule,
    outputs: ModelOutputs,
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
            q = draft_model(context(parent), position(parent)[None])[0]
            laws[parent] = as_probs(q, outputs)
            drafted[parent] = jnp.zeros(laws[parent].shape, bool)
        law = node_rule.candidate_law(laws[parent], drafted[parent])
        x = jax.random.categorical(keys[i], jnp.log(law)).astype(jnp.int32)
        ids = jnp.arange(law.shape[0], dtype=jnp.int32)
        drafted[parent] = drafted[parent] | (ids == x)
        node_tokens.append(x)
    contexts = [-1] + list(range(len(tree)))
    buffers = jnp.stack([context(c) for c in contexts])
    positions = jnp.stack([position(c) for c in contexts])
    p = jax.vmap(lambda b, pos: target_model(b, pos[None])[0])(buffers, positions)
    p = as_probs(p, outputs)
    zeros = jnp.zeros(p.shape[-1:], p.dtype)
    q: Float[Array, "nodes+1 vocab"] = jnp.stack(
        [laws.get(c, zeros).astype(p.dtype) for c in contexts]
    )
    return jnp.stack(node_tokens), q, p


def token_buffer(prompt_tokens, room: int):
    """The prompts, left-aligned, followed by `room` free slots per row."""
    batch, width = prompt_tokens.shape
    buffer = jnp.zeros((batch, width + room), jnp.int32)
    return buffer.at[:, :width].set(prompt_tokens.astype(jnp.int32))
