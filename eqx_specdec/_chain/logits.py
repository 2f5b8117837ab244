"""The verification step on logits: both sides warped to log-probabilities, verified in
log space."""

import typing

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._custom_types import AcceptUniforms, DraftTokens, SampleRandomnessBatch
from .._inputs.checks import check_level, CheckLevel, token_problems
from .._inputs.logprobs import check_logprobs, LogProbs, with_logprobs
from .._inputs.masks import allowed_tokens, mask_problems, masked_logits
from .._inputs.results import Problem, RESULTS
from .._misc import compute_dtype
from .._warps.warp import Warp
from .abstract_verifier import AbstractVerifier
from .inputs import LOGIT_NAMES, prepare_inputs
from .verifier import Verifier


def warp_problems(name, warp: Warp, logits):
    """The run-time problems of a warp's parameters for `logits` `(B, ..., V)`, per row
    `(B,)`, naming the warp's argument `name`."""

    def problem(bad, what, fix):
        message = f"`{name}.{what} in row {{row}} (the first such row). {fix}"
        return Problem(bad, RESULTS.invalid_warp, message)

    batch = logits.shape[0]
    # Each scalar parameter: when it is invalid, what the message says, and the fix.
    table = (
        ("temperature", lambda t: ~(t >= 0) | ~jnp.isfinite(t),
         "is negative or not finite", "Use a temperature >= 0 (0 for greedy rows)."),
        ("top_p", lambda v: ~((v > 0) & (v <= 1)),
         "is outside (0, 1]", "Use a top_p in (0, 1] (1 keeps every token)."),
        ("top_k", lambda v: v < 0,
         "is negative", "Use a top_k >= 0 (0 keeps every token)."),
        ("min_p", lambda v: ~((v >= 0) & (v <= 1)),
         "is outside [0, 1]", "Use a min_p in [0, 1] (0 keeps every token)."),
    )  # fmt: skip
    problems = []
    for field, invalid, what, fix in table:
        value = getattr(warp, field)
        if value is not None:
            value = jnp.broadcast_to(jnp.asarray(value), (batch,))
            problems.append(problem(invalid(value), f"{field}` {what}", fix))
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


def history_counts(history: Int[Array, "B length"], vocab: int) -> Int[Array, "B V"]:
    """Each token's count in each row's `history` (-1 pads)."""
    rows = jnp.arange(history.shape[0])[:, None]
    ids = jnp.where(history >= 0, history, vocab)  # padding: dropped
    return (
        jnp.zeros((history.shape[0], vocab), jnp.int32)
        .at[rows, ids]
        .add(1, mode="drop")
    )


def token_counts(
    history: Int[Array, "B length"],
    draft_tokens: Int[Array, "B G"],
    vocab: int,
) -> Int[Array, "B G_plus_1 V"]:
    """Each token's count in the history of each position of a step: the row's
    `history` (-1 pads) and, at draft position $i$, the draft tokens before $i$."""
    batch = history.shape[0]
    base = history_counts(history, vocab)
    # Position i adds the draft tokens before it: G elementwise comparisons with the
    # token ids, which XLA fuses into the penalties that read them (no one-hot array
    # and no cumulative sum of one, each as large as the logits).
    gamma = draft_tokens.shape[1]
    token_ids = jnp.arange(vocab, dtype=jnp.int32)[None, None]
    position = jnp.arange(gamma + 1, dtype=jnp.int32)[None, :, None]
    counts = jnp.broadcast_to(base[:, None], (batch, gamma + 1, vocab))
    for j in range(gamma):
        drafted = (draft_tokens[:, j, None, None] == token_ids) & (j < position)
        counts = counts + drafted.astype(jnp.int32)
    return counts


@typing.no_type_check  # validated by hand, with messages naming the argument
def logits_step(
    draft_tokens: DraftTokens,
    draft_logits: Float[Array, "B G V"] | None,
    target_logits: Float[Array, "B G+1 V"],
    accept_uniforms: AcceptUniforms | None,
    sample_uniforms: SampleRandomnessBatch | None,
    *,
    target_warp: Warp = Warp(),
    draft_warp: Warp = Warp(),
    verifier: AbstractVerifier,
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    history: Int[Array, "B length"] | None = None,
    allowed: Array | None = None,
    draft_allowed: bool = True,
) -> tuple[dict[str, Array], list[Problem]]:
    """The step on logits (chains), traced inside [`eqx_specdec.verify`][]'s program:
    the outputs' dict and the run-time checks' problems (none with checks off)."""
    entry = "verify"
    level = check_level(check_inputs)
    logprobs = check_logprobs(logprobs, entry, raw_available=True)
    inputs = prepare_inputs(
        entry,
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
            checked_history(history, draft_tokens.shape[0], entry),
            draft_tokens,
            target_logits.shape[-1],
        )
    # The library's verifier takes the warped rows unevaluated and evaluates each row
    # inside its own iteration, computing only the entries the row's stages read; any
    # other verifier (a user's, a sharded one) gets the log-probabilities as arrays.
    # Whatever else reads the whole log-probabilities (the requested log-probabilities,
    # the mask's check) evaluates them itself; XLA drops them when nothing does.
    target_rows = target_warp.rows(target_logits, counts)
    target_log_probs = target_rows.log_probs()
    draft_rows = draft_log_probs = None
    if draft_logits is not None:
        draft_counts = None if counts is None else counts[:, :-1]
        draft_rows = draft_warp.rows(draft_logits, draft_counts)
        draft_log_probs = draft_rows.log_probs()
    if isinstance(verifier, Verifier):
        arrays = (draft_tokens, draft_rows, target_rows, accept, sample)
    else:
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
        return with_requested(verifier(*arrays, log_space=True)), []
    outputs, report = verifier.checked_call(*arrays, values=False, log_space=True)
    outputs = with_requested(outputs)
    more = warp_problems("target_warp", target_warp, target_logits)
    if draft_logits is not None:
        more += warp_problems("draft_warp", draft_warp, draft_logits)
    if counts is not None:
        vocab = target_logits.shape[-1]
        more += token_problems(
            history, vocab, "history", valid=jnp.asarray(history) >= 0
        )
    argmax_only = inputs.argmax_in_rows(verifier, level)
    # At the default level, the logits of the rows the verification read, through the
    # normalisers the warp found there (no pass of its own over the rows), where the
    # rows the warp read are the logits as given: no mask, no logit bias.
    rows_read = (
        level == "read"
        and allowed is None
        and target_warp.logit_bias is None
        and draft_warp.logit_bias is None
    )
    problems = inputs.problems(
        verifier,
        outputs,
        report,
        tuple(more),
        argmax_only=argmax_only,
        rows_read=rows_read,
    )
    if allowed is not None:
        problems = mask_problems(mask, target_log_probs, log_space=True) + problems
    return outputs, problems


def checked_history(history, batch: int, entry: str):
    """`history` as int32 `(B, H)`, for `entry`'s penalties: an error naming it when it
    is missing or malformed."""
    if history is None:
        raise ValueError(
            f"A warp has a history-dependent penalty, so {entry} needs `history`: "
            "integer (B, H), each row's tokens the penalties count, -1 for padding."
        )
    history = jnp.asarray(history)
    if history.ndim != 2 or history.shape[0] != batch:
        raise ValueError(
            f"`history` must have shape (B, H) with B = {batch}; got {history.shape}."
        )
    if not jnp.issubdtype(history.dtype, jnp.integer):
        raise TypeError(f"`history` must be integer token ids, got {history.dtype}.")
    return history.astype(jnp.int32)
