"""Differentiable acceptance objectives: the probability that each draft position is
accepted, and the expected accepted length, as smooth functions of the draft and target
distributions (DistillSpec's objective, block verification's given the drafts)."""

import typing

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._capabilities import require
from .._chain.verifier import Verifier
from .._custom_types import DraftProbs, DraftTokens, TargetProbs
from .._inputs.typed_inputs import Logits, Probabilities
from .._misc import compute_dtype
from .._stages.row_fields import per_row_values, with_row_values
from .._warps.warp import Warp
from .validation import check_distributions


def _check_arguments(
    entry_point, verifier, draft_probs, target_probs, draft_tokens, names
):
    draft_name, target_name = names
    if getattr(verifier, "draft_shape", None) != "chain":
        raise TypeError(
            f"{entry_point}: `verifier` must verify chains (an eqx_specdec.Verifier: its "
            "ratio test and prefix counter define the objective); got "
            f"{type(verifier).__name__}."
        )
    feature = f"the acceptance objectives ({entry_point})"
    if draft_tokens is None:
        require(verifier.ratio_test, "pass_probabilities", feature)
    require(verifier.prefix_counter, "reach_probabilities", feature)
    if target_probs.ndim != 3:
        raise ValueError(
            f"{entry_point}: `{target_name}` must have shape (B, G+1, V); got "
            f"{tuple(target_probs.shape)}."
        )
    batch, rows, vocab = target_probs.shape
    expected = (batch, rows - 1, vocab)
    if draft_probs is None:
        if draft_tokens is None:
            raise ValueError(
                f"{entry_point}: one-hot drafts (`{draft_name}=None`) need "
                "`draft_tokens`: without the distributions q there is nothing to average "
                "the draft tokens over."
            )
    elif tuple(draft_probs.shape) != expected:
        raise ValueError(
            f"{entry_point}: `{draft_name}` must have shape (B, G, V) = {expected}, one "
            f"row fewer than `{target_name}` {tuple(target_probs.shape)}; got "
            f"{tuple(draft_probs.shape)}."
        )
    for name, array in ((draft_name, draft_probs), (target_name, target_probs)):
        if array is not None and not jnp.issubdtype(array.dtype, jnp.floating):
            raise TypeError(
                f"{entry_point}: `{name}` must be floating; got {array.dtype}."
            )
    if draft_tokens is not None:
        if tuple(draft_tokens.shape) != expected[:2]:
            raise ValueError(
                f"{entry_point}: `draft_tokens` must have shape (B, G) = {expected[:2]}; "
                f"got {tuple(draft_tokens.shape)}."
            )
        if not jnp.issubdtype(draft_tokens.dtype, jnp.integer):
            raise TypeError(
                f"{entry_point}: `draft_tokens` must be integer; got "
                f"{draft_tokens.dtype}."
            )


def _row_pass_probabilities(ratio_test, draft_probs, target_probs):
    """Per position, the probability that the test passes the draft token, averaged over
    the token's law $q_i$: $\\beta_i = \\sum_v q_i(v)\\, a_i(v)$."""
    if ratio_test.theory != "exact":
        raise ValueError(
            f"{type(ratio_test).__name__}'s `pass_probabilities` are a "
            f"{ratio_test.theory!r}: its "
            "passes depend on the other draft tokens, so the objective averaged over "
            "the draft tokens has no closed form. Pass `draft_tokens` (drafts sampled "
            "from `draft_probs`) for the objective given the drafts, an unbiased "
            "estimate of it."
        )
    probs = ratio_test.pass_probabilities(draft_probs, target_probs[:-1])
    return jnp.sum(draft_probs * probs, axis=-1)


