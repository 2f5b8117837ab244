"""Residual samplers: the correction token's base, with its capabilities, and the
standard residual sampler."""

import abc
import functools
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from equinox import AbstractClassVar
from jaxtyping import jaxtyped

from .._capabilities import capability
from .._custom_types import (
    DraftProbsRow,
    DraftTokensRow,
    IntScalar,
    SampleRandomness,
    SampleUniform,
    TargetProbsRow,
)
from .._kernels.row_windows import row_window
from .._kernels.rows_n_dma import fits, residual_block_totals
from .._misc import compute_dtype, given_as_arrays
from .._platform import on_tpu, rows_n_apart
from .._search import (
    block_size,
    block_sums,
    flat_search,
    FLAT_SEARCH_MAX_VOCAB,
    has_mass,
    two_level_search,
    window_start,
)
from .._warps.warp import as_logits, NormalisedRows
from .row_context import ONE_DEVICE, RowContext
from .row_sums import row_sums, RowsN, RowSums, summed
from .verdict import Verdict


Randomness = Literal["uniform", "key", "none"]
Reads = Literal["row n", "whole rows"]


def residual_parts(
    num_accepted: IntScalar,
    verdict: Verdict,
    draft_tokens: DraftTokensRow,
    draft_probs: DraftProbsRow | None,
    target_probs: TargetProbsRow,
    context: RowContext,
    *,
    checked: bool = False,
    read: RowsN | None = None,
):
    """What every residual-based sampler needs for one row. `checked`: the caller
    validates rows n in the same pass (the entry points' checks), so an invalid entry of
    $q_n$ need not show in the residual. `read`: the pass over rows n already made for
    the batch (`rows_n_pass`), after which only short slices are asked for, each read
    from the rows given, or from its `p_rows` and `q_rows` where it holds them
    (`NormalisedRows`, whose slices are evaluated alone); under `vmap`, a gather of the
    slices alone, not of the whole rows n, or with its `by_kernel` the window kernel's
    copies (`row_window`).

    Returns `(dtype, p_and_residual)`: the compute dtype, and a function of
    `(start, length)` giving that slice of $p_n$ and of the residual
    $(c_n p_n - q_n)_+$ (for a verdict of a threshold rule, its derived
    $(c_n p_n - \\min(q_n, t_n))_+$) (as probabilities; with `with_q=True`, of $q_n$ between them).
    Only rows $n$ of the distributions are read; $q_n = \\mathrm{onehot}(x_n)$ is never
    materialised for one-hot drafts. The `context` says the rows' space and the global id
    of their first entry (a vocabulary shard's offset).
    """
    gamma = target_probs.shape[0] - 1
    dtypes = [target_probs.dtype, verdict.residual_scale.dtype]
    if draft_probs is not None:
        dtypes.append(draft_probs.dtype)
    dtype = compute_dtype(*dtypes)
    n = num_accepted.astype(jnp.int32)
    rejected_at = jnp.minimum(n, gamma - 1)
    p, q = target_probs, draft_probs
    windows = read is not None
    by_kernel = windows and read.by_kernel
    if windows:
        q = q if read.q_rows is None else read.q_rows
        p = p if read.p_rows is None else read.p_rows
    else:
        p = target_probs[n]
        q = None if draft_probs is None else draft_probs[rejected_at]
    if rows_n_apart(context.log_space):  # evaluated alone, once (see `rows_n_apart`)
        p, q = jax.lax.optimization_barrier((p, q))

    def row_slice(rows, i, start, length):
        if isinstance(rows, NormalisedRows):  # evaluated from its logits' window
            return rows.window(
                i, start, row_window(rows.x, i, start, length, by_kernel)
            )
        if windows:
            return row_window(rows, i, start, length, by_kernel)
        return jax.lax.dynamic_slice_in_dim(rows, start, length)

    draft_token = draft_tokens[rejected_at].astype(jnp.int32)
    scale = verdict.residual_scale[rejected_at].astype(dtype)

    def as_probs(x):
        x = x.astype(dtype)
        return jnp.exp(x) if context.log_space else x

    # A threshold rule's derived correction subtracts the mass it accepted, min(q, t),
    # with t its acceptance on row n (on probabilities); without a rule, q whole.
    rule = verdict.rule
    probabilities = RowContext(shard=context.shard)

    def p_and_residual(start, length, with_q=False):
        p_part = as_probs(row_slice(p, n, start, length))
        if q is None:  # one-hot draft
            ids = context.first_id + start + jnp.arange(length, dtype=jnp.int32)
            q_part = (ids == draft_token).astype(dtype)
        else:
            q_part = as_probs(row_slice(q, rejected_at, start, length))
        if rule is None:
            difference = scale * p_part - q_part
        else:
            t_part = rule.acceptance(p_part, q_part, probabilities).astype(dtype)
            accepted = jnp.minimum(q_part, t_part)
            if not checked:
                # q_n's +inf kept, so that the difference below is -inf.
                accepted = jnp.where(q_part == jnp.inf, q_part, accepted)
            # (A test of q_n's entries beside the checks' sums made XLA CPU copy row n
            # of q for their pass: 2x slower at (64, 5, 128256). The checks catch it.)
            difference = scale * p_part - accepted
        # -inf only from an invalid row (p_n holding -inf, or q_n +inf): NaN, so that
        # the draw from it gives -1 rather than a token the clip would hide (a NaN stays).
        invalid = difference == -jnp.inf
        residual = jnp.where(invalid, jnp.nan, jnp.maximum(difference, 0))
        return (p_part, q_part, residual) if with_q else (p_part, residual)

    return dtype, p_and_residual


