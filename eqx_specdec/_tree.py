"""Tree (multi-candidate) verification: SpecInfer-style trees of draft tokens."""

import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Float, Int, Integer, jaxtyped

from ._abstract_verifier import malformed_tokens
from ._checks import (
    check_level,
    checked,
    distribution_problems,
    stage_problem,
    token_problems,
    uniform_problems,
)
from ._jit import entry_point
from ._misc import compute_dtype
from ._node_rules import AbstractNodeRule, IIDCandidates
from ._search import inverse_cdf


class TreeVerifier(eqx.Module):
    """Verifies a tree of draft tokens: walks down from the root, trying each node's
    children in order with `node_rule`, descending into the first accepted child, and
    draws the correction from the final evolving target.

    **Tree layout** (one row; `N` nodes at most, fixed shapes, traced contents): node `i`
    holds `node_tokens[i]`; `parents[i]` is `-1` for a child of the root, the index of its
    parent otherwise, and any value below `-1` for padding. Nodes are in depth-first order
    (a parent before its children, siblings in the order they are tried), as serving stacks
    lay them out. `target_probs[0]` is the target's distribution at the root and
    `target_probs[i + 1]` the one after node `i`; `draft_probs` likewise (the law the
    node's children were drawn from; `None` for [`eqx_specdec.DeterministicCandidates`][]).
    A chain (`parents = [-1, 0, 1, ...]`) with [`eqx_specdec.IIDCandidates`][] is exactly
    the standard verifier.

    **Arguments:**

    - `node_rule`: an [`eqx_specdec.AbstractNodeRule`][]. Default
        [`eqx_specdec.IIDCandidates`][].
    """

    node_rule: AbstractNodeRule = IIDCandidates()

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
        """Verifies one tree.

        **Returns:**

        `{"num_accepted": int32 scalar (the accepted path's length),
        "tokens": int32 (nodes + 1,) (the path's tokens, the correction, then -1),
        "path": int32 (nodes,) (the accepted nodes' indices, then -1)}`.
        """
        nodes, vocab = node_tokens.shape[0], target_probs.shape[1]
        dtypes = [target_probs.dtype] + (
            [] if draft_probs is None else [draft_probs.dtype]
        )
        dtype = compute_dtype(*dtypes)
        tokens_in = node_tokens.astype(jnp.int32)
        parents = parents.astype(jnp.int32)

        def draft_row(i):
            if draft_probs is None:
                return jnp.zeros((vocab,), dtype)
            return draft_probs[i].astype(dtype)

        def step(i, carry):
            current, depth, residual, mass, draft, path, tokens = carry
            token = tokens_in[i]
            is_child = parents[i] == current
            passed = self.node_rule.test(
                residual, mass, draft, token, accept_uniforms[i]
            )
            accept = is_child & passed
            reject = is_child & ~passed
            r_residual, r_mass, r_draft = self.node_rule.reject(
                residual, mass, draft, token
            )
            residual = jnp.where(
                accept,
                target_probs[i + 1].astype(dtype),
                jnp.where(reject, r_residual, residual),
            )
            mass = jnp.where(
                accept, jnp.ones((), dtype), jnp.where(reject, r_mass, mass)
            )
            draft = jnp.where(
                accept, draft_row(i + 1), jnp.where(reject, r_draft, draft)
            )
            path = jnp.where(accept, path.at[depth].set(i), path)
            tokens = jnp.where(accept, tokens.at[depth].set(token), tokens)
            current = jnp.where(accept, i, current)
            depth = depth + accept.astype(jnp.int32)
            return current, depth, residual, mass, draft, path, tokens

        init = (
            jnp.int32(-1),
            jnp.int32(0),
            target_probs[0].astype(dtype),
            jnp.ones((), dtype),
            draft_row(0),
            jnp.full((nodes,), -1, jnp.int32),
            jnp.full((nodes + 1,), -1, jnp.int32),
        )
        _, depth, residual, _, _, path, tokens = jax.lax.fori_loop(0, nodes, step, init)
        correction = inverse_cdf(residual, sample_uniform)
        return {
            "num_accepted": depth,
            "tokens": tokens.at[depth].set(correction),
            "path": path,
        }

    def __call__(self, *inputs) -> dict[str, Int[Array, "..."]]:
        """Verifies a batch of trees: [`eqx_specdec.TreeVerifier.row`][] vmapped."""
        return jax.vmap(self.row)(*inputs)


def _tree_problems(parents):
    nodes = parents.shape[1]
    ids = jnp.arange(nodes, dtype=jnp.int32)[None, :]
    used = parents >= -1
    bad = used & (parents >= ids)
    return [
        (
            jnp.any(bad, axis=1),
            "`parents` is not in depth-first order in row {row} (the first such row). "
            "Each node's parent index must be below its own: -1 for a child of the "
            "root, an earlier node's index otherwise, below -1 for padding.",
        )
    ]