@typing.no_type_check  # validated by hand, with messages naming the argument
def acceptance_by_position(
    draft_probs: DraftProbs | Probabilities | Logits | None,
    target_probs: TargetProbs | Probabilities | Logits,
    *,
    verifier: Verifier = Verifier(),
    draft_tokens: DraftTokens | None = None,
) -> Float[Array, "B G"]:
    """The probability that at least $k$ draft tokens are accepted, $P(n \\ge k)$ for
    $k = 1, \\dots, G$, as a differentiable function of the distributions.

    Without `draft_tokens`, the expectation is over the draft tokens ($x_i \\sim q_i$)
    and the uniforms, with each position's rows fixed (the rows along the drafted, or a
    teacher-forced, prefix). For the standard rule this is DistillSpec's objective,
    $P(n \\ge k) = \\prod_{i < k} \\beta_i$ with $\\beta_i = \\sum_v \\min(p_i(v), q_i(v))$;
    for any ratio test whose `pass_probabilities` are exact,
    $\\beta_i = \\sum_v q_i(v)\\, a_i(v)$, combined by the prefix counter's
    `reach_probabilities`. It equals the library's exact quadrature
    ([`eqx_specdec.evaluation.evaluate_verifier`][]`.reached`).

    With `draft_tokens`, the expectation is over the uniforms given the drafts: the
    ratio test's `pass_probabilities_given_drafts` combined by the counter. This is how
    block verification's objective is computed (its passes depend on every draft token,
    and its expectation over the drafts has no closed form): the mean over drafts
    sampled from $q$ is an unbiased estimate of the objective. Its gradient is the
    gradient at fixed tokens; for the gradient in $q$ of the expectation over the drafts,
    add the score term, `jax.lax.stop_gradient(objective) * log q(x)`.

    Gradients flow into the distributions (logits, a warp's temperature) and the array
    fields of the verifier's stages (a lenience, say). The verification step itself
    ([`eqx_specdec.speculative_accept`][]) has no useful gradient: its outputs are
    integers, piecewise constant in every input.

    **Arguments:**

    - `draft_probs`: the draft distributions $q_i$, `(B, G, V)`: an array of
        probabilities, or typed as for [`eqx_specdec.verify`][]: an
        [`eqx_specdec.Probabilities`][], or [`eqx_specdec.Logits`][] with the
        [`eqx_specdec.Warp`][] the draft samples with (warped differentiably: a
        temperature's gradient included; top-k, top-p and min-p masks are piecewise
        constant). `None` for one-hot drafts (with `draft_tokens`).
    - `target_probs`: the target distributions $p_i$, `(B, G + 1, V)`, in the same
        forms (logits when the draft's are; the last row is not read).
    - `verifier`: the [`eqx_specdec.Verifier`][] whose ratio test and prefix counter
        define the rule. Default: the standard rule.
    - `draft_tokens`: integer of shape `(B, G)`, or `None` (the default: average over
        the draft tokens).

    **Returns:**

    Float of shape `(B, G)` (float32, or float64 for float64 inputs).

    **Raises:**

    - `ValueError`: a shape is wrong, or the rule's passes depend on the other draft
        tokens and `draft_tokens` is `None`.
    - `TypeError`: `verifier` is not a `Verifier`, or a dtype is wrong.
    - [`eqx_specdec.MissingCapabilityError`][]: a stage lacks the capability the
        objective needs.
    """
    return _reached_of(
        "acceptance_by_position", draft_probs, target_probs, verifier, draft_tokens
    )


def _reached_of(name, draft, target, verifier, draft_tokens):
    """The objective's reach probabilities, from the inputs as their types say: arrays
    and [`eqx_specdec.Probabilities`][] are probabilities, [`eqx_specdec.Logits`][] are
    warped first."""
    if isinstance(target, Logits) or isinstance(draft, Logits):
        if not isinstance(target, Logits) or not isinstance(
            draft, (Logits, type(None))
        ):
            raise TypeError(
                f"{name}: give the draft and the target in one form: both as "
                "eqx_specdec.Logits (the draft may be None), or both as probabilities; "
                f"got {type(draft).__name__} and {type(target).__name__}."
            )
        return _reached_from_logits(
            name,
            None if draft is None else draft.logits,
            target.logits,
            target.warp,
            Warp() if draft is None else draft.warp,
            verifier,
            draft_tokens,
        )
    if isinstance(draft, Probabilities):
        draft = draft.probs
    if isinstance(target, Probabilities):
        target = target.probs
    return _reached_from_probs(name, draft, target, verifier, draft_tokens)


