"""The verification step with its randomness drawn from a `jax.random` key."""

import typing

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from .abstract_verifier import AbstractVerifier
from .verifier import Verifier


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
    sample_key = verifier.residual_sampler.randomness == "key"
    return row_uniforms(key, batch, gamma, sample_key=sample_key)


def row_uniforms(key, batch: int, width: int, *, sample_key: bool = False):
    """`width` accept uniforms and a sampling uniform (or key, with `sample_key`) per
    row, row $b$ drawn from `fold_in(key, b)` alone (see
    [`eqx_specdec.uniforms_from_key`][]); for chains and trees alike."""
    row_keys = jax.vmap(lambda b: jax.random.fold_in(key, b))(
        jnp.arange(batch, dtype=jnp.uint32)
    )
    split = jax.vmap(jax.random.split)(row_keys)
    accept_keys, sample_keys = split[:, 0], split[:, 1]
    accept = jax.vmap(lambda k: jax.random.uniform(k, (width,), jnp.float32))(
        accept_keys
    )
    if sample_key:
        return accept, sample_keys
    sample = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(sample_keys)
    return accept, sample
