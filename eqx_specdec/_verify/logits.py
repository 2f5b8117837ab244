"""The verification step on logits: temperature, top-k and top-p warps, verified in log
space."""

import typing

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._custom_types import AcceptUniforms, DraftTokens, SampleRandomnessBatch
from .._misc import check_hyperparameter, compute_dtype
from .._stages.prefix_counter import PrefixCounter
from .._stages.ratio_test import RatioTest
from .._stages.residual_sampler import ResidualSampler
from .._stages.token_assembler import TokenAssembler
from .abstract_verifier import AbstractVerifier
from .checks import check_level, checked, CheckLevel
from .dispatch import entry_point
from .inputs import LOGIT_NAMES, prepare_inputs
from .verifier import Verifier


def _per_row(value, logits):
    """A scalar or per-row `(B,)` parameter, shaped to broadcast against `(B, R, V)`."""
    value = jnp.asarray(value)
    return value.reshape(value.shape + (1,) * (logits.ndim - value.ndim))


class Warp(eqx.Module):
    """The sampling transform a model's logits go through, as serving stacks apply it:
    a logit bias, then temperature, top-k, top-p (nucleus) and min-p. Returns
    log-probabilities.

    Each parameter is a scalar or a per-row array of shape `(B,)` (the logit bias: `(V,)`
    or per row `(B, V)`), so one batch can mix rows of different settings. A row with temperature 0 is greedy: its distribution
    is one-hot at the most likely token (ties: the lowest id), and speculative sampling
    with it reduces exactly to greedy verification.

    For speculative sampling to be lossless, the target's warp must be the distribution
    the user wants to sample from, and the draft's warp must be exactly the law the draft
    tokens were sampled from (a draft sampled at temperature 0.7 with top-p 0.9 needs
    `Warp(0.7, top_p=0.9)`). Using raw draft probabilities while the draft sampled from a
    warped distribution is a known bug class.

    **Arguments:**

    - `temperature`: $T \\ge 0$; logits are divided by $T$. Default 1.
    - `top_k`: keep the $k$ largest logits of each distribution ($k \\ge 1$; 0 keeps
        all); ties with the $k$-th largest are kept. `None` (the default) skips the sort.
    - `top_p`: keep the smallest set of most likely tokens whose probability reaches
        $p \\in (0, 1]$ (at least one token); ties with the last kept value are kept.
        `None` (the default) skips the sort.
    - `min_p`: keep the tokens whose probability is at least `min_p` times the most
        likely token's, after the warps before it ($\\in [0, 1]$; 0 keeps all).
        `None` (the default) skips it.
    - `logit_bias`: added to the logits before anything else (OpenAI's `logit_bias`):
        float of shape `(V,)` or `(B, V)`, in target vocabulary ids; $-\\infty$ bans a
        token. `None` (the default) adds nothing.
    """

    temperature: Float[Array, "*batch"] | float = 1.0
    top_k: Int[Array, "*batch"] | int | None = None
    top_p: Float[Array, "*batch"] | float | None = None
    min_p: Float[Array, "*batch"] | float | None = None
    logit_bias: Float[Array, "*batch vocab"] | None = None

    def __check_init__(self):
        check_hyperparameter(
            "temperature", self.temperature, 0.0, float("inf"), low_open=False
        )
        if self.top_p is not None:
            check_hyperparameter("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if self.top_k is not None:
            check_hyperparameter("top_k", self.top_k, 0.0, float("inf"), low_open=False)
        if self.min_p is not None:
            check_hyperparameter("min_p", self.min_p, 0.0, 1.0, low_open=False)
        if self.logit_bias is not None and jnp.ndim(self.logit_bias) not in (1, 2):
            raise ValueError(
                "`logit_bias` must have shape (V,) or (B, V); got shape "
                f"{jnp.shape(self.logit_bias)}."
            )

    def __call__(
        self, logits: Float[Array, "batch rows vocab"]
    ) -> Float[Array, "batch rows vocab"]:
        """Warps a batch of logits.

        **Arguments:**

        - `logits`: float of shape `(B, R, V)`; `-inf` masks a token.

        **Returns:**

        The warped log-probabilities, float32 (float64 for float64 logits), of shape
        `(B, R, V)`; `-inf` for tokens the warp removes.
        """
        x = logits.astype(compute_dtype(logits.dtype))
        vocab = x.shape[-1]
        if self.logit_bias is not None:
            x = x + self._bias(x)
        temperature = _per_row(self.temperature, x).astype(x.dtype)
        greedy = temperature == 0
        x_scaled = x / jnp.where(greedy, 1, temperature)
        if self.top_k is not None:
            k = _per_row(self.top_k, x).astype(jnp.int32)
            descending = -jnp.sort(-x_scaled, axis=-1)
            index = jnp.clip(k - 1, 0, vocab - 1)
            kth = jnp.take_along_axis(
                descending, jnp.broadcast_to(index, x.shape[:-1] + (1,)), axis=-1
            )
            x_scaled = jnp.where((k > 0) & (x_scaled < kth), -jnp.inf, x_scaled)
        if self.top_p is not None:
            top_p = _per_row(self.top_p, x).astype(x.dtype)
            log_probs = jax.nn.log_softmax(x_scaled, axis=-1)
            descending = -jnp.sort(-log_probs, axis=-1)
            before = jnp.cumsum(jnp.exp(descending), axis=-1) - jnp.exp(descending)
            # Tokens whose preceding mass is still below top_p are kept (at least one).
            keep = jnp.maximum(jnp.sum(before < top_p, axis=-1, keepdims=True), 1)
            cutoff = jnp.take_along_axis(descending, keep - 1, axis=-1)
            x_scaled = jnp.where(log_probs < cutoff, -jnp.inf, x_scaled)
        if self.min_p is not None:
            min_p = _per_row(self.min_p, x).astype(x.dtype)
            log_probs = jax.nn.log_softmax(x_scaled, axis=-1)
            # The most likely token has log-probability max(log_probs): always kept.
            floor = jnp.log(min_p) + jnp.max(log_probs, axis=-1, keepdims=True)
            x_scaled = jnp.where(log_probs < floor, -jnp.inf, x_scaled)
        log_probs = jax.nn.log_softmax(x_scaled, axis=-1)
        ids = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
        best = jnp.argmax(x, axis=-1, keepdims=True).astype(jnp.int32)
        one_hot = jnp.where(ids == best, 0.0, -jnp.inf).astype(x.dtype)
        return jnp.where(greedy, one_hot, log_probs)

    def _bias(self, x):
        """The logit bias, shaped to broadcast against `(B, R, V)`."""
        bias = jnp.asarray(self.logit_bias).astype(x.dtype)
        batch, _, vocab = x.shape
        if bias.shape[-1] != vocab or (bias.ndim == 2 and bias.shape[0] != batch):
            raise ValueError(
                f"`logit_bias` must have shape (V,) = ({vocab},) or (B, V) = ({batch}, "
                f"{vocab}), in the target's vocabulary; got {tuple(bias.shape)}."
            )
        return bias[None, None] if bias.ndim == 1 else bias[:, None]


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
    draft_logits: Float[Array, "batch gamma vocab"] | None,
    target_logits: Float[Array, "batch gamma+1 vocab"],
    accept_uniforms: AcceptUniforms | None,
    sample_uniforms: SampleRandomnessBatch | None,
    *,
    target_warp: Warp = Warp(),
    draft_warp: Warp = Warp(),
    verifier: AbstractVerifier = LOGITS_VERIFIER,
    check_inputs: CheckLevel = "read",
) -> dict[str, Int[Array, "..."]]:
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

    **Returns:**

    As [`eqx_specdec.speculative_accept`][].
    """
    level = check_level(check_inputs)
    inputs = prepare_inputs(
        "speculative_accept_logits",
        verifier,
        (draft_tokens, draft_logits, target_logits, accept_uniforms, sample_uniforms),
        log_space=True,
        names=LOGIT_NAMES,
    )
    draft_tokens, draft_logits, target_logits, accept, sample = inputs.arrays()
    target_log_probs = target_warp(target_logits)
    draft_log_probs = None if draft_logits is None else draft_warp(draft_logits)
    arrays = (draft_tokens, draft_log_probs, target_log_probs, accept, sample)
    if level is None:
        return verifier(*arrays)
    outputs, report = verifier.checked_call(*arrays, values=False)
    problems = inputs.problems(verifier, outputs, report)
    problems += _warp_problems("target_warp", target_warp, target_logits)
    if draft_logits is not None:
        problems += _warp_problems("draft_warp", draft_warp, draft_logits)
    return checked(outputs, problems)
