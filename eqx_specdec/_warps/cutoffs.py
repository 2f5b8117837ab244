"""The warps' exact cut-offs without a sort: row reductions in vector registers, the
bisection over the values compared as integers, the candidate blocks that hold a row's
largest entries, and the top-k and top-p cut-offs with the normalisers of what they
keep."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._misc import compute_dtype
from .._platform import blocks_by_top_k


_LANES = 16


def _row_reduce(arrays, inits, combine):
    """A variadic reduction over the last axis of arrays of one shape, in one pass,
    keeping the axis: as `(V / 16, 16)` blocks reduced over the blocks first, so that
    XLA CPU keeps 16 accumulators in a vector register (a reduction over the minor axis
    runs one scalar chain)."""
    vocab = arrays[0].shape[-1]
    inits = tuple(jnp.asarray(i, a.dtype) for i, a in zip(inits, arrays))
    if vocab % _LANES == 0:
        shape = arrays[0].shape[:-1] + (vocab // _LANES, _LANES)
        arrays = tuple(a.reshape(shape) for a in arrays)
        arrays = jax.lax.reduce(arrays, inits, combine, (len(shape) - 2,))
    out = jax.lax.reduce(arrays, inits, combine, (arrays[0].ndim - 1,))
    return tuple(o[..., None] for o in out)


def _min_max(x, y):
    return jnp.minimum(x[0], y[0]), jnp.maximum(x[1], y[1])


def order_keys(x: Float[Array, "*rows V"]) -> Array:
    """Unsigned integer keys in the order of the floats `x` (the sign bit flipped for
    positive values, every bit for negative ones): searching over keys bit by bit finds
    a value of `x` exactly."""
    bits = np.dtype(x.dtype).itemsize * 8
    unsigned = jnp.uint32 if bits == 32 else jnp.uint64
    raw = jax.lax.bitcast_convert_type(x, unsigned)
    top = jnp.asarray(1 << (bits - 1), unsigned)
    return jnp.where(raw >= top, ~raw, raw | top)


def key_values(keys: Array, dtype) -> Array:
    """The floats of `order_keys`' keys."""
    bits = np.dtype(dtype).itemsize * 8
    top = jnp.asarray(1 << (bits - 1), keys.dtype)
    raw = jnp.where(keys >= top, keys ^ top, ~keys)
    return jax.lax.bitcast_convert_type(raw, dtype)


def largest_reaching(keys, weights, goal, bracket=None):
    """Per row, the largest key $t$ of the row such that the total weight of the keys
    $\\ge t$ reaches `goal` (the count of keys, for `weights=None`).

    A bisection over the integer range `[start, end)` that holds the answer, both ends
    snapped to the row's own keys after every pass: one pass over the row finds the
    weight at or above the midpoint, the smallest key at or above it and the largest
    key below it (one fused reduction). The range closes on the answer in at most as
    many passes as the keys have bits, and in about $\\log_2$ of the number of distinct
    keys when they are spread; equal keys (ties) cost nothing more. Exact: the keys
    are integers.

    **Arguments:**

    - `keys`: unsigned integers `(*rows, V)`, from `order_keys`.
    - `weights`: float `(*rows, V)` (non-negative), or `None` to count keys.
    - `goal`: `(*rows, 1)`, the weight (or count) to reach.
    - `bracket`: `(start, end)`, keys of the rows `(*rows, 1)` known to hold the answer
        between them (inclusive), the start reaching `goal`; by default the rows'
        smallest and largest keys.

    **Returns:**

    `(*rows, 1)` keys of the rows. A row whose total weight does not reach `goal`
    returns its smallest key (every key is kept).
    """
    lowest = jnp.zeros((), keys.dtype)
    highest = jnp.asarray(np.iinfo(keys.dtype).max, keys.dtype)

    def combine(x, y):
        return x[0] + y[0], jnp.minimum(x[1], y[1]), jnp.maximum(x[2], y[2])

    def reductions(middle):
        above = keys >= middle
        if weights is None:
            weight = above.astype(jnp.int32)
        else:
            weight = jnp.where(above, weights, 0)
        return _row_reduce(
            (weight, jnp.where(above, keys, highest), jnp.where(above, lowest, keys)),
            (0, highest, lowest),
            combine,
        )

    def unfinished(state):
        start, end = state
        return jnp.any(end - start > 1)

    def step(state):
        start, end = state
        live = end - start > 1
        middle = start + (end - start) // 2
        total, first_above, last_below = reductions(middle)
        reached = total >= goal
        # The answer is a key: at or above `middle` if reached, below it otherwise.
        start = jnp.where(live & reached, first_above, start)
        end = jnp.where(live & ~reached, last_below + 1, end)
        return start, end

    if bracket is None:
        start, end = _row_reduce((keys, keys), (highest, lowest), _min_max)
    else:
        # Never below the start, whatever the rounding of the bounds' sums.
        start, end = bracket[0], jnp.maximum(*bracket)
    end = end + 1
    return jax.lax.while_loop(unfinished, step, (start, end))[0]


