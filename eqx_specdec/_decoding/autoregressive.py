"""Plain autoregressive decoding with one model: the baseline speculative decoding must
reproduce in distribution."""

import typing
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, Key

from .._inputs.checks import invalid_distributions
from .._models.cached import call_rows, initial_states, prefill
from .._proposal.abstract_proposal import as_probs, ModelOutputs
from .loop import check_decode_arguments, check_key, row_keys, token_buffer


@eqx.filter_jit
def _autoregressive(
    model,
    prompt_tokens,
    prompt_lengths,
    key,
    num_tokens,
    greedy,
    outputs,
    calls=1,
    check=True,
):
    """Plain decoding; with `calls = K > 1` each step calls the model on `K` positions
    from the current one (the first row drawn from, the others scratch): the cost of a
    `K`-token call measured in plain decoding's own program, for the cost model of
    `measure_speedup`. `check=False` leaves out the check of the model's rows (the
    baseline `measure_speedup` times is the loop a user writes, with no check)."""
    batch, width = prompt_tokens.shape
    buffer = token_buffer(prompt_tokens, num_tokens + calls - 1)
    state = prefill(model, buffer, width, initial_states(model, batch, buffer.shape[1]))
    rows = jnp.arange(batch)
    keys = row_keys(key, batch)

    def step(carry, t):
        buffer, state, failed = carry
        position = prompt_lengths - 1 + t
        p, state = call_rows(model, buffer, position, calls, state)
        p = as_probs(p[:, 0], outputs)
        # A row whose model returned something that is not a distribution emits -1
        # from there on, never a token drawn from it.
        if check:
            failed = failed | invalid_distributions(p)
        if greedy:
            x = jnp.argmax(p, axis=-1)
        else:

            def draw(row_key, p):
                return jax.random.categorical(
                    jax.random.fold_in(row_key, t), jnp.log(p)
                )

            x = jax.vmap(draw)(keys, p)
        buffer = buffer.at[rows, position + 1].set(x.astype(jnp.int32))
        return (buffer, state, failed), failed

    (buffer, _, _), failed = jax.lax.scan(
        step,
        (buffer, state, jnp.zeros((batch,), bool)),
        jnp.arange(num_tokens, dtype=jnp.int32),
    )
    take = prompt_lengths[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None]
    tokens = jnp.take_along_axis(buffer, take, axis=1)
    return jnp.where(failed.T, -1, tokens)


@typing.no_type_check  # validated by hand, with messages naming the argument
def autoregressive_decode(
    model: Callable,
    prompt_tokens: Int[Array, "B prompt"],
    prompt_lengths: Int[Array, " B"] | None,
    num_tokens: int,
    key: Key[Array, ""] | None = None,
    *,
    outputs: ModelOutputs = "probs",
    check_models: bool = True,
) -> Int[Array, "B num_tokens"]:
    """Plain autoregressive decoding with one model: the baseline that speculative
    decoding must reproduce in distribution, one model call per token (a stateless
    model, or an [`eqx_specdec.models.AbstractCachedModel`][] called on one new token at a
    time after a prefill of the prompt).

    **Arguments:**

    - `model`, `prompt_tokens`, `prompt_lengths`, `num_tokens`, `outputs`: as for
        [`eqx_specdec.speculative_decode`][].
    - `key`: a `jax.random` key to sample with (or one per row, as for
        [`eqx_specdec.speculative_decode`][]; row $b$ draws token $t$ with
        `fold_in(row_key, t)`), or `None` for greedy decoding (the argmax, lowest id on
        ties).
    - `check_models`: check each row the model returns (below). Default `True`;
        `False` is the bare loop, the baseline to time speculative decoding against
        when its own `check_models` is off (its default).

    **Returns:**

    int32 of shape `(B, L)`, the generated tokens. A row whose model returns a
    distribution that is not one (NaN, infinite, negative, or a sum away from 1; logits
    after their softmax) holds -1 from that position on (with `check_models`).
    """
    if isinstance(outputs, tuple):
        raise ValueError(
            '`outputs` must be "probs" or "logits" (what the one model returns), got '
            f"{outputs!r}."
        )
    if not isinstance(check_models, bool):
        raise TypeError(
            f"`check_models` must be a Python bool, got {type(check_models).__name__}."
        )
    prompt_lengths = check_decode_arguments(
        prompt_tokens, prompt_lengths, num_tokens, outputs
    )
    greedy = key is None
    if not greedy:
        key = check_key(key, len(prompt_lengths))
    return _autoregressive(
        model,
        jnp.asarray(prompt_tokens),
        prompt_lengths,
        jax.random.key(0) if greedy else key,
        num_tokens,
        greedy,
        outputs,
        check=check_models,
    )