def full_weights(p_and_residual, vocab, rejected, dtype):
    """The whole correction distribution, unnormalised: the residual when a draft token
    was rejected and it has mass, else $p_n$ (the bonus row, or the zero-mass fallback)."""
    p_full, residual_full = p_and_residual(0, vocab)
    use_residual = rejected & has_mass(jnp.sum(residual_full), dtype)
    return jnp.where(use_residual, residual_full, p_full)


class AbstractResidualSampler(eqx.Module):
    """Draws the correction token $y$ of one row, given the number accepted.

    When $n < G$ the draft token at position $n$ was rejected and $y$ must follow the
    residual distribution that makes the step lossless; when $n = G$ every draft token
    was accepted and $y$ is the bonus token, drawn from $p_G$.

    **Declared by every subclass:**

    - `randomness` (class attribute): what the last argument holds: `"uniform"` (a float
        $s \\in [0, 1)$), `"key"` (a `jax.random` key, one per row) or `"none"` (the
        sampler is deterministic; the entry points then accept `sample_uniforms=None`).
    - `draws` (class attribute, str): which law the token follows, `"residual"` (an
        exact sample of the residual above: the standard and Gumbel samplers),
        `"argmax"` (its most likely token: greedy decoding), or a name of your own
        (`"typical"`). A ratio test fits the samplers whose `draws` equals its own
        sampler's (see [`eqx_specdec.AbstractRatioTest`][]'s `sampler`); a
        [`eqx_specdec.Verifier`][] refuses a sampler that does not fit an exact test.

    **Capabilities** (their defaults raise [`eqx_specdec.MissingCapabilityError`][]):
    `quadrature_breakpoints` (exact evaluation); `rows_n_pass` (the sampler's pass over
    rows $n$, run for the whole batch between the ratio tests and the draws, where the
    backend rewards it).

    **Declared with a default:**

    - `vocab_parallel` (class attribute, default `False`), as for
        [`eqx_specdec.AbstractRatioTest`][]: `True` when `__call__` reads the
        vocabulary only through its [`eqx_specdec.RowContext`][].
    - `derives` (class attribute, default `False`): `True` when the sampler draws
        from the residual as the verdict forms it, so that a threshold rule's derived
        correction $(p_n - \\min(q_n, t_n))_+$ is what it draws (the standard and
        Gumbel samplers, which build it with the library's `residual_parts`); the
        closed-form evaluation ([`eqx_specdec.evaluation.emission_in_closed_form`][]) applies
        only then.
    - `reads` (class attribute, default `"whole rows"`, always safe): which rows the
        sampler reads, so that the entry points' default checks validate exactly
        those: `"row n"` for a sampler that reads rows $n$ of $p$ and $q$ only (the
        standard one). With `"row n"`, the checks sum those rows through
        `draw_and_sum`, whose default takes one more pass over them; override it to
        compute the sums in the draw's own pass.
    """

    randomness: AbstractClassVar[Randomness]
    draws: AbstractClassVar[str]
    vocab_parallel: ClassVar[bool] = False
    derives: ClassVar[bool] = False
    reads: ClassVar[Reads] = "whole rows"

    @abc.abstractmethod
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleRandomness,
        context: RowContext = ONE_DEVICE,
    ) -> IntScalar:
        """Draws the correction token of one row.

        **Arguments:**

        - `num_accepted`: int32 scalar $n$, from the prefix counter.
        - `verdict`: the [`eqx_specdec.Verdict`][] of the ratio test.
        - `draft_tokens`: integer of shape `(G,)`.
        - `draft_probs`: float of shape `(G, V)`, or `None` for one-hot drafts.
        - `target_probs`: float of shape `(G + 1, V)`.
        - `sample_uniform`: the row's randomness, as `randomness` says: a float scalar
            $s \\in [0, 1)$, a `jax.random` key, or a float scalar to ignore.
        - `context`: the [`eqx_specdec.RowContext`][], as for
            [`eqx_specdec.AbstractRatioTest`][].

        **Returns:**

        An int32 scalar $y \\in [0, \\text{vocab})$.
        """

    @capability
    def quadrature_breakpoints(self, draft_probs, target_probs) -> dict:
        """Capability for exact quadrature: the values of $s$ at which the drawn token
        can change, beyond the cumulative sums of the standard residuals
        $\\operatorname{norm}((p_n - q_n)_+)$ and of $p_G$ (which the quadrature
        always cuts at). NumPy, not traced.

        **Arguments:**

        - `draft_probs`: float64 NumPy `(G, V)`, or `None` for one-hot drafts.
        - `target_probs`: float64 NumPy `(G + 1, V)`.

        **Returns:**

        `{"sample_breakpoints": (K,) array}`, or `{}` if there are none.
        """

    @capability
    def rows_n_pass(
        self,
        num_accepted,
        verdict: Verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        context: RowContext = ONE_DEVICE,
        *,
        checked: bool = False,
        kernel: bool = False,
    ) -> RowsN | None:
        """Capability: the sampler's pass over rows $n$ for the whole batch, which a
        backend runs between the ratio tests and the draws (the verifier's mappings, in
        phases); each row's draw then takes its part from
        [`eqx_specdec.RowContext.rows_n`][] rather than reading its rows n itself.

        **Arguments:** as for `__call__`, each with a leading batch axis (the verdict's
        fields `(B, G)`), but the randomness; `checked`: also the sums the default
        checks read (as `draw_and_sum` returns them); `kernel`: in the backend's kernel
        form where there is one (a Pallas kernel, on the TPU).

        **Returns:** `None` where each row is left to read its own, else a `RowsN`
        with a leading batch axis (the module beside `RowSums`): `totals`, the
        block totals of the weights drawn from; `p_totals`, those of $p_n$ (with
        `checked`, negative entries as NaN); `q_total`, the sum of $q_n$ so counted
        (`None` for one-hot drafts or without `checked`); `p_rows`, `q_rows`, the rows
        themselves where they are normalised warped rows (else `None`), from which the
        draw evaluates the one block it reads again.
        """

    def draw_and_sum(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleRandomness,
        context: RowContext = ONE_DEVICE,
    ) -> tuple[IntScalar, RowSums]:
        """The correction token, as `__call__` draws it, and the sums of rows n that
        the entry points' default checks validate (used when `reads = "row n"`, on
        probabilities over the whole vocabulary).

        The default calls `__call__`, then sums the rows in one more pass; override it
        to compute the sums in the pass the draw already makes, as
        [`eqx_specdec.ResidualSampler`][] does, so that the checks cost nothing.

        **Arguments:** as for `__call__`.

        **Returns:**

        `(y, RowSums(p_total, q_total))`: the token, then the sums of $p_n$ and of
        $q_{\\min(n, G - 1)}$, negative entries counted as NaN (see
        [`eqx_specdec.RowSums`][]).
        """
        inputs = (num_accepted, verdict, draft_tokens, draft_probs, target_probs)
        token = self(*inputs, sample_uniform, context)
        return token, row_sums(num_accepted, draft_probs, target_probs)


