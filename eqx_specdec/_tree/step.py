"""The verification step of a tree verifier, on probabilities or on logits with their
warps, with its run-time checks; registered with `verify` for every tree verifier."""

import typing

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Integer

from .._chain.abstract_verifier import malformed_tokens
from .._chain.inputs import (
    StepArguments,
    TREE_LOGIT_NAMES,
    TREE_NAMES,
    validate_step,
)
from .._chain.logits import checked_history, history_counts, warp_problems
from .._entry.entry import StepOptions, verification_step
from .._inputs.checks import (
    check_level,
    CheckLevel,
    distribution_problems,
    logit_problems,
    stage_problem,
    token_problems,
    uniform_problems,
)
from .._inputs.logprobs import check_logprobs, LogProbs, tree_rows, with_logprobs
from .._inputs.masks import allowed_tokens, mask_problems, masked_logits, masked_probs
from .._inputs.results import Problem, RESULTS
from .._inputs.typed_inputs import Logits, Uniforms
from .._warps.warp import Warp
from .abstract_tree_verifier import AbstractTreeVerifier, tree_navigation, tree_of


def path_counts(
    history: Int[Array, "B length"],
    node_tokens: Int[Array, "B nodes"],
    parents: Int[Array, "B nodes"],
    vocab: int,
) -> Int[Array, "B nodes_plus_1 V"]:
    """Each token's count in the history of each context of a tree: the row's `history`
    (-1 pads) and, for context $j + 1$ (after node $j$), the tokens of the nodes on the
    path from the root down to $j$, node $j$ included (context 0, the root's, counts the
    history alone). A padding node counts as a child of the root."""
    batch, nodes = node_tokens.shape
    ids = jnp.arange(nodes, dtype=jnp.int32)

    def descend(on_path, j):
        # Depth-first order: node j's parent is an earlier node, whose path is known.
        parent = parents[:, j]
        above = jnp.take_along_axis(
            on_path, jnp.maximum(parent + 1, 0)[:, None, None], axis=1
        )[:, 0]
        row = (above & (parent >= 0)[:, None]) | (ids == j)[None]
        return on_path.at[:, j + 1].set(row), None

    # on_path[b, c, j]: node j lies on the path to context c.
    on_path = jnp.zeros((batch, nodes + 1, nodes), bool)
    on_path, _ = jax.lax.scan(descend, on_path, ids)
    # One scatter of (B, N + 1, N) updates: each node's token, counted in every context
    # below it (token ids outside [0, V) are dropped; the checks report them).
    rows = jnp.arange(batch)[:, None, None]
    contexts = jnp.arange(nodes + 1)[None, :, None]
    tokens = jnp.broadcast_to(node_tokens[:, None, :], on_path.shape)
    tokens = jnp.where((tokens >= 0) & on_path, tokens, vocab)
    counts = jnp.zeros((batch, nodes + 1, vocab), jnp.int32)
    counts = counts.at[rows, contexts, tokens].add(1, mode="drop")
    return counts + history_counts(history, vocab)[:, None]


