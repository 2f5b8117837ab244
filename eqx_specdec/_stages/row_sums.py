"""The sums of rows n that the entry points' default input checks read, and the one
pass that computes them."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._custom_types import IntScalar
from .._misc import compute_dtype
from .._search import block_size, block_sums
from .._warps.warp import NormalisedRows


class RowSums(eqx.Module):
    """What the default input checks need of rows n of one row's distributions.

    **Fields:**

    - `p_total`: the sum of $p_n$, with any negative entry counted as NaN: finite and
        within tolerance of 1 exactly when the row is a valid distribution.
    - `q_total`: the same of $q_{\\min(n, G - 1)}$ (1 for one-hot drafts).

    Build it with `row_sums` or, in a pass of your own,
    `jnp.sum(jnp.where(row >= 0, row, jnp.nan))` for each row.
    """

    p_total: Float[Array, ""]
    q_total: Float[Array, ""]


class RowsN(eqx.Module):
    """What a residual sampler's pass over rows n gives (`rows_n_pass`), for one row or
    with a leading batch axis: the block totals of the weights it draws from (the
    residual where a draft token was rejected, else $p_n$), those of $p_n$ (its
    zero-mass fallback; with the checks' sums asked for, negative entries counted as
    NaN), and the sum of $q_n$ so counted (`None` for one-hot drafts, or when the sums
    were not asked for); and where the rows are normalised warped rows of logits
    (`NormalisedRows`), those rows (`p_rows`, `q_rows`, else `None`), from which the
    draw evaluates the one block it reads again (rather than slicing it from rows
    evaluated whole, which under `vmap` XLA writes out in full). `by_kernel`: the pass
    was the Pallas kernel's, and the draw's window of each row n is copied by the
    window kernel (`row_window`) too.
    """

    totals: Float[Array, "*batch blocks"]
    p_totals: Float[Array, "*batch blocks"]
    q_total: Float[Array, "*batch"] | None
    p_rows: NormalisedRows | None = None
    q_rows: NormalisedRows | None = None
    by_kernel: bool = eqx.field(static=True, default=False)


def summed(p_row, q_row) -> tuple:
    """The arrays whose sums make up a `RowSums`: each row with its negative entries
    (and NaNs) as NaN. Two operands beside the sampler's own keep the fused reduction
    as fast as one sum on XLA CPU (four more made it 30% slower)."""
    arrays = (jnp.where(p_row >= 0, p_row, jnp.nan),)
    if q_row is not None:
        arrays += (jnp.where(q_row >= 0, q_row, jnp.nan),)
    return arrays


def as_row_sums(dtype, block_totals_of_summed: tuple) -> RowSums:
    sums = tuple(jnp.sum(x) for x in block_totals_of_summed)
    if len(sums) == 1:  # one-hot draft
        sums += (jnp.ones((), dtype),)
    return RowSums(*sums)


def row_sums(
    num_accepted: IntScalar,
    draft_probs: Float[Array, "G V"] | None,
    target_probs: Float[Array, "rows V"],
) -> RowSums:
    """The [`eqx_specdec.RowSums`][] of one row, in one pass over rows n (a single
    variadic reduction).

    **Arguments:**

    - `num_accepted`: int32 scalar $n$.
    - `draft_probs`: float `(G, V)`, or `None` for one-hot drafts.
    - `target_probs`: float `(G + 1, V)`.

    **Returns:**

    The [`eqx_specdec.RowSums`][].
    """
    gamma, vocab = target_probs.shape[0] - 1, target_probs.shape[1]
    dtypes = [target_probs.dtype] + ([] if draft_probs is None else [draft_probs.dtype])
    dtype = compute_dtype(*dtypes)
    p_row = target_probs[num_accepted].astype(dtype)
    q_row = None
    if draft_probs is not None:
        q_row = draft_probs[jnp.minimum(num_accepted, gamma - 1)].astype(dtype)
    return as_row_sums(dtype, block_sums(summed(p_row, q_row), block_size(vocab)))