def _reached_from_probs(name, draft_probs, target_probs, verifier, draft_tokens):
    """The probabilities entry points: the distributions validated eagerly (a fix that
    names the entry point's logits twin), then `_reached`."""
    check_distributions(
        name,
        other_fix=", or pass logits as eqx_specdec.Logits(logits, warp)",
        draft_probs=draft_probs,
        target_probs=target_probs,
    )
    return _reached(name, draft_probs, target_probs, verifier, draft_tokens)


def _reached_from_logits(
    name, draft_logits, target_logits, target_warp, draft_warp, verifier, draft_tokens
):
    for warp_name, warp in (("target_warp", target_warp), ("draft_warp", draft_warp)):
        if not isinstance(warp, Warp):
            raise TypeError(
                f"{name}: `{warp_name}` must be an eqx_specdec.Warp; got "
                f"{type(warp).__name__}."
            )
    for arg, array in (
        ("draft_logits", draft_logits),
        ("target_logits", target_logits),
    ):
        if array is not None and jnp.ndim(array) != 3:
            raise ValueError(
                f"{name}: `{arg}` must have shape (B, rows, V); got {jnp.shape(array)}."
            )
    return _warped_reached(
        name,
        draft_logits,
        target_logits,
        target_warp,
        draft_warp,
        verifier,
        draft_tokens,
    )


@eqx.filter_jit
def _warped_reached(
    name, draft_logits, target_logits, target_warp, draft_warp, verifier, draft_tokens
):
    def probs(warp, logits):
        return None if logits is None else jnp.exp(warp(jnp.asarray(logits)))

    q, p = probs(draft_warp, draft_logits), probs(target_warp, target_logits)
    return _reached(name, q, p, verifier, draft_tokens, _LOGITS)


_PROBS = ("draft_probs", "target_probs")
_LOGITS = ("draft_logits", "target_logits")


@eqx.filter_jit
def _reached(name, draft_probs, target_probs, verifier, draft_tokens, names=_PROBS):
    _check_arguments(name, verifier, draft_probs, target_probs, draft_tokens, names)
    arrays = [a for a in (draft_probs, target_probs) if a is not None]
    dtype = compute_dtype(*(a.dtype for a in arrays))

    def as_dtype(x):
        return None if x is None else x.astype(dtype)

    q, p = as_dtype(draft_probs), as_dtype(target_probs)
    ratio_test, counter = verifier.ratio_test, verifier.prefix_counter

    # Each row's test holds that row's per-row field values (a mask per row, say).
    def row_passes(values, x_row, q_row, p_row):
        test = with_row_values(ratio_test, values)
        if x_row is None:
            return _row_pass_probabilities(test, q_row, p_row)
        return test.pass_probabilities_given_drafts(x_row, q_row, p_row)

    values = per_row_values(ratio_test)
    passes = jax.vmap(row_passes)(values, draft_tokens, q, p)
    return jax.vmap(counter.reach_probabilities)(passes.astype(dtype))


@typing.no_type_check  # validated by hand, with messages naming the argument
def expected_accepted_length(
    draft_probs: DraftProbs | Probabilities | Logits | None,
    target_probs: TargetProbs | Probabilities | Logits,
    *,
    verifier: Verifier = Verifier(),
    draft_tokens: DraftTokens | None = None,
) -> Float[Array, " B"]:
    """The expected number of accepted draft tokens, $E[n] = \\sum_{k=1}^{G} P(n \\ge k)$,
    as a differentiable function of the distributions: the sum over positions of
    [`eqx_specdec.evaluation.acceptance_by_position`][], which says what is averaged and how.

    For the standard rule, $E[n] = \\sum_{k=1}^{G} \\prod_{i < k} \\beta_i$ with
    $\\beta_i = \\sum_v \\min(p_i(v), q_i(v))$. The tokens per target call are $1 + E[n]$.

    **Arguments:**

    As for [`eqx_specdec.evaluation.acceptance_by_position`][].

    **Returns:**

    Float of shape `(B,)`.
    """
    reached = _reached_of(
        "expected_accepted_length", draft_probs, target_probs, verifier, draft_tokens
    )
    return jnp.sum(reached, axis=-1)