class ResidualSampler(AbstractResidualSampler):
    """The standard correction: $y$ is drawn by inverse CDF from

    $$r = \\begin{cases}
    \\operatorname{norm}\\big((c_n\\, p_n - q_n)_+\\big) & n < G \\\\
    p_G & n = G
    \\end{cases}$$

    as the smallest $v$ with $r(0) + \\dots + r(v) > s$. Here $c_n$ is the verdict's
    residual scale (1 for the standard rule), and $q_n = \\mathrm{onehot}(x_n)$ when
    `draft_probs` is `None`.

    If the residual has no mass ($p_n$ and $q_n$ equal up to rounding), $y$ is drawn from
    $p_n$. If rounding leaves the final cumulative sum at or below $s$, $y$ is the last
    token with positive mass. Reads only rows $n$ of the distributions, once, plus one
    block of them again: a two-level search (block totals, then one block) replaces the
    full-length cumulative sum. On a slice of the vocabulary, each device sums its slice
    and one device searches: a pair of scalars per row and device crosses the devices.
    """

    randomness: ClassVar[Randomness] = "uniform"
    draws: ClassVar[str] = "residual"
    vocab_parallel: ClassVar[bool] = True
    derives: ClassVar[bool] = True
    reads: ClassVar[Reads] = "row n"

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleUniform,
        context: RowContext = ONE_DEVICE,
    ) -> IntScalar:
        inputs = (num_accepted, verdict, draft_tokens, draft_probs, target_probs)
        if context.shard is not None:
            return self._draw_on_shards(*inputs, sample_uniform, context)
        return self._draw(*inputs, sample_uniform, context, with_sums=False)[0]

    @jaxtyped(typechecker=beartype)
    def draw_and_sum(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleUniform,
        context: RowContext = ONE_DEVICE,
    ) -> tuple[IntScalar, RowSums]:
        """As the base's, with the sums computed in the draw's own pass over rows n."""
        inputs = (num_accepted, verdict, draft_tokens, draft_probs, target_probs)
        return self._draw(*inputs, sample_uniform, context, with_sums=True)

    def _draw(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample_uniform,
        context,
        *,
        with_sums: bool,
    ):
        """The draw on the whole vocabulary; with `with_sums`, also the sums of rows n
        that the entry points' default checks read, computed in the draw's own pass."""
        gamma, vocab = target_probs.shape[0] - 1, target_probs.shape[1]
        # Rows n already read for the whole batch (`rows_n_pass`).
        read = context.rows_n(draft_tokens, draft_probs, target_probs)
        dtype, p_and_residual = residual_parts(
            num_accepted,
            verdict,
            draft_tokens,
            draft_probs,
            target_probs,
            context,
            checked=with_sums,
            read=read,
        )
        size = block_size(vocab)
        rejected = num_accepted < gamma

        if vocab <= FLAT_SEARCH_MAX_VOCAB:
            weights = full_weights(p_and_residual, vocab, rejected, dtype)
            token = flat_search(weights, sample_uniform)  # -1 for a NaN or inf row
            if not with_sums:
                return token, None
            return token, row_sums(num_accepted, draft_probs, target_probs)

        def weights(start, length, use_residual):
            p_part, residual_part = p_and_residual(start, length)
            return jnp.where(use_residual, residual_part, p_part)

        if read is None:
            one_hot = draft_probs is None
            read = _pass(p_and_residual, vocab, rejected, one_hot, dtype, with_sums)
        totals, p_totals = read.totals, read.p_totals
        sums = None
        if with_sums:
            q_total = jnp.ones((), dtype) if read.q_total is None else read.q_total
            sums = RowSums(jnp.sum(p_totals), q_total)
        use_residual = rejected & has_mass(jnp.sum(totals), dtype)
        # Rare: no residual mass (p and q equal up to rounding), so draw from p_n.
        totals = jnp.where(use_residual == rejected, totals, p_totals)

        def window(block):
            return weights(window_start(block, size, vocab), size, use_residual)

        # -1 when the row holds a NaN or an infinity (its total is not finite).
        return two_level_search(totals, window, sample_uniform, vocab), sums

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}

    def rows_n_pass(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        context=ONE_DEVICE,
        *,
        checked=False,
        kernel=False,
    ):
        """The one pass of `_draw` over rows n, for the batch: with `kernel`, by the
        Pallas kernel reading rows n by DMA (where it fits: float32 probabilities, or
        normalised warped rows of float32 logits, evaluated in the kernel; a rule
        without arrays); else one sequence after another (`jax.lax.scan`), each
        reading its rows n as contiguous slices (on XLA CPU, at (64, 5, 128256) and
        (256, 8, 32000), 1.25x to 1.33x faster a call than the whole verification
        mapped row by row)."""
        vocab = as_logits(target_probs).shape[-1]
        if context.shard is not None or vocab <= FLAT_SEARCH_MAX_VOCAB:
            return None
        rule = verdict.rule
        if kernel:
            arrays = jax.tree_util.tree_leaves(eqx.filter(rule, eqx.is_array))
            if arrays or not fits(draft_probs, target_probs, context.log_space):
                return None
            probabilities = RowContext()
            acceptance = None
            if rule is not None:
                acceptance = functools.partial(rule.acceptance, context=probabilities)
            rows = (target_probs, draft_probs)
            totals, p_totals, q_total = residual_block_totals(
                num_accepted,
                verdict.residual_scale,
                draft_tokens,
                draft_probs,
                target_probs,
                acceptance,
                checked=checked,
                interpret=not on_tpu(),
            )
            normalised = [a if context.log_space else None for a in rows]
            return RowsN(totals, p_totals, q_total, *normalised, by_kernel=True)
        if not given_as_arrays(draft_probs, target_probs):
            return None  # warped rows are evaluated inside each row
        gamma = target_probs.shape[1] - 1
        inputs = (num_accepted, verdict, draft_tokens, draft_probs, target_probs)
        dynamic, static = eqx.partition(inputs, eqx.is_array)

        def one(dynamic, b):  # the batch is the loop's carry, indexed inside
            row = jax.tree.map(lambda a: a[b], dynamic)
            n, verdict, tokens, q, p = eqx.combine(row, static)
            dtype, p_and_residual = residual_parts(
                n, verdict, tokens, q, p, context, checked=checked
            )
            read = _pass(p_and_residual, vocab, n < gamma, q is None, dtype, checked)
            return dynamic, read

        steps = jnp.arange(target_probs.shape[0], dtype=jnp.int32)
        return jax.lax.scan(one, dynamic, steps)[1]

    def _draw_on_shards(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample_uniform,
        context,
    ):
        """The draw when this device holds one slice of the vocabulary."""
        shard = context.shard
        gamma, width = target_probs.shape[0] - 1, target_probs.shape[1]
        dtype, p_and_residual = residual_parts(
            num_accepted, verdict, draft_tokens, draft_probs, target_probs, context
        )
        p_part, residual = p_and_residual(0, width)
        rejected = num_accepted < gamma
        weights = jnp.where(rejected, residual, p_part)
        # One pair of scalars per shard crosses the devices: the shard's mass of the
        # residual (or of p_n, for the bonus token) and of p_n (the zero-mass fallback).
        masses = shard.all_gather(jnp.stack([jnp.sum(weights), jnp.sum(p_part)]))
        use_residual = rejected & has_mass(jnp.sum(masses[:, 0]), dtype)
        shard_masses = jnp.where(use_residual, masses[:, 0], masses[:, 1])
        weights = jnp.where(use_residual, weights, p_part)
        token = shard.draw(weights, sample_uniform, shard_masses)
        # Summed over the shards (a psum, replicated like the token): any shard's
        # non-finite weights make the row invalid.
        invalid = shard.sum((~jnp.isfinite(jnp.sum(weights))).astype(jnp.int32))
        return jnp.where(invalid > 0, -1, token).astype(jnp.int32)


def _pass(p_and_residual, vocab, rejected, one_hot, dtype, checked) -> RowsN:
    """One pass over rows n of p and q, a single variadic reduction: the block totals of
    the residual (or of the bonus row p_gamma when every draft token was accepted),
    those of p_n (the draw's fallback), and with `checked` the sums the input checks
    need (whose p_n, negative entries as NaN, is the fallback's: on a row the checks
    pass, p_n itself)."""
    size = block_size(vocab)
    p_row, q_row, residual_row = p_and_residual(0, vocab, with_q=True)
    weight_row = jnp.where(rejected, residual_row, p_row)
    if not checked:
        totals, p_totals = block_sums((weight_row, p_row), size)
        return RowsN(totals, p_totals, None)
    checks = summed(p_row, None if one_hot else q_row)
    totals, *summed_totals = block_sums((weight_row,) + checks, size)
    q_total = None if one_hot else jnp.sum(summed_totals[1])
    return RowsN(totals, summed_totals[0], q_total)
