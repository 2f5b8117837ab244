"""The contract's conveniences for trees: one verification step of a tree verifier on
probabilities (`tree_accept`) or on logits with their warps (`tree_accept_logits`)."""

import functools
import typing

from jaxtyping import Array, Float, Int, Integer

from .._verify.checks import CheckLevel
from .._verify.entry import check_warp, contract_call, draft_of, step_options
from .._verify.logprobs import LogProbs
from .._verify.typed_inputs import Logits, Probabilities, Uniforms
from .._verify.warp import Warp
from . import step as step  # registers the tree verifiers' step with `verify`
from .abstract_tree_verifier import AbstractTreeVerifier
from .top_down import TreeVerifier


def _check_verifier(verifier):
    if not isinstance(verifier, AbstractTreeVerifier):
        raise TypeError(
            "`verifier` must be an eqx_specdec.AbstractTreeVerifier (TreeVerifier or "
            f"TraversalVerifier); got {type(verifier).__name__}."
        )


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
    _check_verifier(verifier)
    options = step_options(entry, check_inputs, logprobs, allowed, draft_allowed)
    draft = draft_of(node_tokens, draft_probs, Probabilities, parents)
    randomness = Uniforms(accept_uniforms, sample_uniforms)
    target = Probabilities(target_probs)
    return contract_call(
        entry, verifier, exact_only, target, draft, randomness, options
    )


@typing.no_type_check  # validated by hand, with messages naming the argument
def tree_accept_logits(
    node_tokens: Integer[Array, "B nodes"],
    parents: Integer[Array, "B nodes"] | None,
    draft_logits: Float[Array, "B nodes+1 V"] | None,
    target_logits: Float[Array, "B nodes+1 V"],
    accept_uniforms: Float[Array, "B nodes"],
    sample_uniforms: Float[Array, " B"],
    *,
    target_warp: Warp = Warp(),
    draft_warp: Warp = Warp(),
    verifier: AbstractTreeVerifier = TreeVerifier(),
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    history: Int[Array, "B length"] | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
    exact_only: bool = False,
) -> dict[str, Array]:
    """Verifies a batch of draft trees given as logits, with a logit bias, penalties,
    temperature, top-k, top-p and min-p: [`eqx_specdec.tree_accept`][] on the warped
    distributions.

    Each context's row is warped in the same program, the target's by `target_warp`
    and the draft's by `draft_warp` (the law its children were sampled from), with
    [`eqx_specdec.Warp`][]'s exact cut-offs; the tree verifier then walks the warped
    rows. The emitted tokens follow the warped target exactly, provided each node's
    children were drafted from its context's warped draft row. Rows with target
    temperature 0 are greedy (their warped row is one-hot at the argmax).

    **Arguments:**

    - `node_tokens`, `parents`, `accept_uniforms`, `sample_uniforms`, `verifier`,
        `exact_only`: as for [`eqx_specdec.tree_accept`][].
    - `draft_logits`: float `(B, N + 1, V)`, the draft's logits per context (the
        root's, then each node's), or `None` for deterministic children.
    - `target_logits`: float `(B, N + 1, V)`, the target's logits per context.
    - `target_warp`, `draft_warp`: the [`eqx_specdec.Warp`][]s, as for
        [`eqx_specdec.speculative_accept_logits`][] (a warp's per-row parameters are
        `(B,)`).
    - `history`: integer `(B, H)`, each row's tokens that the warps' penalties count,
        -1 for padding; required when a warp has a penalty. A context's history is
        this and the tokens of the nodes on the path from the root to it: each
        context is penalised as its own prefix says.
    - `allowed`, `draft_allowed`: each context's allowed tokens, as for
        [`eqx_specdec.tree_accept`][]: the disallowed logits become $-\\infty$ before
        the warps.
    - `check_inputs`: the check level, as for [`eqx_specdec.tree_accept`][] (every
        row is checked), with the logits' and warps' checks of
        [`eqx_specdec.speculative_accept_logits`][].
    - `logprobs`: `None`, or an [`eqx_specdec.LogProbs`][]: the log-probabilities of
        the emitted tokens under the warped target row each was verified against (and,
        with `raw=True`, under `log_softmax` of that row's logits).

    **Returns:**

    As [`eqx_specdec.tree_accept`][].

    The tree form of [`eqx_specdec.verify`][] on logits: `verify(Logits(target_logits,
    target_warp), Draft(node_tokens, Logits(draft_logits, draft_warp), parents),
    Uniforms(accept_uniforms, sample_uniforms), verifier=verifier, ...).as_dict()`.
    """
    entry = "tree_accept_logits"
    _check_verifier(verifier)
    check_warp("target_warp", target_warp)
    check_warp("draft_warp", draft_warp)
    options = step_options(
        entry, check_inputs, logprobs, allowed, draft_allowed, history
    )
    draft = draft_of(
        node_tokens, draft_logits, functools.partial(Logits, warp=draft_warp), parents
    )
    randomness = Uniforms(accept_uniforms, sample_uniforms)
    target = Logits(target_logits, target_warp)
    return contract_call(
        entry, verifier, exact_only, target, draft, randomness, options
    )
