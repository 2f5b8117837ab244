"""How a stage reads one row's distributions: in which space the values are (set by the
entry point from the input's type) and over which part of the vocabulary (all of it, or
one device's slice inside [`eqx_specdec.ShardedVerifier`][])."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Integer

from .._misc import compute_dtype
from .._search import first_argmax
from .vocab_shard import VocabShard


class RowContext(eqx.Module):
    """What a ratio test or residual sampler is told about the rows it receives, and the
    reductions over the vocabulary it writes its rule with.

    The entry points build it; a stage never stores it. Its two facts:

    - the values' space: probabilities, or log-probabilities when the caller gave
        logits ([`eqx_specdec.Logits`][], warped to log-probabilities before the stages
        run). The library's stages work on either;
        [`eqx_specdec.RowContext.gather`][] returns values in the rows' space and
        [`eqx_specdec.RowContext.probabilities`][] converts a row to probabilities.
    - the part of the vocabulary: the whole of it (`shard=None`), or one device's slice
        inside [`eqx_specdec.ShardedVerifier`][] with a vocabulary axis. A stage whose
        `__call__` reduces over the vocabulary only through the methods below (`gather`,
        `sum`, `argmax`, `token_ids`) runs unchanged on a slice, and declares
        `vocab_parallel = True`.

    **Fields:**

    - `log_space`: whether the rows hold log-probabilities (static). Default `False`.
    - `shard`: the [`eqx_specdec.VocabShard`][] this device holds, or `None` (the
        default) for the whole vocabulary.
    """

    log_space: bool = eqx.field(static=True, default=False)
    shard: VocabShard | None = None
    # This row's draft tokens' values, gathered with the whole batch's by the mapping,
    # and the row's arrays they were gathered from: `gather` returns them when asked for
    # exactly those arrays (the same objects), and gathers them itself otherwise.
    _taken: tuple | None = None
    # What the sampler's pass over rows n gave for this row (`RowsN`), run with the
    # whole batch's, and the arrays it read them from, likewise.
    _rows_n: tuple | None = None
    # This row's argmaxes from the ratio test's `argmax_pass` over the batch, and the
    # target rows they were found in, likewise.
    _argmax: tuple | None = None

    def with_taken(self, draft_tokens, draft_probs, target_probs, values):
        """This context with `values`, `(p_x, q_x)` (`q_x` `None` for one-hot drafts),
        the draft tokens' values of this row, read from the arrays given."""
        taken = (draft_tokens, draft_probs, target_probs, values)
        return eqx.tree_at(lambda c: c._taken, self, taken, is_leaf=_none)

    def with_rows_n(self, draft_tokens, draft_probs, target_probs, rows_n):
        """This context with `rows_n`, what the sampler's pass over rows n gave for this
        row, read from the arrays given."""
        read = (draft_tokens, draft_probs, target_probs, rows_n)
        return eqx.tree_at(lambda c: c._rows_n, self, read, is_leaf=_none)

    def with_argmax(self, target_probs, argmaxes):
        """This context with `argmaxes`, `(G + 1,)`, what the ratio test's
        `argmax_pass` gave for this row's `target_probs`: `argmax` returns them when
        asked for exactly those rows."""
        read = (target_probs, argmaxes)
        return eqx.tree_at(lambda c: c._argmax, self, read, is_leaf=_none)

    def rows_n(self, draft_tokens, draft_probs, target_probs):
        """What the sampler's `rows_n_pass` gave for this row, run with the whole
        batch's (see [`eqx_specdec.AbstractResidualSampler`][]), if this row's arrays
        are those it read (the same objects); else `None`, and the sampler reads its
        rows n itself."""
        return _read_from(self._rows_n, (draft_tokens, draft_probs, target_probs))

    @property
    def first_id(self) -> Int[Array, ""] | int:
        """The global id of the rows' first entry (0 without a shard)."""
        return 0 if self.shard is None else self.shard.offset

    def token_ids(self, width: int) -> Int[Array, " width"]:
        """The global ids of the rows' `width` entries."""
        return self.first_id + jnp.arange(width, dtype=jnp.int32)

    def sum(self, x):
        """`x`, a value already reduced over the rows' entries, summed over the
        vocabulary's shards (itself without a shard)."""
        return x if self.shard is None else self.shard.sum(x)

    def argmax(self, values: Float[Array, "*rows width"]) -> Int[Array, "*rows"]:
        """The global argmax over the vocabulary (lowest id on ties), int32. Over the
        whole vocabulary, a row without a finite most likely entry (one holding a NaN or
        $+\\infty$, or without mass: every entry $-\\infty$ in log space, none
        positive in probabilities) gives `width`, no token id. Under a ratio test's
        `argmax_pass` (greedy verification on a TPU), the rows after the first whose
        argmax is not its draft token are never read and give `width` too."""
        if self._argmax is not None and self._argmax[0] is values:
            return self._argmax[1]
        if self.shard is None:
            return first_argmax(values, self.log_space)
        return self.shard.argmax(values)

    def times(self, values: Float[Array, "*shape"], factor) -> Float[Array, "*shape"]:
        """`values` scaled by a positive `factor`, in the rows' space: `values * factor`
        on probabilities, `values + log(factor)` on log-probabilities (what a threshold
        rule's acceptance writes, such as $t = c\\,p$)."""
        factor = jnp.asarray(factor, values.dtype)
        return values + jnp.log(factor) if self.log_space else values * factor

    def probabilities(self, rows: Float[Array, "*rows width"]) -> Float[Array, "..."]:
        """`rows` as probabilities in their compute dtype (at least float32):
        exponentiated when they hold log-probabilities."""
        rows = rows.astype(compute_dtype(rows.dtype))
        return jnp.exp(rows) if self.log_space else rows

    def gather(
        self,
        draft_tokens: Integer[Array, " G"],
        draft_probs: Float[Array, "G width"] | None,
        target_probs: Float[Array, "G+1 width"],
    ) -> tuple[Float[Array, " G"], Float[Array, " G"]]:
        """$p_i(x_i)$ and $q_i(x_i)$ at every draft position of one row, in the rows'
        space and compute dtype (at least float32). For one-hot drafts
        (`draft_probs=None`), $q_i(x_i) = 1$ (0 in log space).

        **Arguments:** one row, as a ratio test receives it.

        **Returns:** `(p_x, q_x)`, two float arrays of shape `(G,)`.
        """
        dtypes = [target_probs.dtype]
        if draft_probs is not None:
            dtypes.append(draft_probs.dtype)
        dtype = compute_dtype(*dtypes)
        gamma = draft_tokens.shape[0]
        taken = _read_from(self._taken, (draft_tokens, draft_probs, target_probs))
        if taken is not None:
            p_x, q_x = (x if x is None else x.astype(dtype) for x in taken)
        else:
            p_x = self._take(target_probs[:gamma], draft_tokens, dtype)
            q_x = (
                None
                if draft_probs is None
                else self._take(draft_probs, draft_tokens, dtype)
            )
        if draft_probs is None:
            return p_x, jnp.full(p_x.shape, 0.0 if self.log_space else 1.0, dtype)
        return p_x, q_x

    def _take(self, rows, tokens, dtype):
        if self.shard is not None:
            return self.shard.take(rows, tokens, dtype)
        index = tokens.astype(jnp.int32)[:, None]
        return jnp.take_along_axis(rows, index, axis=1)[:, 0].astype(dtype)


def _none(x) -> bool:
    return x is None


def _read_from(read, arrays):
    """`read`'s values if it was read from `arrays` (the same objects), else `None`."""
    if read is None or not all(a is b for a, b in zip(read[:3], arrays)):
        return None
    return read[3]


ONE_DEVICE = RowContext()
"""Probabilities over the whole vocabulary: the context a stage called directly gets."""
