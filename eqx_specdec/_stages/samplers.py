import abc
import math
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Bool, Float, Int, jaxtyped, Key

from .._custom_types import (
    DraftProbsRow,
    DraftTokensRow,
    IntScalar,
    SampleRandomness,
    SampleUniform,
    TargetProbsRow,
)
from .._misc import compute_dtype
from .ratio_tests import check_typical, typical_threshold
from .verdict import Verdict


def block_size(vocab: int) -> int:
    """The block length of the two-level search: a power of two near $\\sqrt{V}$, so that
    both the scan over block totals and the scan inside one block are short."""
    return min(1 << max(0, round(math.log2(math.sqrt(vocab)))), vocab)


def block_totals(weights: Float[Array, " vocab"], size: int) -> Float[Array, " blocks"]:
    """Sums of consecutive blocks of `size` weights (the last block may be shorter)."""
    vocab = weights.shape[0]
    full = vocab // size
    totals = jnp.sum(weights[: full * size].reshape(full, size), axis=1)
    if vocab % size:
        totals = jnp.append(totals, jnp.sum(weights[full * size :]))
    return totals


def window_start(block: Int[Array, ""], size: int, vocab: int) -> Int[Array, ""]:
    """Where the `size`-long window holding block `block` starts: a last, shorter block
    is read through a window shifted left so that it stays inside the vocabulary."""
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
    (unless every weight is zero, when it returns a token of the first block).
    """
    cumulative = jnp.cumsum(totals)
    if threshold is None:
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
    return start + guarded_search(before + jnp.cumsum(weights), weights > 0, threshold)


def flat_search(
    weights: Float[Array, " vocab"],
    uniform: Float[Array, ""] | None,
    threshold: Float[Array, ""] | None = None,
) -> Int[Array, ""]:
    """Inverse CDF with one full-length cumulative sum: fewer operations than
    `two_level_search`, so faster for small vocabularies. Same guard: never `vocab`, never
    a zero-weight token. Same `threshold` option."""
    cumulative = jnp.cumsum(weights)
    if threshold is None:
        threshold = uniform.astype(weights.dtype) * cumulative[-1]
    return guarded_search(cumulative, weights > 0, threshold)


# Below this vocabulary size a single cumulative sum beats the two-level search.
FLAT_SEARCH_MAX_VOCAB = 32


def inverse_cdf(
    weights: Float[Array, " vocab"],
    uniform: Float[Array, ""] | None,
    threshold: Float[Array, ""] | None = None,
) -> Int[Array, ""]:
    """Draws from `weights / sum(weights)` with one uniform: the smallest $v$ whose
    cumulative sum exceeds `uniform * sum(weights)`, by `two_level_search`.

    If rounding leaves every cumulative sum at or below that threshold (a uniform just
    under 1), returns the last token with positive weight, never `vocab` and never a
    zero-weight token. `weights` must be non-negative with a positive sum. With
    `threshold` instead of `uniform`, the smallest $v$ whose cumulative sum exceeds it.
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


def residual_parts(
    num_accepted: IntScalar,
    verdict: Verdict,
    draft_tokens: DraftTokensRow,
    draft_probs: DraftProbsRow | None,
    target_probs: TargetProbsRow,
    log_space: bool,
):
    """What every residual-based sampler needs for one row.

    Returns `(dtype, p_and_residual)`: the compute dtype, and a function of
    `(start, length)` giving that slice of $p_n$ and of the residual
    $(c_n p_n - q_n)_+$ (as probabilities). Only rows $n$ of the distributions are read;
    $q_n = \\mathrm{onehot}(x_n)$ is never materialised for one-hot drafts.
    """
    gamma = target_probs.shape[0] - 1
    dtypes = [target_probs.dtype, verdict.residual_scale.dtype]
    if draft_probs is not None:
        dtypes.append(draft_probs.dtype)
    dtype = compute_dtype(*dtypes)
    n = num_accepted.astype(jnp.int32)
    rejected_at = jnp.minimum(n, gamma - 1)
    p = target_probs[n]
    q = None if draft_probs is None else draft_probs[rejected_at]
    draft_token = draft_tokens[rejected_at].astype(jnp.int32)
    scale = verdict.residual_scale[rejected_at].astype(dtype)

    def as_probs(x):
        x = x.astype(dtype)
        return jnp.exp(x) if log_space else x

    def p_and_residual(start, length):
        p_part = as_probs(jax.lax.dynamic_slice_in_dim(p, start, length))
        if q is None:  # one-hot draft
            ids = start + jnp.arange(length, dtype=jnp.int32)
            q_part = (ids == draft_token).astype(dtype)
        else:
            q_part = as_probs(jax.lax.dynamic_slice_in_dim(q, start, length))
        return p_part, jnp.maximum(scale * p_part - q_part, 0)

    return dtype, p_and_residual


