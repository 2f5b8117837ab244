"""Tree (multi-candidate) verification: SpecInfer-style trees of draft tokens."""

import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import jaxtyped

from .._custom_types import (
    NodeTokensRow,
    NodeUniformsRow,
    ParentsRow,
    SampleUniform,
    TreeOutputs,
    TreeProbsRow,
)
from .._misc import compute_dtype
from .._search import inverse_cdf
from .abstract_tree_verifier import (
    AbstractTreeVerifier,
    tree_field,
)
from .node_rules import AbstractNodeRule, IIDCandidates


class TreeVerifier(AbstractTreeVerifier):
    """Verifies a tree of draft tokens top-down: walks down from the root, trying each
    node's children in order with `node_rule`, descending into the first accepted child,
    and draws the correction from the final evolving target.

    The tree layout is [`eqx_specdec.AbstractTreeVerifier`][]'s (siblings in the order
    they are tried; `draft_probs` may be `None` for
    [`eqx_specdec.DeterministicCandidates`][]). A chain (`parents = [-1, 0, 1, ...]`) with [`eqx_specdec.IIDCandidates`][] is exactly
    the standard verifier.

    **Arguments:**

    - `node_rule`: an [`eqx_specdec.AbstractNodeRule`][]. Default
        [`eqx_specdec.IIDCandidates`][].
    - `tree`: the shape of the trees it verifies in
        [`eqx_specdec.speculative_decode`][] and the evaluation tools: the parent of
        each node in depth-first order, -1 for a child of the root (`(-1, -1, 0)`: two
        candidates at the root, the first with one child). `None` (the default) when
        each call gives it ([`eqx_specdec.verify`][]'s `parents`).
    """

    node_rule: AbstractNodeRule = IIDCandidates()
    tree: tuple[int, ...] | None = tree_field(default=None)

    @property
    def exact(self) -> bool:
        """Whether the node rule is exact (its `exact` declaration)."""
        return self.node_rule.exact

    def drafting_rule(self) -> AbstractNodeRule:
        return self.node_rule

    def _walk(self, node_tokens, parents, draft_probs, target_probs, decide, record):
        """The top-down walk. `decide(i, state, token, child)` is node `i`'s outcome;
        with `record`, each tested node's `pass_threshold` (NaN if not tested). Returns
        the accepted length, path, tokens, the correction's distribution and the
        thresholds (`None` without `record`)."""
        rule = self.node_rule
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

        def start(i):
            """The rule's state at context `i` (0: the root; i + 1: after node i)."""
            siblings = parents == i - 1
            return rule.init(
                target_probs[i].astype(dtype), draft_row(i), tokens_in, siblings
            )

        def select(flag, new, old):
            return jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)

        def step(i, carry):
            current, depth, child, state, path, tokens, thresholds = carry
            token = tokens_in[i]
            is_child = parents[i] == current
            if record:
                t = rule.pass_threshold(state, token, child)
                thresholds = thresholds.at[i].set(jnp.where(is_child, t, jnp.nan))
            passed = decide(i, state, token, child)
            accept = is_child & passed
            reject = is_child & ~passed
            state = select(
                accept,
                start(i + 1),
                select(reject, rule.reject(state, token, child), state),
            )
            path = jnp.where(accept, path.at[depth].set(i), path)
            tokens = jnp.where(accept, tokens.at[depth].set(token), tokens)
            current = jnp.where(accept, i, current)
            depth = depth + accept.astype(jnp.int32)
            # Which sibling the next child of `current` is: 0 after descending.
            child = jnp.where(accept, 0, child + reject.astype(jnp.int32))
            return current, depth, child, state, path, tokens, thresholds

        init = (
            jnp.int32(-1),
            jnp.int32(0),
            jnp.int32(0),
            start(0),
            jnp.full((nodes,), -1, jnp.int32),
            jnp.full((nodes + 1,), -1, jnp.int32),
            jnp.full((nodes,), jnp.nan, dtype) if record else None,
        )
        _, depth, _, state, path, tokens, thresholds = jax.lax.fori_loop(
            0, nodes, step, init
        )
        # A rule's update (zeroing a candidate's entry, a clip to 0) can hide a NaN or an
        # infinity of a row the walk read: with the input checks off, a tree holding one
        # (the checks read every row) ends in a NaN residual, whose draw is -1.
        totals = [jnp.sum(target_probs)]
        if draft_probs is not None:
            totals.append(jnp.sum(draft_probs))
        finite = jnp.isfinite(sum(t.astype(dtype) for t in totals))
        residual = jnp.where(finite, rule.correction(state).astype(dtype), jnp.nan)
        return depth, path, tokens, residual, thresholds

    def forced_walk(self, node_tokens, parents, draft_probs, target_probs, outcomes):
        """The top-down walk with each tested child's outcome forced: the node rule's
        `pass_threshold` at each tested node, and the final evolving target."""
        *_, residual, thresholds = self._walk(
            node_tokens,
            parents,
            draft_probs,
            target_probs,
            lambda i, *state: outcomes[i],
            record=True,
        )
        return thresholds, residual

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
        """Verifies one tree.

        **Returns:**

        `{"num_accepted": int32 scalar (the accepted path's length),
        "tokens": int32 (nodes + 1,) (the path's tokens, the correction, then -1),
        "path": int32 (nodes,) (the accepted nodes' indices, then -1)}`.
        """

        def decide(i, state, token, child):
            return self.node_rule.test(state, token, accept_uniforms[i], child)

        depth, path, tokens, residual, _ = self._walk(
            node_tokens, parents, draft_probs, target_probs, decide, record=False
        )
        correction = inverse_cdf(residual, sample_uniform)
        return {
            "num_accepted": depth,
            "tokens": tokens.at[depth].set(correction),
            "path": path,
        }
