"""Inverse-CDF token search: one guarded search shared by the flat search, both levels of
the two-level search and the sharded owner-shard search; and the row argmax, through the
same blocks where the backend rewards it."""

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ._platform import argmax_by_blocks


def has_mass(total, dtype):
    """Whether a residual's `total` mass is usable. Below the smallest normal number it
    is rounding noise (or flushed to zero). A NaN total counts as mass: the invalid row
    it came from is then the one drawn from, and the draw gives -1, where falling back
    to another row would hide it."""
    return ~(total <= jnp.finfo(dtype).tiny)


def block_size(vocab: int) -> int:
    """The block length of the two-level search: a power of two near $\\sqrt{V}$, so that
    both the scan over block totals and the scan inside one block are short."""
    return min(1 << max(0, round(math.log2(math.sqrt(vocab)))), vocab)


_LANES = 16


def block_totals(weights: Float[Array, " V"], size: int) -> Float[Array, " blocks"]:
    """Sums of consecutive blocks of `size` weights (the last block may be shorter)."""
    return block_sums((weights,), size)[0]


def block_sums(arrays: tuple, size: int) -> tuple:
    """[`block_totals`][eqx_specdec._search.block_totals] of several arrays of one
    length, in one pass: a single variadic reduction, so XLA reads each position once
    and runs the sums as independent accumulators (on XLA CPU, as fast as one sum)."""
    vocab = arrays[0].shape[0]
    full = vocab // size
    # Blocks as (size / lanes, lanes) and the sum over the middle axis: XLA CPU then
    # keeps `lanes` accumulators per block in a vector register (a sum over the minor
    # axis, or a variadic one, runs one scalar chain at a time).
    lanes = _LANES if size % _LANES == 0 else 1
    zeros = tuple(jnp.zeros((), a.dtype) for a in arrays)
    sums = jax.lax.reduce(
        tuple(a[: full * size].reshape(full, size // lanes, lanes) for a in arrays),
        zeros,
        lambda x, y: tuple(a + b for a, b in zip(x, y)),
        (1,),
    )
    sums = tuple(jnp.sum(total, axis=1) for total in sums)
    if vocab % size:
        sums = tuple(
            jnp.append(total, jnp.sum(a[full * size :]))
            for total, a in zip(sums, arrays)
        )
    return tuple(sums)


def window_start(
    block: Int[Array, "*rows"], size: int, vocab: int
) -> Int[Array, "*rows"]:
    """Where the `size`-long window holding block `block` starts (for each of several
    rows' blocks alike): a last, shorter block is read through a window shifted left so
    that it stays inside the vocabulary."""
    return jnp.minimum(block * size, vocab - size)


def _last_positive_at_or_before(positive, index):
    """The last i <= index with positive[i], else the first positive i (else 0)."""
    ids = jnp.arange(positive.shape[0], dtype=jnp.int32)
    before = jnp.max(jnp.where(positive & (ids <= index), ids, -1))
    return jnp.where(before >= 0, before, jnp.argmax(positive).astype(jnp.int32))


def guarded_search(
    cumulative: Float[Array, " n"], positive: Bool[Array, " n"], threshold
) -> Int[Array, ""]:
    """The first index whose cumulative weight exceeds `threshold`. If rounding points
    past the end or at a zero-weight entry, the last positive entry before that point
    instead: never `n`, never an entry without weight (the inverse CDF's guard, shared by
    every level of every search, sharded ones included)."""
    n = cumulative.shape[0]
    index = jnp.sum(cumulative <= threshold, dtype=jnp.int32)
    clipped = jnp.minimum(index, n - 1)
    return jnp.where(
        (index < n) & positive[clipped],
        index,
        _last_positive_at_or_before(positive, clipped),
    )


def two_level_search(
    totals: Float[Array, " blocks"],
    window: Callable[[Int[Array, ""]], Float[Array, " size"]],
    uniform: Float[Array, ""] | None,
    vocab: int,
    threshold: Float[Array, ""] | None = None,
) -> Int[Array, ""]:
    """Inverse CDF in two levels: find the block whose cumulative total first exceeds
    `uniform * total`, then the token inside it.

    `totals` are the block sums of the weights (see `block_totals`); `window(block)`
    returns the `size` weights starting at `window_start(block, size, vocab)`. Only one
    block is read a second time, and the scans run over `blocks` and `size` entries rather
    than `vocab`: a full-length cumulative sum is slow on XLA CPU.

    Returns the smallest token whose cumulative weight exceeds `uniform * total` (or
    `threshold`, when given instead of `uniform`: a search inside one shard). If
    rounding points past the end or at a zero-weight token, returns the last
    positive-weight token before that point: never `vocab` and never a zero-weight token
    (unless every weight is zero, when it returns a token of the first block). With
    `uniform`, -1 if the weights hold a NaN or an infinity (`finite_or_invalid`).
    """
    cumulative = jnp.cumsum(totals)
    drawn = threshold is None
    if drawn:
        threshold = uniform.astype(totals.dtype) * cumulative[-1]
    block = guarded_search(cumulative, totals > 0, threshold)
    before = jnp.where(block > 0, cumulative[jnp.maximum(block - 1, 0)], 0)
    weights = window(block)
    size = weights.shape[0]
    first = block * size
    start = window_start(block, size, vocab)
    ids = start + jnp.arange(size, dtype=jnp.int32)
    # Drop the overlap of a shifted window with the previous block.
    weights = jnp.where(ids >= first, weights, 0)
    token = start + guarded_search(before + jnp.cumsum(weights), weights > 0, threshold)
    return finite_or_invalid(token, cumulative[-1]) if drawn else token


def flat_search(
    weights: Float[Array, " V"],
    uniform: Float[Array, ""] | None,
    threshold: Float[Array, ""] | None = None,
) -> Int[Array, ""]:
    """Inverse CDF with one full-length cumulative sum: fewer operations than
    `two_level_search`, so faster for small vocabularies. Same guard: never `vocab`, never
    a zero-weight token. Same `threshold` option."""
    cumulative = jnp.cumsum(weights)
    if threshold is not None:
        return guarded_search(cumulative, weights > 0, threshold)
    threshold = uniform.astype(weights.dtype) * cumulative[-1]
    return finite_or_invalid(
        guarded_search(cumulative, weights > 0, threshold), cumulative[-1]
    )


def finite_or_invalid(token: Int[Array, ""], total: Float[Array, ""]) -> Int[Array, ""]:
    """`token`, or -1 when the weights it was drawn from hold a NaN or an infinity
    (their `total` is not finite): with the input checks off, an invalid row gives -1,
    never a token."""
    return jnp.where(jnp.isfinite(total), token, -1).astype(jnp.int32)


# Below this vocabulary size a single cumulative sum beats the two-level search.
FLAT_SEARCH_MAX_VOCAB = 32


def draw(key: Array, weights: Float[Array, " V"]) -> Int[Array, ""]:
    """A token drawn from `weights / sum(weights)` with `key`: one uniform and
    [`inverse_cdf`][eqx_specdec._search.inverse_cdf]'s search. The loops' draws from a
    draft's rows: at a vocabulary of 49,152 on the CPU, 0.03 ms a row against 1.3 ms for
    `jax.random.categorical` (a Gumbel variate per entry). -1 if `weights` hold a NaN or
    an infinity."""
    return inverse_cdf(weights, jax.random.uniform(key, (), weights.dtype))


def inverse_cdf(
    weights: Float[Array, " V"],
    uniform: Float[Array, ""] | None,
    threshold: Float[Array, ""] | None = None,
) -> Int[Array, ""]:
    """Draws from `weights / sum(weights)` with one uniform: the smallest $v$ whose
    cumulative sum exceeds `uniform * sum(weights)`, by `two_level_search`.

    If rounding leaves every cumulative sum at or below that threshold (a uniform just
    under 1), returns the last token with positive weight, never `vocab` and never a
    zero-weight token. `weights` must be non-negative with a positive sum; -1 if they
    hold a NaN or an infinity. With `threshold` instead of `uniform`, the smallest $v$
    whose cumulative sum exceeds it.
    """
    vocab = weights.shape[0]
    if vocab <= FLAT_SEARCH_MAX_VOCAB:
        return flat_search(weights, uniform, threshold)
    size = block_size(vocab)

    def window(block):
        start = window_start(block, size, vocab)
        return jax.lax.dynamic_slice_in_dim(weights, start, size)

    return two_level_search(
        block_totals(weights, size), window, uniform, vocab, threshold
    )


def first_argmax(values: Float[Array, "*rows width"], log_space: bool):
    """The first most likely entry of each row, int32, or `width` for a row without one
    (see [`eqx_specdec.RowContext.argmax`][]: `log_space` says the rows' space), in the form the backend reads fastest
    (`argmax_by_blocks`). Ties and NaN are XLA's argmax's: the first maximum, or the
    first NaN (whose value then makes the row unusable)."""
    width = values.shape[-1]
    if argmax_by_blocks():
        # The first block holding the row's maximum (its maxima's argmax), then the
        # first maximum in that block. XLA CPU's maximum does not always keep a NaN,
        # so a block whose sum is NaN (one holding a NaN, or +inf beside -inf) counts
        # as holding +inf: the row's first non-finite entry, there, leaves the row
        # unusable all the same. (A select of the NaNs before the maximum would
        # make it 8x slower: two reductions cost 2x.)
        size = block_size(width)
        full = width // size
        blocks = values[..., : full * size].reshape(values.shape[:-1] + (full, size))
        maxima = jnp.max(blocks, axis=-1)
        sums = jnp.sum(blocks, axis=-1)
        if width % size:
            tail = values[..., full * size :]
            maxima = jnp.concatenate([maxima, jnp.max(tail, -1, keepdims=True)], -1)
            sums = jnp.concatenate([sums, jnp.sum(tail, -1, keepdims=True)], -1)
        maxima = jnp.where(jnp.isnan(sums), jnp.inf, maxima)
        block = jnp.argmax(maxima, axis=-1).astype(jnp.int32)
        start = window_start(block, size, width)
        offsets = jnp.arange(size, dtype=jnp.int32).reshape((1,) * block.ndim + (size,))
        ids = start[..., None] + offsets
        window = jnp.take_along_axis(values, ids, axis=-1)
        window = jnp.where(jnp.isnan(window), jnp.inf, window)
        # A shifted last window's overlap with the block before is not this block's.
        window = jnp.where(ids >= block[..., None] * size, window, -jnp.inf)
        first = start + jnp.argmax(window, axis=-1).astype(jnp.int32)
    else:
        first = jnp.argmax(values, axis=-1).astype(jnp.int32)
    largest = jnp.take_along_axis(values, first[..., None], axis=-1)[..., 0]
    usable = jnp.isfinite(largest) & (log_space | (largest > 0))
    return jnp.where(usable, first, width).astype(jnp.int32)
