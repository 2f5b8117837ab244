"""The verification step on logits: both sides warped to log-probabilities, verified in
log space."""

import typing

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._custom_types import AcceptUniforms, DraftTokens, SampleRandomnessBatch
from .._exactness import refuse_inexact
from .._misc import compute_dtype
from .._stages.prefix_counter import PrefixCounter
from .._stages.ratio_test import RatioTest
from .._stages.residual_sampler import ResidualSampler
from .._stages.token_assembler import TokenAssembler
from .abstract_verifier import AbstractVerifier
from .checks import check_level, checked, CheckLevel, token_problems
from .dispatch import entry_point
from .inputs import LOGIT_NAMES, prepare_inputs
from .logprobs import check_logprobs, LogProbs, with_logprobs
from .masks import allowed_tokens, mask_problems, masked_logits
from .verifier import Verifier
from .warp import Warp


def _warp_problems(name, warp: Warp, logits):
    def problem(bad, what, fix):
        return (bad, f"`{name}.{what} in row {{row}} (the first such row). {fix}")

    batch = logits.shape[0]
    temperature = jnp.broadcast_to(jnp.asarray(warp.temperature), (batch,))
    bad = ~(temperature >= 0) | ~jnp.isfinite(temperature)
    problems = [
        problem(
            bad,
            "temperature` is negative or not finite",
            "Use a temperature >= 0 (0 for greedy rows).",
        )
    ]
    if warp.top_p is not None:
        top_p = jnp.broadcast_to(jnp.asarray(warp.top_p), (batch,))
        problems.append(
            problem(
                ~((top_p > 0) & (top_p <= 1)),
                "top_p` is outside (0, 1]",
                "Use a top_p in (0, 1] (1 keeps every token).",
            )
        )
    if warp.top_k is not None:
        top_k = jnp.broadcast_to(jnp.asarray(warp.top_k), (batch,))
        problems.append(
            problem(
                top_k < 0,
                "top_k` is negative",
                "Use a top_k >= 0 (0 keeps every token).",
            )
        )
    if warp.min_p is not None:
        min_p = jnp.broadcast_to(jnp.asarray(warp.min_p), (batch,))
        problems.append(
            problem(
                ~((min_p >= 0) & (min_p <= 1)),
                "min_p` is outside [0, 1]",
                "Use a min_p in [0, 1] (0 keeps every token).",
            )
        )
    if warp.logit_bias is not None:
        bias = jnp.asarray(warp.logit_bias)
        bad = jnp.isnan(bias) | (bias == jnp.inf)
        bad = jnp.broadcast_to(jnp.any(bad, axis=-1), (batch,))
        problems.append(
            problem(
                bad,
                "logit_bias` holds a NaN or +inf",
                "Use finite biases, or -inf to ban a token.",
            )
        )
        biased = logits.astype(compute_dtype(logits.dtype)) + warp._bias(logits)
        banned = jnp.any(jnp.max(biased, axis=-1) == -jnp.inf, axis=-1)
        problems.append(
            problem(
                banned & ~bad,
                "logit_bias` bans every token of a distribution (with the logits' own "
                "-inf)",
                "Leave at least one token of each distribution unbanned.",
            )
        )
    return problems


def token_counts(
    history: Int[Array, "B length"],
    draft_tokens: Int[Array, "B G"],
    vocab: int,
) -> Int[Array, "B G_plus_1 V"]:
    """Each token's count in the history of each position of a step: the row's
    `history` (-1 pads) and, at draft position $i$, the draft tokens before $i$."""
    batch = history.shape[0]
    rows = jnp.arange(batch)[:, None]
    ids = jnp.where(history >= 0, history, vocab)  # padding: dropped
    base = jnp.zeros((batch, vocab), jnp.int32).at[rows, ids].add(1, mode="drop")
    drafted = jax.nn.one_hot(draft_tokens, vocab, dtype=jnp.int32)
    before = jnp.concatenate(
        [jnp.zeros_like(drafted[:, :1]), jnp.cumsum(drafted, axis=1, dtype=jnp.int32)],
        axis=1,
    )
    return base[:, None] + before


LOGITS_VERIFIER = Verifier(
    RatioTest(log_space=True),
    PrefixCounter(),
    ResidualSampler(log_space=True),
    TokenAssembler(),
)


