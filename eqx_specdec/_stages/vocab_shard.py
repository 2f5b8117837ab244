"""One device's slice of the vocabulary: the collectives a vocabulary-parallel stage is
written with, inside [`eqx_specdec.ShardedVerifier`][]'s `shard_map`."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Integer

from .._search import guarded_search, inverse_cdf


class VocabShard(eqx.Module):
    """This device's slice `[offset, offset + width)` of the vocabulary, and the
    collectives over the devices that hold the other slices.

    A stage declaring `vocab_parallel = True` receives one in its
    [`eqx_specdec.RowContext`][], with one row's arrays sliced to this shard (shape
    `(..., width)` in place of `(..., vocab)`). Stages run under `jax.vmap` over the
    rows, so a collective on a per-row value exchanges one value per row and device,
    never a row of the distributions.

    **Fields:**

    - `axis_name`: the mesh axis the vocabulary is split over (static).
    - `index`: int32 scalar, this shard's position along that axis.
    - `width`: the slice's length (static).
    """

    axis_name: str = eqx.field(static=True)
    index: Int[Array, ""]
    width: int = eqx.field(static=True)

    @property
    def offset(self) -> Int[Array, ""]:
        """The global id of this shard's first token."""
        return self.index * self.width

    def token_ids(self) -> Int[Array, " width"]:
        """The global ids of this shard's tokens."""
        return self.offset + jnp.arange(self.width, dtype=jnp.int32)

    def sum(self, x):
        """`x` summed over the shards (`jax.lax.psum`)."""
        return jax.lax.psum(x, self.axis_name)

    def all_gather(self, x):
        """Every shard's `x`, stacked on a new leading axis of length D."""
        return jax.lax.all_gather(x, self.axis_name)

    def take(
        self, rows: Float[Array, "n width"], tokens: Integer[Array, " n"], dtype
    ) -> Float[Array, " n"]:
        """`rows[i, tokens[i]]` for global token ids, in `dtype`: the owning shard gives
        the value, the others zero, so the sum over shards is exact."""
        local = tokens.astype(jnp.int32) - self.offset
        owned = (local >= 0) & (local < self.width)
        index = jnp.clip(local, 0, self.width - 1)[:, None]
        values = jnp.take_along_axis(rows, index, axis=-1)[:, 0].astype(dtype)
        return self.sum(jnp.where(owned, values, 0))

    def argmax(self, values: Float[Array, "*rows width"]) -> Int[Array, "*rows"]:
        """The global argmax over the vocabulary (lowest id on ties, as `jnp.argmax` on
        the whole row): a `pmax` of the shard maxima, then a `pmin` of the ids reaching
        it."""
        local_best = jnp.max(values, axis=-1)
        local_id = jnp.argmax(values, axis=-1).astype(jnp.int32) + self.offset
        best = jax.lax.pmax(local_best, self.axis_name)
        big = jnp.iinfo(jnp.int32).max
        return jax.lax.pmin(
            jnp.where(local_best == best, local_id, big), self.axis_name
        )

    def draw(
        self,
        weights: Float[Array, " width"],
        uniform: Float[Array, ""],
        masses: Float[Array, " shards"] | None = None,
    ) -> Int[Array, ""]:
        """Draws a global token id from the distribution whose unnormalised weights are
        split over the shards (this shard's slice: `weights`), by inverse CDF with one
        uniform, with the one-device search's guards: every device finds the shard
        holding `uniform * total`, that shard alone searches its slice, and the token
        comes back in one `psum`.

        **Arguments:**

        - `weights`: this shard's non-negative weights.
        - `uniform`: $s \\in [0, 1)$.
        - `masses`: every shard's total weight, `(D,)`, if already gathered (else one
            `all_gather` of a scalar).

        **Returns:**

        An int32 scalar, the same on every shard.
        """
        if masses is None:
            masses = self.all_gather(jnp.sum(weights))
        cumulative = jnp.cumsum(masses)
        threshold = uniform.astype(masses.dtype) * cumulative[-1]
        owner = guarded_search(cumulative, masses > 0, threshold)
        before = jnp.where(owner > 0, cumulative[jnp.maximum(owner - 1, 0)], 0)
        local = inverse_cdf(weights, None, threshold - before)
        return self.sum(jnp.where(owner == self.index, self.offset + local, 0))