def has_mass(total, dtype):
    # Below the smallest normal number the mass is rounding noise (or flushed to zero).
    return total > jnp.finfo(dtype).tiny


def full_weights(p_and_residual, vocab, rejected, dtype):
    """The whole correction distribution, unnormalised: the residual when a draft token
    was rejected and it has mass, else $p_n$ (the bonus row, or the zero-mass fallback)."""
    p_full, residual_full = p_and_residual(0, vocab)
    use_residual = rejected & has_mass(jnp.sum(residual_full), dtype)
    return jnp.where(use_residual, residual_full, p_full)


class AbstractResidualSampler(eqx.Module):
    """Draws the correction token $y$ of one row, given the number accepted.

    When $n < \\gamma$ the draft token at position $n$ was rejected and $y$ must follow the
    residual distribution that makes the step lossless; when $n = \\gamma$ every draft token
    was accepted and $y$ is the bonus token, drawn from $p_\\gamma$.

    The class attribute `randomness` says what the last argument holds: `"uniform"` (a
    float $s \\in [0, 1)$, the default), `"key"` (a `jax.random` key, one per row) or
    `"none"` (the sampler is deterministic; the entry points then accept
    `sample_uniforms=None`).
    """

    randomness: ClassVar[str] = "uniform"

    @abc.abstractmethod
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleRandomness,
    ) -> IntScalar:
        """Draws the correction token of one row.

        **Arguments:**

        - `num_accepted`: int32 scalar $n$, from the prefix counter.
        - `verdict`: the [`eqx_specdec.Verdict`][] of the ratio test.
        - `draft_tokens`: integer of shape `(gamma,)`.
        - `draft_probs`: float of shape `(gamma, vocab)`, or `None` for one-hot drafts.
        - `target_probs`: float of shape `(gamma + 1, vocab)`.
        - `sample_uniform`: the row's randomness, as `randomness` says: a float scalar
            $s \\in [0, 1)$, a `jax.random` key, or a float scalar to ignore.

        **Returns:**

        An int32 scalar $y \\in [0, \\text{vocab})$.
        """


class ResidualSampler(AbstractResidualSampler):
    """The standard correction: $y$ is drawn by inverse CDF from

    $$r = \\begin{cases}
    \\operatorname{norm}\\big((c_n\\, p_n - q_n)_+\\big) & n < \\gamma \\\\
    p_\\gamma & n = \\gamma
    \\end{cases}$$

    as the smallest $v$ with $r(0) + \\dots + r(v) > s$. Here $c_n$ is the verdict's
    residual scale (1 for the standard rule), and $q_n = \\mathrm{onehot}(x_n)$ when
    `draft_probs` is `None`.

    If the residual has no mass ($p_n$ and $q_n$ equal up to rounding), $y$ is drawn from
    $p_n$. If rounding leaves the final cumulative sum at or below $s$, $y$ is the last
    token with positive mass. Reads only rows $n$ of the distributions, once, plus one
    block of them again: a two-level search (block totals, then one block) replaces the
    full-length cumulative sum.

    **Arguments:**

    - `log_space`: if `True`, the distributions given are log-probabilities.
    """

    log_space: bool = eqx.field(static=True, default=False)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleUniform,
    ) -> IntScalar:
        gamma, vocab = target_probs.shape[0] - 1, target_probs.shape[1]
        dtype, p_and_residual = residual_parts(
            num_accepted, verdict, draft_tokens, draft_probs, target_probs,
            self.log_space,
        )  # fmt: skip
        size = block_size(vocab)
        rejected = num_accepted < gamma

        if vocab <= FLAT_SEARCH_MAX_VOCAB:
            weights = full_weights(p_and_residual, vocab, rejected, dtype)
            return flat_search(weights, sample_uniform)

        def weights(start, length, use_residual):
            p_part, residual_part = p_and_residual(start, length)
            return jnp.where(use_residual, residual_part, p_part)

        # One pass over rows n of p and q: the block totals of the residual (or of the
        # bonus row p_gamma when every draft token was accepted).
        totals = block_totals(weights(0, vocab, rejected), size)
        use_residual = rejected & has_mass(jnp.sum(totals), dtype)
        # Rare: no residual mass (p and q equal up to rounding), so draw from p_n. A real
        # branch when rows are mapped one by one; a select under vmap.
        totals = jax.lax.cond(
            use_residual == rejected,
            lambda: totals,
            lambda: block_totals(weights(0, vocab, False), size),
        )

        def window(block):
            return weights(window_start(block, size, vocab), size, use_residual)

        return two_level_search(totals, window, sample_uniform, vocab)