def _tree_problems(verifier, parents):
    parents = parents.astype(jnp.int32)  # any integer dtype (int64 in 64-bit JAX)
    nodes = parents.shape[1]
    ids = jnp.arange(nodes, dtype=jnp.int32)[None, :]
    used = parents >= -1
    bad = used & (parents >= ids)
    problems = [
        Problem(
            jnp.any(bad, axis=1),
            RESULTS.invalid_tree,
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
            Problem(
                jnp.any(depth > limit, axis=1),
                RESULTS.invalid_tree,
                f"`parents` describes a tree deeper than {name} walks ({limit}) in "
                "row {row} (the first such row). Raise its `max_depth` to the trees' "
                "largest depth.",
            )
        )
    return problems


def _processed(
    target: Float[Array, "B rows V"],
    draft: Float[Array, "B rows V"] | None,
    mask: Bool[Array, "B rows V"] | None,
    draft_allowed: bool,
    warps: tuple[Warp, Warp] | None,
    counts: Int[Array, "B rows V"] | None,
):
    """The target's and the draft's rows as the verifier takes them (probabilities),
    restricted to the allowed tokens and, on logits, warped; and the target's rows the
    log-probabilities read (probabilities, or log-probabilities on logits)."""
    if warps is None:
        if mask is not None:
            target = masked_probs(target, mask)
            if draft is not None and draft_allowed:
                draft = masked_probs(draft, mask)
        return target, draft, target
    if mask is not None:
        target = masked_logits(target, mask)
        if draft is not None and draft_allowed:
            draft = masked_logits(draft, mask)
    target_warp, draft_warp = warps
    target_log_probs = target_warp(target, counts)
    if draft is not None:
        draft = jnp.exp(draft_warp(draft, counts))
    return jnp.exp(target_log_probs), draft, target_log_probs


@typing.no_type_check  # validated by hand, with messages naming the argument
def tree_step(
    node_tokens: Integer[Array, "B nodes"],
    parents: Integer[Array, "B nodes"] | None,
    draft: Float[Array, "B nodes+1 V"] | None,
    target: Float[Array, "B nodes+1 V"],
    accept_uniforms: Float[Array, "B nodes"],
    sample_uniforms: Float[Array, " B"],
    *,
    verifier: AbstractTreeVerifier,
    warps: tuple[Warp, Warp] | None = None,
    history: Int[Array, "B length"] | None = None,
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
) -> tuple[dict[str, Array], list[Problem]]:
    """The step of a tree verifier, traced inside [`eqx_specdec.verify`][]'s program,
    on probabilities (`warps=None`) or on logits with the target's and the draft's warps
    `(target_warp, draft_warp)`. Returns the outputs' dict and the run-time checks'
    problems (none with checks off)."""
    entry = "verify"
    on_logits = warps is not None
    names = TREE_LOGIT_NAMES if on_logits else TREE_NAMES
    node_tokens = jnp.asarray(node_tokens)
    if parents is None:
        tree = tree_of(verifier, f"{entry} with `parents=None`")
        if node_tokens.ndim != 2 or node_tokens.shape[1] != len(tree):
            raise ValueError(
                f"`node_tokens` must have shape (B, N) with N = {len(tree)}, the nodes "
                f"of the verifier's `tree`; got {tuple(node_tokens.shape)}."
            )
        parents = jnp.broadcast_to(jnp.asarray(tree, jnp.int32), node_tokens.shape)
    parents, target, accept_uniforms, sample_uniforms = (
        jnp.asarray(a) for a in (parents, target, accept_uniforms, sample_uniforms)
    )
    if draft is not None:
        draft = jnp.asarray(draft)
    arrays = StepArguments(node_tokens, draft, target, accept_uniforms, sample_uniforms)
    validate_step(arrays, names, tree=True)  # as a chain's, with a tree's layout
    if parents.shape != node_tokens.shape:
        raise ValueError(
            f"`parents` must have shape (B, N) = {tuple(node_tokens.shape)}, one parent "
            f"per node of `node_tokens`; got {tuple(parents.shape)}."
        )
    nodes, vocab = node_tokens.shape[1], target.shape[-1]
    rule = verifier.drafting_rule()
    if draft is None and rule.uses_draft_probs:
        raise TypeError(
            f"{type(verifier).__name__} (its trees drafted by {type(rule).__name__}) "
            f"reads the draft distributions: pass `{names.draft}`, float (B, N + 1, V) "
            "(only rules with `uses_draft_probs = False`, such as "
            "DeterministicCandidates, take None)."
        )
    level = check_level(check_inputs)
    logprobs = check_logprobs(logprobs, entry, raw_available=on_logits)
    counts = None
    if on_logits and any(warp.needs_history() for warp in warps):
        history = checked_history(history, node_tokens.shape[0], entry)
        counts = path_counts(history, node_tokens, parents.astype(jnp.int32), vocab)
    mask = None if allowed is None else allowed_tokens(allowed, target.shape)
    target_probs, draft_probs, processed = _processed(
        target, draft, mask, draft_allowed, warps, counts
    )
    outputs = verifier(
        node_tokens,
        parents,
        draft_probs,
        target_probs,
        accept_uniforms,
        sample_uniforms,
    )
    if logprobs is not None:
        rows = tree_rows(outputs["path"])[..., None]
        outputs = with_logprobs(
            outputs,
            logprobs,
            jnp.take_along_axis(processed, rows, axis=1),
            log_space=on_logits,
            raw_logits=jnp.take_along_axis(target, rows, axis=1),
        )
    if level is None:
        return outputs, []
    # The top-down walk reads every row (each node's context row is selected under a
    # mask), so every level checks every row.
    problems = token_problems(
        node_tokens, vocab, names.draft_tokens, valid=parents >= -1
    )
    if mask is not None:
        problems = mask_problems(mask, processed, log_space=on_logits) + problems
    problems += _tree_problems(verifier, parents)
    for name, array, warp in (
        (names.draft, draft, None if warps is None else warps[1]),
        (names.target, target, None if warps is None else warps[0]),
    ):
        if array is None:
            continue
        if on_logits:
            problems += logit_problems(name, array)
            warp_name = "draft_warp" if name == names.draft else "target_warp"
            problems += warp_problems(warp_name, warp, array)
        else:
            problems += distribution_problems(name, array)
    problems += uniform_problems(names.accept, accept_uniforms)
    problems += uniform_problems(names.sample, sample_uniforms)
    if counts is not None:
        problems += token_problems(
            history, vocab, "history", valid=jnp.asarray(history) >= 0
        )
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
    return outputs, problems


def _tree_uniforms(randomness, shape: tuple[int, int]):
    if not isinstance(randomness, Uniforms):
        randomness = Uniforms.from_key(randomness, *shape)
    return randomness.accept, randomness.sample


@verification_step.register
def _tree_verification_step(
    verifier: AbstractTreeVerifier, target, draft, randomness, options: StepOptions
):
    on_logits = isinstance(target, Logits)
    accept, sample = _tree_uniforms(randomness, jnp.shape(draft.tokens))
    q = draft.distribution
    if on_logits:
        distributions = (None if q is None else q.logits, target.logits)
        warps = (target.warp, Warp() if q is None else q.warp)
    else:
        distributions = (None if q is None else q.probs, target.probs)
        warps = None
    return tree_step(
        draft.tokens,
        draft.parents,
        *distributions,
        accept,
        sample,
        verifier=verifier,
        warps=warps,
        history=options.history,
        check_inputs=options.check_inputs,
        logprobs=options.logprobs,
        allowed=options.allowed,
        draft_allowed=options.draft_allowed,
    )