def row_max(x):
    return _row_reduce((x,), (-jnp.inf,), lambda a, b: (jnp.maximum(a[0], b[0]),))[0]


def log_normaliser(x, highest, removed=None):
    """The shift and the log of the sum of exponentials of rows `x` `(..., V)` (both
    `(..., 1)`), given the rows' maxima (found in vector registers; the sum is XLA's
    own, which fuses it with them): `logsumexp(x) = shift + log_sum`. Where `removed`
    (boolean, like `x`) holds, the entry counts as `-inf`: its term is exactly 0."""
    shift = _shift(highest)
    terms = jnp.exp(x - shift)
    if removed is not None:
        terms = jnp.where(removed, 0, terms)
    total = jnp.sum(terms, axis=-1, keepdims=True)
    log_sum = jnp.log(total)
    return shift, log_sum


def count_equal(x, value):
    """Per row, the number of entries of `x` `(rows, V)` equal to `value` `(rows, 1)`,
    as floats `(rows, 1)`: exact (a row holding NaN counts NaN, as its normaliser is).

    Without a comparison in the pass where it can: XLA CPU runs a reduction holding a
    comparison or a select at about a quarter of the speed of one of arithmetic alone
    (90 ms against 22 for a float32 `(2048, 32000)` on this project's 2-core CPU). Each
    term is `max(0, 1 - |x - value| * 2^e)`, with $2^e$ the largest power of two of the
    dtype: 1 where equal, and 0 elsewhere as long as the difference of two unequal
    entries is a normal float, which holds where `|value|` is at least $2^{-100}$ (a
    difference below the smallest normal float is flushed to zero by the hardware). A
    batch with a smaller or an infinite `value` is counted by comparisons."""
    dtype = compute_dtype(x.dtype)
    apart = float(2.0 ** (int(jnp.finfo(dtype).maxexp) - 1))

    def arithmetic():
        terms = jnp.maximum(1 - jnp.abs(x - value).astype(dtype) * apart, 0)
        return jnp.sum(terms, axis=-1, keepdims=True)

    def comparisons():
        return jnp.sum(x == value, axis=-1, keepdims=True, dtype=dtype)

    # NaN compares false: counted by comparisons too.
    normal = (jnp.abs(value) >= 2.0**-100) & jnp.isfinite(value)
    return jax.lax.cond(jnp.all(normal), arithmetic, comparisons)


def _shift(highest):
    """What the exponentials are shifted by: the row maximum, 0 where it is infinite (a
    row of `-inf`, or one holding `inf`)."""
    return jnp.where(jnp.isfinite(highest), highest, 0)


