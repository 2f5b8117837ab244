"""Log-probabilities of the emitted tokens: what RL, evaluation and calibration read from
a verification step, under the distribution each token was verified against."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._misc import no_type_check


@no_type_check  # its fields are checked by `__check_init__`
class LogProbs(eqx.Module):
    """What log-probabilities an entry point returns beside its tokens (opt-in: without
    it the program is the default one).

    With `logprobs=LogProbs(...)`, the outputs gain, for each emitted token (the
    accepted draft tokens, then the correction or bonus token):

    - `"logprobs"`: float32 `(B, G + 1)`, the target's log-probability of the token
        under the distribution it was verified against: the **processed** row $\\tilde
        p_i$ (after the warp of [`eqx_specdec.Logits`][]; the rows
        as given for [`eqx_specdec.speculative_accept`][]). Position $i \\le n$ holds
        $\\log \\tilde p_i(t_i)$: for the correction token too, its log-probability under
        the target's row $n$, not under the residual it was drawn from (the emitted
        tokens follow $\\tilde p$; the residual is how, not what). `-inf` after the
        emitted tokens (where `tokens` holds -1).
    - `"raw_logprobs"` (with `raw=True`; logits entry points only): the same under the
        row before processing, `log_softmax(target_logits)`.
    - `"top_logprobs"`, `"top_tokens"` (with `top_k = k > 0`): float32 and int32
        `(B, G + 1, k)`, the `k` most likely tokens of each emitted position's processed
        row and their log-probabilities, largest first (lowest id first on ties);
        `-inf` and -1 after the emitted tokens.

    **Arguments:**

    - `raw`: also the log-probabilities before processing. Default `False`.
    - `top_k`: how many of each processed row's most likely tokens to return, a Python
        int $\\ge 0$. Default 0 (none).
    """

    raw: bool = eqx.field(static=True, default=False)
    top_k: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if not isinstance(self.raw, bool):
            raise TypeError(f"LogProbs(`raw`=...) must be a bool, got {self.raw!r}.")
        top_k = self.top_k
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise ValueError(
                f"LogProbs(`top_k`=...) must be a Python int >= 0, got {top_k!r}."
            )


def check_logprobs(logprobs, entry_point: str, raw_available: bool):
    """`logprobs` (None or a `LogProbs`), or an error naming the argument."""
    if logprobs is None:
        return None
    if not isinstance(logprobs, LogProbs):
        raise TypeError(
            f"{entry_point}(`logprobs`=...) must be an eqx_specdec.LogProbs (for "
            "example LogProbs(raw=True, top_k=5)) or None; got "
            f"{type(logprobs).__name__}."
        )
    if logprobs.raw and not raw_available:
        raise ValueError(
            f"{entry_point}(`logprobs`=LogProbs(raw=True)): the rows it receives are "
            "the processed ones, so there is no raw log-probability to return. Use "
            "verify on Logits, whose warp processes the rows, or raw=False."
        )
    return logprobs


def _emitted(tokens: Int[Array, "B g_plus_1"]):
    return tokens >= 0, jnp.maximum(tokens, 0)


def _at_tokens(rows, tokens):
    """`rows[b, i, tokens[b, i]]`: `(B, G + 1)`."""
    return jnp.take_along_axis(rows, tokens[..., None], axis=-1)[..., 0]


def _as_log(values, log_space: bool):
    values = values.astype(jnp.float32)
    return values if log_space else jnp.log(values)


def with_logprobs(
    outputs: dict,
    logprobs: LogProbs | None,
    processed: Float[Array, "B g_plus_1 V"],
    log_space: bool,
    raw_logits: Float[Array, "B g_plus_1 V"] | None = None,
) -> dict:
    """`outputs` with the log-probabilities `logprobs` asks for (see `LogProbs`), read
    from the `processed` target rows (log-probabilities if `log_space`, probabilities
    otherwise) and, for `raw=True`, from the `raw_logits`."""
    if logprobs is None:
        return outputs
    emitted, tokens = _emitted(outputs["tokens"])
    minus_inf = jnp.float32(-jnp.inf)
    value = _as_log(_at_tokens(processed, tokens), log_space)
    extra = {"logprobs": jnp.where(emitted, value, minus_inf)}
    if logprobs.raw:
        raw = raw_logits.astype(jnp.float32)
        raw = _at_tokens(raw, tokens) - jax.nn.logsumexp(raw, axis=-1)
        extra["raw_logprobs"] = jnp.where(emitted, raw, minus_inf)
    if logprobs.top_k:
        values, ids = jax.lax.top_k(processed, logprobs.top_k)
        keep = emitted[..., None]
        extra["top_logprobs"] = jnp.where(keep, _as_log(values, log_space), minus_inf)
        extra["top_tokens"] = jnp.where(keep, ids.astype(jnp.int32), -1)
    return {**outputs, **extra}


def tree_rows(path: Int[Array, "B nodes"]) -> Int[Array, "B nodes_plus_1"]:
    """The target row each emitted token of a tree was verified against: the root's
    (row 0) for the first, then row `node + 1` of each node on the accepted `path`."""
    return jnp.concatenate([jnp.zeros_like(path[:, :1]), jnp.maximum(path, -1) + 1], 1)


def emitted_logprobs(
    tokens: Int[Array, "B slots"], target_probs: Float[Array, "B slots V"]
) -> Float[Array, "B slots"]:
    """`log target_probs[b, i, tokens[b, i]]` where a token was emitted, -inf after."""
    return with_logprobs({"tokens": tokens}, LogProbs(), target_probs, False)[
        "logprobs"
    ]
