"""Tree (multi-candidate) verification: SpecInfer-style trees of draft tokens."""

import typing
from typing import ClassVar

import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Float, Integer, jaxtyped

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
from .._verify.abstract_verifier import malformed_tokens
from .._verify.checks import (
    check_level,
    Checked,
    checked,
    CheckLevel,
    distribution_problems,
    stage_problem,
    token_problems,
    uniform_problems,
)
from .._verify.entry import contract_call, StepOptions, verification_step
from .._verify.inputs import StepArguments, TREE_NAMES, validate_step
from .._verify.keys import row_uniforms
from .._verify.logprobs import check_logprobs, LogProbs, tree_rows, with_logprobs
from .._verify.masks import allowed_tokens, mask_problems, masked_probs
from .._verify.typed_inputs import as_array, Draft, Probabilities, Uniforms
from .abstract_tree_verifier import (
    AbstractTreeVerifier,
    tree_field,
    tree_navigation,
    tree_of,
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
        each call gives it ([`eqx_specdec.tree_accept`][]'s `parents`).
    """

    node_rule: AbstractNodeRule = IIDCandidates()
    tree: tuple[int, ...] | None = tree_field(default=None)
    capabilities_from: ClassVar[dict[str, tuple[tuple[str, str], ...]]] = {
        "forced_walk": (("node_rule", "pass_threshold"),)
    }

    @property
    def exact(self) -> bool:
        """Whether the node rule is exact (its `exact` declaration)."""
        return self.node_rule.exact

    def drafting_rule(self) -> AbstractNodeRule:
        return self.node_rule

    def _walk(self, node_tokens, parents, draft_probs, target_probs, decide, record):
        """The top-down walk. `decide(i, residual, mass, draft, token, child)` is node
        `i`'s
        outcome; with `record`, each tested node's `pass_threshold` (NaN if not
        tested). Returns the accepted length, path, tokens, the final evolving target
        and the thresholds (`None` without `record`)."""
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

        def step(i, carry):
            current, depth, child, residual, mass, draft, path, tokens, thresholds = (
                carry
            )
            token = tokens_in[i]
            is_child = parents[i] == current
            if record:
                t = rule.pass_threshold(residual, mass, draft, token, child)
                thresholds = thresholds.at[i].set(jnp.where(is_child, t, jnp.nan))
            passed = decide(i, residual, mass, draft, token, child)
            accept = is_child & passed
            reject = is_child & ~passed
            r_residual, r_mass, r_draft = rule.reject(
                residual, mass, draft, token, child
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
            # Which sibling the next child of `current` is: 0 after descending.
            child = jnp.where(accept, 0, child + reject.astype(jnp.int32))
            return (
                current,
                depth,
                child,
                residual,
                mass,
                draft,
                path,
                tokens,
                thresholds,
            )

        init = (
            jnp.int32(-1),
            jnp.int32(0),
            jnp.int32(0),
            target_probs[0].astype(dtype),
            jnp.ones((), dtype),
            draft_row(0),
            jnp.full((nodes,), -1, jnp.int32),
            jnp.full((nodes + 1,), -1, jnp.int32),
            jnp.full((nodes,), jnp.nan, dtype) if record else None,
        )
        _, depth, _, residual, _, _, path, tokens, thresholds = jax.lax.fori_loop(
            0, nodes, step, init
        )
        # A rule's update (zeroing a candidate's entry, a clip to 0) can hide a NaN or an
        # infinity of a row the walk read: with the input checks off, a tree holding one
        # (the checks read every row) ends in a NaN residual, whose draw is -1.
        totals = [jnp.sum(target_probs)]
        if draft_probs is not None:
            totals.append(jnp.sum(draft_probs))
        finite = jnp.isfinite(sum(t.astype(dtype) for t in totals))
        residual = jnp.where(finite, residual, jnp.nan)
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

        def decide(i, residual, mass, draft, token, child):
            return self.node_rule.test(
                residual, mass, draft, token, accept_uniforms[i], child
            )

        depth, path, tokens, residual, _ = self._walk(
            node_tokens, parents, draft_probs, target_probs, decide, record=False
        )
        correction = inverse_cdf(residual, sample_uniform)
        return {
            "num_accepted": depth,
            "tokens": tokens.at[depth].set(correction),
            "path": path,
        }


def _tree_problems(verifier, parents):
    parents = parents.astype(jnp.int32)  # any integer dtype (int64 in 64-bit JAX)
    nodes = parents.shape[1]
    ids = jnp.arange(nodes, dtype=jnp.int32)[None, :]
    used = parents >= -1
    bad = used & (parents >= ids)
    problems = [
        (
            jnp.any(bad, axis=1),
            "`parents` is not in depth-first order in row {row} (the first such row). "
            "Each node's parent index must be below its own: -1 for a child of the "
            "root, an earlier node's index otherwise, below -1 for padding.",
        )
    ]
    limit = verifier.depth_limit(nodes)
    if limit < nodes:
        depth = jax.vmap(lambda p: tree_navigation(p.astype(jnp.int32)).depth)(parents)
        name = type(verifier).__name__
        problems.append(
            (
                jnp.any(depth > limit, axis=1),
                f"`parents` describes a tree deeper than {name} walks ({limit}) in "
                "row {row} (the first such row). Raise its `max_depth` to the trees' "
                "largest depth.",
            )
        )
    return problems


@typing.no_type_check  # validated by hand, with messages naming the argument
def tree_step(
    node_tokens: Integer[Array, "B nodes"],
    parents: Integer[Array, "B nodes"] | None,
    draft_probs: Float[Array, "B nodes+1 V"] | None,
    target_probs: Float[Array, "B nodes+1 V"],
    accept_uniforms: Float[Array, "B nodes"],
    sample_uniforms: Float[Array, " B"],
    *,
    verifier: AbstractTreeVerifier,
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
    entry: str = "tree_accept",
) -> dict[str, Array] | Checked:
    """The step of a tree verifier on probabilities, traced inside
    [`eqx_specdec.verify`][]'s program: arguments as [`eqx_specdec.tree_accept`][]
    has them (`entry` names the entry point in messages). Returns the outputs' dict,
    or a [`Checked`][eqx_specdec._verify.checks.Checked] holding it."""
    node_tokens = jnp.asarray(node_tokens)
    if parents is None:
        tree = tree_of(verifier, f"{entry} with `parents=None`")
        if node_tokens.ndim != 2 or node_tokens.shape[1] != len(tree):
            raise ValueError(
                f"`node_tokens` must have shape (B, N) with N = {len(tree)}, the nodes "
                f"of the verifier's `tree`; got {tuple(node_tokens.shape)}."
            )
        parents = jnp.broadcast_to(jnp.asarray(tree, jnp.int32), node_tokens.shape)
    parents, target_probs, accept_uniforms, sample_uniforms = (
        jnp.asarray(a)
        for a in (parents, target_probs, accept_uniforms, sample_uniforms)
    )
    if draft_probs is not None:
        draft_probs = jnp.asarray(draft_probs)
    arrays = StepArguments(
        node_tokens, draft_probs, target_probs, accept_uniforms, sample_uniforms
    )
    validate_step(arrays, TREE_NAMES, tree=True)  # as a chain's, with a tree's layout
    if parents.shape != node_tokens.shape:
        raise ValueError(
            f"`parents` must have shape (B, N) = {tuple(node_tokens.shape)}, one parent "
            f"per node of `node_tokens`; got {tuple(parents.shape)}."
        )
    nodes, vocab = node_tokens.shape[1], target_probs.shape[-1]
    rule = verifier.drafting_rule()
    if draft_probs is None and rule.uses_draft_probs:
        raise TypeError(
            f"{type(verifier).__name__} (its trees drafted by {type(rule).__name__}) "
            "reads the draft distributions: pass "
            "`draft_probs`, float (B, N + 1, V) (only rules with "
            "`uses_draft_probs = False`, such as DeterministicCandidates, take None)."
        )
    level = check_level(check_inputs)
    logprobs = check_logprobs(logprobs, entry, raw_available=False)
    if allowed is not None:
        mask = allowed_tokens(allowed, target_probs.shape)
        target_probs = masked_probs(target_probs, mask)
        if draft_probs is not None and draft_allowed:
            draft_probs = masked_probs(draft_probs, mask)
    outputs = verifier(
        node_tokens,
        parents,
        draft_probs,
        target_probs,
        accept_uniforms,
        sample_uniforms,
    )
    if logprobs is not None:
        rows = tree_rows(outputs["path"])
        processed = jnp.take_along_axis(target_probs, rows[..., None], axis=1)
        outputs = with_logprobs(outputs, logprobs, processed, log_space=False)
    if level is None:
        return outputs
    # The top-down walk reads every row (each node's context row is selected under a
    # mask), so every level checks every row.
    problems = token_problems(node_tokens, vocab, "node_tokens", valid=parents >= -1)
    if allowed is not None:
        problems = mask_problems(mask, target_probs, log_space=False) + problems
    problems += _tree_problems(verifier, parents)
    if draft_probs is not None:
        problems += distribution_problems("draft_probs", draft_probs)
    problems += distribution_problems("target_probs", target_probs)
    problems += uniform_problems("accept_uniforms", accept_uniforms)
    problems += uniform_problems("sample_uniforms", sample_uniforms)
    n = outputs["num_accepted"]
    problems.append(
        stage_problem(
            verifier,
            "tree verifier",
            malformed_tokens(outputs["tokens"], n, vocab) | (n < 0) | (n > nodes),
            "tokens not laid out as the contract says",
            "its `row` must return the layout of AbstractTreeVerifier.row (for a "
            "TreeVerifier: its node rule's residual must stay a distribution).",
        )
    )
    return checked(outputs, problems)


@typing.no_type_check  # validated by hand, with messages naming the argument
def tree_accept(
    node_tokens: Integer[Array, "B nodes"],
    parents: Integer[Array, "B nodes"] | None,
    draft_probs: Float[Array, "B nodes+1 V"] | None,
    target_probs: Float[Array, "B nodes+1 V"],
    accept_uniforms: Float[Array, "B nodes"],
    sample_uniforms: Float[Array, " B"],
    *,
    verifier: AbstractTreeVerifier = TreeVerifier(),
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
    exact_only: bool = False,
) -> dict[str, Array]:
    """Verifies a batch of draft trees (see [`eqx_specdec.AbstractTreeVerifier`][] for
    the layout).

    **Arguments:**

    - `node_tokens`: integer `(B, N)`, the token at each node.
    - `parents`: integer `(B, N)`, each node's parent (-1: the root; below -1: padding),
        or `None` for the verifier's `tree` in every row.
    - `draft_probs`: float `(B, N + 1, V)`, or `None` for deterministic children.
    - `target_probs`: float `(B, N + 1, V)`.
    - `accept_uniforms`: float `(B, N)`, one uniform per node.
    - `sample_uniforms`: float `(B,)`.
    - `verifier`: the tree verifier to run, an [`eqx_specdec.AbstractTreeVerifier`][]:
        [`eqx_specdec.TreeVerifier`][] (default) or
        [`eqx_specdec.TraversalVerifier`][].
    - `logprobs`: `None`, or an [`eqx_specdec.LogProbs`][]: the log-probabilities of
        the emitted tokens (the accepted path's, then the correction) under the
        target's row each was verified against (the root's for the first, then each
        path node's), as for [`eqx_specdec.speculative_accept`][].
    - `allowed`, `draft_allowed`: each context's allowed tokens, `(B, N + 1, V)`
        booleans or uint32 bits, as for [`eqx_specdec.speculative_accept`][]: row
        $j$ of the target (and of the draft, when it drafted under the mask) is
        restricted to the tokens allowed after context $j$.
    - `check_inputs`: the check level, as for [`eqx_specdec.speculative_accept`][];
        both `"read"` and `"all"` check every row (the walk reads them all),
        plus the depth-first order of `parents`.
    - `exact_only`: `True` to refuse a verifier whose `exact` is False, as for
        [`eqx_specdec.speculative_accept`][].

    **Returns:**

    A dict with `"num_accepted"` int32 `(B,)`, `"tokens"` int32 `(B, N + 1)` and
    `"path"` int32 `(B, N)`: the accepted nodes' indices, for keeping their KV-cache
    entries.

    The tree form of [`eqx_specdec.verify`][]: `verify(Probabilities(target_probs),
    Draft(node_tokens, Probabilities(draft_probs), parents), Uniforms(accept_uniforms,
    sample_uniforms), verifier=verifier, ...).as_dict()`.
    """
    entry = "tree_accept"
    check_level(check_inputs)
    if not isinstance(verifier, AbstractTreeVerifier):
        raise TypeError(
            "`verifier` must be an eqx_specdec.AbstractTreeVerifier (TreeVerifier or "
            f"TraversalVerifier); got {type(verifier).__name__}."
        )
    options = StepOptions(
        logprobs, as_array(allowed), draft_allowed, None, check_inputs, entry
    )
    draft = Draft(
        node_tokens,
        None if draft_probs is None else Probabilities(draft_probs),
        parents,
    )
    randomness = Uniforms(accept_uniforms, sample_uniforms)
    target = Probabilities(target_probs)
    return contract_call(
        entry, verifier, exact_only, target, draft, randomness, options
    )


def _tree_uniforms(randomness, shape: tuple[int, int]):
    if isinstance(randomness, Uniforms):
        return randomness.accept, randomness.sample
    return row_uniforms(randomness, *shape)


@verification_step.register
def _tree_verification_step(
    verifier: AbstractTreeVerifier, target, draft, randomness, options: StepOptions
):
    if not isinstance(target, Probabilities):
        raise TypeError(
            f"{options.entry}: tree verifiers take the target as "
            "eqx_specdec.Probabilities; got Logits. Warp them first: "
            "`Probabilities(jnp.exp(warp(logits)))`."
        )
    if options.history is not None:
        raise ValueError(
            f"{options.entry}: `history` is for the penalties of logits; tree "
            "verifiers take probabilities, already processed."
        )
    accept, sample = _tree_uniforms(randomness, jnp.shape(draft.tokens))
    q = draft.distribution
    return tree_step(
        draft.tokens,
        draft.parents,
        None if q is None else q.probs,
        target.probs,
        accept,
        sample,
        verifier=verifier,
        check_inputs=options.check_inputs,
        logprobs=options.logprobs,
        allowed=options.allowed,
        draft_allowed=options.draft_allowed,
        entry=options.entry,
    )
