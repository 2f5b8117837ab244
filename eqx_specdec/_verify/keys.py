"""The verification step with its randomness drawn from a `jax.random` key."""

import typing

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from .._custom_types import DraftProbs, DraftTokens, TargetProbs
from .._exactness import refuse_inexact
from .abstract_verifier import AbstractVerifier
from .checks import CheckLevel
from .dispatch import entry_point
from .logprobs import LogProbs
from .verifier import speculative_accept, Verifier


@typing.no_type_check  # validated by hand, with messages naming the argument
def uniforms_from_key(
    key: Key[Array, ""],
    batch: int,
    gamma: int,
    *,
    verifier: AbstractVerifier = Verifier(),
) -> tuple[Float[Array, "B G"], Float[Array, " B"] | Key[Array, " B"]]:
    """Draws the randomness of one verification step from a `jax.random` key.

    Row $b$ uses only `row_key = jax.random.fold_in(key, b)`, so its randomness does not
    depend on the batch size or on the other rows. From it,
    `accept_key, sample_key = jax.random.split(row_key)`;
    `accept_uniforms[b] = jax.random.uniform(accept_key, (gamma,), jnp.float32)`; and the
    sampler's randomness is `jax.random.uniform(sample_key, (), jnp.float32)` for an
    inverse-CDF sampler, or `sample_key` itself for a key-driven one
    ([`eqx_specdec.GumbelSampler`][]).

    **Arguments:**

    - `key`: a `jax.random` key (typed, from `jax.random.key`).
    - `batch`: the number of rows $B$.
    - `gamma`: the draft length $G$.
    - `verifier`: the verifier the randomness is for (its sampler decides between a
        uniform and a key per row).

    **Returns:**

    `(accept_uniforms, sample_uniforms)`: float32 of shape `(B, G)`, and float32 of shape
    `(B,)` or a key array of shape `(B,)`.
    """
    row_keys = jax.vmap(lambda b: jax.random.fold_in(key, b))(
        jnp.arange(batch, dtype=jnp.uint32)
    )
    split = jax.vmap(jax.random.split)(row_keys)
    accept_keys, sample_keys = split[:, 0], split[:, 1]
    accept = jax.vmap(lambda k: jax.random.uniform(k, (gamma,), jnp.float32))(
        accept_keys
    )
    if verifier.residual_sampler.randomness == "key":
        return accept, sample_keys
    sample = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(sample_keys)
    return accept, sample


@entry_point
@typing.no_type_check  # validated by hand, with messages naming the argument
def speculative_accept_from_key(
    key: Key[Array, ""],
    draft_tokens: DraftTokens,
    draft_probs: DraftProbs | None,
    target_probs: TargetProbs,
    *,
    verifier: AbstractVerifier = Verifier(),
    check_inputs: CheckLevel = "read",
    logprobs: LogProbs | None = None,
    exact_only: bool = False,
) -> dict[str, Array]:
    """[`eqx_specdec.speculative_accept`][] with its randomness drawn from a key, by
    [`eqx_specdec.uniforms_from_key`][]: the same key and inputs always give the same
    tokens, and a row's tokens do not depend on the other rows or the batch size.

    **Arguments:**

    - `key`: a `jax.random` key.
    - `draft_tokens`, `draft_probs`, `target_probs`, `verifier`, `check_inputs`,
        `logprobs`, `exact_only`: as for [`eqx_specdec.speculative_accept`][].

    **Returns:**

    As [`eqx_specdec.speculative_accept`][].
    """
    refuse_inexact("speculative_accept_from_key", verifier, exact_only)
    batch, gamma = jnp.shape(draft_tokens)
    accept, sample = uniforms_from_key(key, batch, gamma, verifier=verifier)
    # The undecorated function, traced inline: its checks' status reaches this entry
    # point's own wrapper.
    return speculative_accept.__wrapped__(
        draft_tokens,
        draft_probs,
        target_probs,
        accept,
        sample,
        verifier=verifier,
        check_inputs=check_inputs,
        logprobs=logprobs,
        exact_only=exact_only,
    )