class GumbelSampler(AbstractResidualSampler):
    """The standard correction (same distribution as [`eqx_specdec.ResidualSampler`][]),
    drawn with the Gumbel-max trick from a `jax.random` key:

    $$y = \\arg\\max_v \\big(\\log r(v) + g_v\\big), \\qquad g_v \\sim \\mathrm{Gumbel}(0, 1)
    \\text{ i.i.d.}$$

    Needs one key per row (`randomness = "key"`) and $V$ Gumbel draws. The Gumbel noise is
    drawn with `mode="high"`: in float32 the default mode never exceeds about 15.9, so a
    token more than about 16 nats below the best could never be picked; the high mode
    removes that cap. Zero-weight tokens are never picked.

    **Arguments:**

    - `log_space`: if `True`, the distributions given are log-probabilities.
    """

    randomness: ClassVar[str] = "key"
    log_space: bool = eqx.field(static=True, default=False)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: Key[Array, ""],
    ) -> IntScalar:
        gamma, vocab = target_probs.shape[0] - 1, target_probs.shape[1]
        dtype, p_and_residual = residual_parts(
            num_accepted, verdict, draft_tokens, draft_probs, target_probs,
            self.log_space,
        )  # fmt: skip
        weights = full_weights(p_and_residual, vocab, num_accepted < gamma, dtype)
        noise = jax.random.gumbel(sample_uniform, (vocab,), dtype, mode="high")
        scores = jnp.where(weights > 0, jnp.log(weights) + noise, -jnp.inf)
        return jnp.argmax(scores).astype(jnp.int32)


class ArgmaxSampler(AbstractResidualSampler):
    """The greedy correction: $y = \\arg\\max_v p_n(v)$ (ties: the lowest id), the
    target's most likely token at the first rejected position (or the bonus position).

    Deterministic (`randomness = "none"`); reads only row $n$ of `target_probs`. Works on
    probabilities and log-probabilities alike. With [`eqx_specdec.GreedyRatioTest`][] it
    gives greedy verification; with [`eqx_specdec.TypicalRatioTest`][], Medusa's typical
    acceptance.
    """

    randomness: ClassVar[str] = "none"

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleRandomness,
    ) -> IntScalar:
        return jnp.argmax(target_probs[num_accepted]).astype(jnp.int32)


class TypicalSampler(AbstractResidualSampler):
    """Typical acceptance's sampled correction: $y$ is drawn by inverse CDF from $p_n$
    with the tokens under the typical threshold masked out,

    $$r \\propto p_n(v)\\, [\\, p_n(v) > \\min(\\epsilon, \\delta e^{-H(p_n)})\\,].$$

    (If the mask removed every token, $r = p_n$.) **Lossy**, like the test it pairs with,
    [`eqx_specdec.TypicalRatioTest`][]; use the same `epsilon` and `delta`.

    **Arguments:**

    - `epsilon`: the hard threshold $\\epsilon > 0$. Default 0.09.
    - `delta`: the entropy-scaled threshold $\\delta > 0$. Default 0.3.
    - `log_space`: if `True`, the distributions given are log-probabilities.
    """

    epsilon: Float[Array, ""] | float = 0.09
    delta: Float[Array, ""] | float = 0.3
    log_space: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        check_typical(self.epsilon, self.delta)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleUniform,
    ) -> IntScalar:
        probs = target_probs[num_accepted].astype(compute_dtype(target_probs.dtype))
        if self.log_space:
            probs = jnp.exp(probs)
        threshold = typical_threshold(probs, self.epsilon, self.delta)
        masked = jnp.where(probs > threshold, probs, 0)
        weights = jnp.where(has_mass(jnp.sum(masked), probs.dtype), masked, probs)
        return inverse_cdf(weights, sample_uniform)