@entry_point
@typing.no_type_check  # validated by hand, with messages naming the argument
def speculative_accept_logits(
    draft_tokens: DraftTokens,
    draft_logits: Float[Array, "B G V"] | None,
    target_logits: Float[Array, "B G+1 V"],
    accept_uniforms: AcceptUniforms | None,
    sample_uniforms: SampleRandomnessBatch | None,
    *,
    target_warp: Warp = Warp(),
    draft_warp: Warp = Warp(),
    verifier: AbstractVerifier = LOGITS_VERIFIER,
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    history: Int[Array, "B length"] | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
    exact_only: bool = False,
) -> dict[str, Array]:
    """Runs one verification step on logits, with a logit bias, temperature, top-k, top-p
    and min-p.

    Both sides are warped to log-probabilities, $\\log \\tilde p = $ `target_warp`(target
    logits) and $\\log \\tilde q = $ `draft_warp`(draft logits), and verified in log space:
    draft token $x_i$ passes when $\\log u_i < \\log \\tilde p_i(x_i) - \\log \\tilde q_i(x_i)$
    (stable: logits of $10^4$ do not overflow, and tiny probabilities do not underflow to
    a wrong verdict); the correction is drawn from
    $\\operatorname{norm}((\\tilde p_n - \\tilde q_n)_+)$, the bonus token from $\\tilde p_G$.
    The emitted tokens follow the warped target $\\tilde p$ exactly, provided the draft
    tokens were sampled from $\\tilde q$.

    Rows with target temperature 0 are greedy: their $\\tilde p$ is one-hot at the argmax,
    so a draft token passes exactly when it is the target's argmax, and the correction is
    the argmax. Greedy and sampled rows mix freely in one batch.

    **Arguments:**

    - `draft_tokens`: integer of shape `(B, G)`.
    - `draft_logits`: float of shape `(B, G, V)`, the draft's logits; `None` for one-hot
        drafts.
    - `target_logits`: float of shape `(B, G + 1, V)`.
    - `accept_uniforms`, `sample_uniforms`: as for [`eqx_specdec.speculative_accept`][].
    - `target_warp`: the [`eqx_specdec.Warp`][] defining the distribution to sample from.
    - `draft_warp`: the [`eqx_specdec.Warp`][] the draft tokens were sampled with.
    - `verifier`: a [`eqx_specdec.Verifier`][] whose stages read log-probabilities.
        Default: the standard rule in log space.
    - `check_inputs`: the check level, as for [`eqx_specdec.speculative_accept`][]; both
        `"read"` and `"all"` check every logit (the warp reads them all): no
        NaN or $+\\infty$ logit, no distribution with every logit $-\\infty$, token ids
        and uniforms in range, temperatures $\\ge 0$, `top_p` in $(0, 1]$, `top_k`
        $\\ge 0$, `min_p` in $[0, 1]$, no NaN or $+\\infty$ logit bias and none that bans
        every token of a distribution.
    - `history`: integer of shape `(B, H)`, each row's tokens that the warps'
        penalties count (the generated tokens, and the prompt's if your convention
        counts them), -1 for padding; required when a warp has a penalty. At draft
        position $i$ the history is this and the draft tokens before $i$: the target
        and the draft are penalised as each position's true prefix says.
    - `allowed`, `draft_allowed`: each position's allowed tokens, as for
        [`eqx_specdec.speculative_accept`][]: the disallowed logits become $-\\infty$
        before the warps (of the target, and of the draft when it sampled under the
        mask).
    - `exact_only`: as for [`eqx_specdec.speculative_accept`][].
    - `logprobs`: `None` (the default), or an [`eqx_specdec.LogProbs`][]: the
        log-probabilities of the emitted tokens under the warped target $\\tilde p$
        (and, with `raw=True`, under `log_softmax(target_logits)`).

    **Returns:**

    As [`eqx_specdec.speculative_accept`][].
    """
    level = check_level(check_inputs)
    refuse_inexact("speculative_accept_logits", verifier, exact_only)
    logprobs = check_logprobs(logprobs, "speculative_accept_logits", raw_available=True)
    inputs = prepare_inputs(
        "speculative_accept_logits",
        verifier,
        (draft_tokens, draft_logits, target_logits, accept_uniforms, sample_uniforms),
        log_space=True,
        names=LOGIT_NAMES,
    )
    draft_tokens, draft_logits, target_logits, accept, sample = inputs.arrays()
    raw_target_logits = target_logits  # for the raw log-probabilities: before any mask
    if allowed is not None:
        mask = allowed_tokens(allowed, target_logits.shape)
        target_logits = masked_logits(target_logits, mask)
        if draft_logits is not None and draft_allowed:
            draft_logits = masked_logits(draft_logits, mask[:, :-1])
    counts = None
    if target_warp.needs_history() or draft_warp.needs_history():
        counts = token_counts(
            _checked_history(history, draft_tokens.shape[0]),
            draft_tokens,
            target_logits.shape[-1],
        )
    target_log_probs = target_warp(target_logits, counts)
    draft_log_probs = None
    if draft_logits is not None:
        draft_counts = None if counts is None else counts[:, :-1]
        draft_log_probs = draft_warp(draft_logits, draft_counts)
    arrays = (draft_tokens, draft_log_probs, target_log_probs, accept, sample)

    def with_requested(outputs):
        return with_logprobs(
            outputs,
            logprobs,
            target_log_probs,
            log_space=True,
            raw_logits=raw_target_logits,
        )

    if level is None:
        return with_requested(verifier(*arrays))
    outputs, report = verifier.checked_call(*arrays, values=False)
    outputs = with_requested(outputs)
    problems = inputs.problems(verifier, outputs, report)
    problems += _warp_problems("target_warp", target_warp, target_logits)
    if draft_logits is not None:
        problems += _warp_problems("draft_warp", draft_warp, draft_logits)
    if allowed is not None:
        problems = mask_problems(mask, target_log_probs, log_space=True) + problems
    if counts is not None:
        vocab = target_logits.shape[-1]
        problems += token_problems(
            history, vocab, "history", valid=jnp.asarray(history) >= 0
        )
    return checked(outputs, problems)


def _checked_history(history, batch: int):
    if history is None:
        raise ValueError(
            "A warp has a history-dependent penalty, so speculative_accept_logits "
            "needs `history`: integer (B, H), each row's tokens the penalties count, "
            "-1 for padding."
        )
    history = jnp.asarray(history)
    if history.ndim != 2 or history.shape[0] != batch:
        raise ValueError(
            f"`history` must have shape (B, H) with B = {batch}; got {history.shape}."
        )
    if not jnp.issubdtype(history.dtype, jnp.integer):
        raise TypeError(f"`history` must be integer token ids, got {history.dtype}.")
    return history.astype(jnp.int32)