def _top_blocks(x, k: int):
    """The blocks of 16 entries of each row of `x` `(..., V)` that hold its `k` largest
    values, for a Python int `k`: `(candidates (rows, 16 k), m (rows, 1), left_out
    (rows, 1))`, with $m$ and `left_out` as below (every entry of the row above $m$ is
    a candidate), or `None` when the rows are too short for blocks to help.

    The `k`-th largest block maximum $m$ is at most the row's `k`-th largest value,
    and every entry above $m$ lies in one of the fewer than `k` blocks whose maximum
    exceeds $m$. Those blocks, topped up with blocks whose maximum equals $m$ to `k`
    blocks, hold the row's `k` largest values, ties included, and every entry above
    $m$; entries equal to $m$ lie in blocks not taken only where more blocks than those
    have the maximum $m$ (the third result, per row). One pass over the rows, and one
    over the block maxima.
    """
    vocab = x.shape[-1]
    if vocab % _LANES or k < 1 or k * _LANES * 4 > vocab:
        return None
    blocks = x.reshape((-1, vocab // _LANES, _LANES))
    block_max = jnp.max(blocks, axis=-1)
    if blocks_by_top_k(k):
        # The k largest block maxima and their blocks, by XLA's TopK: on the CPU a heap
        # of k, one pass over the block maxima; the barrier keeps XLA CPU from lowering
        # it to a sort of every block maximum, as it does when they have other readers.
        # On a TPU the prefix sum and scatter of `_blocks_at_or_above` are slow (50.7
        # ms against TopK's 2.0 for k = 50 over (704, 8016) block maxima on a v5e).
        values, picks = jax.lax.optimization_barrier(jax.lax.top_k(block_max, k))
        m = values[:, k - 1 :]
    else:
        # A heap of many blocks is slow on the CPU: m by the search over the block
        # maxima, and the blocks at or above it, in order, by a prefix sum.
        m = key_values(largest_reaching(order_keys(block_max), None, k), x.dtype)
        picks = _blocks_at_or_above(block_max, m, k)
    # More than k blocks reach m only where blocks tie at m; the k taken are those above
    # m and some at m, whose entries equal to m elsewhere are not candidates.
    left_out = jnp.sum(block_max >= m, axis=-1, keepdims=True) > k
    candidates = jnp.take_along_axis(blocks, picks[..., None], axis=1)
    return candidates.reshape(candidates.shape[0], k * _LANES), m, left_out


def _blocks_at_or_above(block_max, m, k: int):
    """The indices `(rows, k)` of `k` blocks per row holding every block maximum above
    `m` `(rows, 1)` and as many at `m` as fit (rows with at least `k` at or above
    `m`): the first `k` at or above it, unless blocks tie at `m` beyond `k` in some
    row (a branch for the batch: under `vmap` a branch per row would run both)."""
    reaching = block_max >= m

    def first(mask):
        return jax.vmap(lambda row: jnp.nonzero(row, size=k, fill_value=0)[0])(mask)

    def with_ties_beyond():
        # The blocks above m first, then those at m.
        index = jnp.arange(k, dtype=jnp.int32)[None]
        above = block_max > m
        count = jnp.sum(above, axis=-1, keepdims=True, dtype=jnp.int32)
        tied = first(block_max == m)
        tied = jnp.take_along_axis(tied, jnp.maximum(index - count, 0), axis=-1)
        return jnp.where(index < count, first(above), tied)

    beyond = jnp.any(jnp.sum(reaching, axis=-1, dtype=jnp.int32) > k)
    return jax.lax.cond(beyond, with_ties_beyond, lambda: first(reaching))


# A per-row top-k looks among the blocks holding each row's 256 largest entries (at most
# a 64th of the row) when every row's k is that small.
_TOP_K_CANDIDATES = 256


def top_k_cut(x, k, bound: int | None = None, normalise=None):
    """Top-k's cut-off, the `k`-th largest value of each row of `x` `(..., V)`
    (`(..., 1)`; exact, ties included), for `k` `(..., 1)` in `[0, V]` (0 keeps every
    token; its cut-off is then the largest value, unused): among the blocks holding each
    row's `C` largest entries (`_top_blocks`) when every `k` is at most `C`, else by the
    search over whole rows. `bound`: a Python int known to bound every `k` (a static
    top-k), used as `C`; by default `C` = min(256, V / 64), and a branch on the `k`s
    picks the search.

    With `normalise = (scale, highest)`, also the normaliser of what top-k keeps, as
    `log_normaliser` gives it for `x / scale`: `(kth, (shift, log_sum))`, else
    `(kth, None)`. Where every row's `k` is between 1 and `C`, every kept entry above
    the `C`-th largest block maximum lies among the candidate blocks, and any other kept
    entry equals the cut-off: the sum of exponentials runs over those `16 C` entries,
    not over the row, with the cut-off's ties outside them counted (a pass of
    comparisons over the rows, taken only in a batch where some row left tied blocks
    out). Otherwise the sum runs over whole rows.
    """
    shape = x.shape[:-1] + (1,)
    count = bound or min(_TOP_K_CANDIDATES, x.shape[-1] // (4 * _LANES))
    found = _top_blocks(x, count)

    def whole_rows_kth():
        goal = jnp.maximum(k, 1)
        return key_values(largest_reaching(order_keys(x), None, goal), x.dtype)

    def whole_rows_normaliser(kth):
        scale, highest = normalise
        return log_normaliser(x / scale, highest, (x < kth) & (k > 0))

    if found is None:
        kth = whole_rows_kth()
        return kth, None if normalise is None else whole_rows_normaliser(kth)
    candidates, _, left_out = found
    goal = jnp.broadcast_to(jnp.maximum(k, 1), shape).reshape(-1, 1)

    def inside_kth():
        kth = largest_reaching(order_keys(candidates), None, goal)
        return key_values(kth, x.dtype).reshape(shape)

    def inside_normaliser(kth):
        # The candidates hold every kept entry above m; a kept entry outside them
        # equals the cut-off, which then equals m, in a block with the maximum m that
        # was not taken: counted by one pass over the rows, in the rare batches where
        # a row left such blocks out (exact ties between block maxima).
        divisor, highest = (
            jnp.broadcast_to(a, shape).reshape(-1, 1) for a in normalise
        )
        kth = kth.reshape(-1, 1)
        shift = _shift(highest)
        terms = jnp.where(candidates < kth, 0, jnp.exp(candidates / divisor - shift))
        total = jnp.sum(terms, axis=-1, keepdims=True)

        def with_ties_outside():
            rows = x.reshape(-1, x.shape[-1])
            outside = count_equal(rows, kth) - count_equal(candidates, kth)
            tie = jnp.exp(kth / divisor - shift)
            return total + jnp.where(outside > 0, outside * tie, 0)

        total = jax.lax.cond(jnp.any(left_out), with_ties_outside, lambda: total)
        return shift.reshape(shape), jnp.log(total).reshape(shape)

    if bound is not None:  # a static k, at least 1
        kth = inside_kth()
        return kth, None if normalise is None else inside_normaliser(kth)
    kth = jax.lax.cond(jnp.all(k <= count), inside_kth, whole_rows_kth)
    if normalise is None:
        return kth, None
    # Every kept entry is a candidate when every row keeps at most C (and at least 1).
    within = jnp.all((k >= 1) & (k <= count))
    normaliser = jax.lax.cond(within, inside_normaliser, whole_rows_normaliser, kth)
    return kth, normaliser


# Top-p first looks among the blocks holding the largest entries of each row: up to
# 1,024 of them, a 64th of the row.
_TOP_P_CANDIDATES = 1024


def top_p_cutoff(x, scale, highest, log_sum, top_p):
    """The smallest logit of `x` that top-p keeps, and the mass it keeps (both
    `(..., 1)`; exact, ties included): the largest logit whose mass at or above it
    reaches `top_p`, each entry's mass being `exp((x / scale - highest) - log_sum)`
    (`highest`, `log_sum`: `log_normaliser`'s of `x / scale`). The search runs over
    the logits: `x / scale` enters only the masses (see `_warp_rows`).

    The blocks holding each row's `C` largest entries (`C` = min(1024, V / 64)) hold
    every entry above their least block maximum $m$. When those entries reach `top_p` in
    every row (the common case: serving distributions keep tens to hundreds of tokens),
    the cut-off is above $m$, where the candidates' masses are the row's, and the search
    runs over the candidates; otherwise over whole rows."""
    shape = x.shape[:-1] + (1,)

    def kept(keys, weights, cutoff):
        (mass,) = _row_reduce((jnp.where(keys >= cutoff, weights, 0),), (0,), _add)
        return mass

    def whole_rows():
        keys, weights = order_keys(x), jnp.exp((x / scale - highest) - log_sum)
        cutoff = largest_reaching(keys, weights, top_p)
        return cutoff, kept(keys, weights, cutoff)

    count = min(_TOP_P_CANDIDATES, x.shape[-1] // (4 * _LANES))
    found = _top_blocks(x, count)
    if found is None:
        cutoff, mass = whole_rows()
    else:
        candidates, m, _ = found
        goal = jnp.broadcast_to(top_p, shape).reshape(-1, 1)
        divisor, shift, norm = (
            jnp.broadcast_to(a, shape).reshape(-1, 1) for a in (scale, highest, log_sum)
        )
        keys = order_keys(candidates)
        weights = jnp.exp((candidates / divisor - shift) - norm)
        # Every entry of the row above m is a candidate: where their mass reaches
        # top_p, the cut-off is above m, and the candidates' masses there are the row's.
        (above,) = _row_reduce((jnp.where(candidates > m, weights, 0),), (0,), _add)

        def inside():
            bracket = _bracket(candidates, weights, goal)
            cutoff = largest_reaching(keys, weights, goal, bracket)
            return cutoff.reshape(shape), kept(keys, weights, cutoff).reshape(shape)

        cutoff, mass = jax.lax.cond(jnp.all(above >= goal), inside, whole_rows)
    return key_values(cutoff, x.dtype), mass


def _bracket(candidates, weights, goal):
    """Keys between which top-p's cut-off lies, from the candidate blocks' maxima, for
    rows whose entries above the least of them reach `goal` (where it lies above it):
    the mass at or above a value $t$ is at least that of the block maxima at or above
    it and at most that of the blocks whose maximum is (every entry at or above $t$ is
    in one). Two searches over the blocks' maxima, a 16th of the candidates; the search
    over the candidates then runs between them."""
    blocks = candidates.shape[:-1] + (-1, _LANES)
    block_keys = order_keys(jnp.max(candidates.reshape(blocks), axis=-1))
    block_weights = weights.reshape(blocks)
    lower = largest_reaching(block_keys, jnp.max(block_weights, axis=-1), goal)
    upper = largest_reaching(block_keys, jnp.sum(block_weights, axis=-1), goal)
    return lower, upper


def _add(x, y):
    return (x[0] + y[0],)