def check_tree_shape(tree) -> tuple[int, ...]:
    """A tree's shape as a tuple of Python ints, the parent of each node in depth-first
    order, or a `TypeError` / `ValueError` saying what is wrong (trace time)."""
    if tree is None:
        raise TypeError(
            "A TreeVerifier needs the tree's shape: pass `tree=` the parent of each node "
            "in depth-first order, e.g. `tree=(-1, 0, -1, 2)` for two candidates at the "
            "root with one child each."
        )
    tree = tuple(tree)
    if not tree or not all(
        isinstance(p, int) and -1 <= p < i for i, p in enumerate(tree)
    ):
        raise ValueError(
            "`tree` must be a non-empty tuple of Python ints, the parent of each node in "
            "depth-first order: -1 for a child of the root, else an earlier node's "
            f"index; got {tree!r}."
        )
    return tree


@entry_point
@typing.no_type_check  # validated by hand, with messages naming the argument
def tree_accept(
    node_tokens: Integer[Array, "batch nodes"],
    parents: Integer[Array, "batch nodes"],
    draft_probs: Float[Array, "batch nodes+1 vocab"] | None,
    target_probs: Float[Array, "batch nodes+1 vocab"],
    accept_uniforms: Float[Array, "batch nodes"],
    sample_uniforms: Float[Array, " batch"],
    *,
    verifier: TreeVerifier = TreeVerifier(),
    check_inputs: bool | Literal["all"] = True,
) -> dict[str, Int[Array, "..."]]:
    """Verifies a batch of draft trees (see [`eqx_specdec.TreeVerifier`][] for the
    layout).

    **Arguments:**

    - `node_tokens`: integer `(B, N)`, the token at each node.
    - `parents`: integer `(B, N)`, each node's parent (-1: the root; below -1: padding).
    - `draft_probs`: float `(B, N + 1, V)`, or `None` for deterministic children.
    - `target_probs`: float `(B, N + 1, V)`.
    - `accept_uniforms`: float `(B, N)`, one uniform per node.
    - `sample_uniforms`: float `(B,)`.
    - `verifier`: the [`eqx_specdec.TreeVerifier`][] to run.
    - `check_inputs`: the check level, as for [`eqx_specdec.speculative_accept`][];
        both `True` and `"all"` check every row (the walk reads them all),
        plus the depth-first order of `parents`.

    **Returns:**

    A dict with `"num_accepted"` int32 `(B,)`, `"tokens"` int32 `(B, N + 1)` and
    `"path"` int32 `(B, N)`: the accepted nodes' indices, for keeping their KV-cache
    entries.
    """
    node_tokens, parents, target_probs, accept_uniforms, sample_uniforms = (
        jnp.asarray(a)
        for a in (node_tokens, parents, target_probs, accept_uniforms, sample_uniforms)
    )
    if draft_probs is not None:
        draft_probs = jnp.asarray(draft_probs)
    batch, nodes = node_tokens.shape
    vocab = target_probs.shape[-1]
    shapes = {
        "parents": (parents, (batch, nodes)),
        "target_probs": (target_probs, (batch, nodes + 1, vocab)),
        "draft_probs": (draft_probs, (batch, nodes + 1, vocab)),
        "accept_uniforms": (accept_uniforms, (batch, nodes)),
        "sample_uniforms": (sample_uniforms, (batch,)),
    }
    for name, (array, shape) in shapes.items():
        if array is not None and tuple(array.shape) != shape:
            raise ValueError(
                f"`{name}` must have shape {shape} for `node_tokens` of shape "
                f"{(batch, nodes)} and vocabulary {vocab}; got {tuple(array.shape)}."
            )
    if draft_probs is None and verifier.node_rule.uses_draft_probs:
        raise TypeError(
            f"{type(verifier.node_rule).__name__} reads the draft distributions: pass "
            "`draft_probs`, float (B, N + 1, V) (only rules with "
            "`uses_draft_probs = False`, such as DeterministicCandidates, take None)."
        )
    level = check_level(check_inputs)
    outputs = verifier(
        node_tokens,
        parents,
        draft_probs,
        target_probs,
        accept_uniforms,
        sample_uniforms,
    )
    if level is None:
        return outputs
    # The top-down walk reads every row (each node's context row is selected under a
    # mask), so every level checks every row.
    problems = token_problems(node_tokens, vocab, "node_tokens", valid=parents >= -1)
    problems += _tree_problems(parents)
    if draft_probs is not None:
        problems += distribution_problems("draft_probs", draft_probs)
    problems += distribution_problems("target_probs", target_probs)
    problems += uniform_problems("accept_uniforms", accept_uniforms)
    problems += uniform_problems("sample_uniforms", sample_uniforms)
    n = outputs["num_accepted"]
    problems.append(
        stage_problem(
            verifier.node_rule,
            "node rule",
            malformed_tokens(outputs["tokens"], n, vocab) | (n < 0) | (n > nodes),
            "tokens not laid out as the contract says",
            "its test must accept a child with the probability the tree walk expects, "
            "and its residual must stay a distribution.",
        )
    )
    return checked(outputs, problems)
