import abc

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Float, Int, jaxtyped

from .._custom_types import (
    DraftProbsRow,
    DraftTokensRow,
    IntScalar,
    SampleUniform,
    TargetProbsRow,
)
from .._misc import compute_dtype
from .verdict import Verdict


def inverse_cdf(
    weights: Float[Array, " vocab"], uniform: Float[Array, ""]
) -> Int[Array, ""]:
    """Draws from `weights / sum(weights)` with one uniform: the smallest $v$ whose
    cumulative sum exceeds `uniform * sum(weights)`.

    If rounding leaves every cumulative sum at or below that threshold (a uniform just
    under 1), returns the last token with positive weight, never `vocab` and never a
    zero-weight token. `weights` must be non-negative with a positive sum.
    """
    cumulative = jnp.cumsum(weights)
    threshold = uniform.astype(weights.dtype) * cumulative[-1]
    # The first v with cumulative[v] > threshold has weights[v] > 0: the sum just rose.
    token = jnp.sum(cumulative <= threshold, dtype=jnp.int32)
    vocab = weights.shape[0]
    last_positive = vocab - 1 - jnp.argmax(weights[::-1] > 0).astype(jnp.int32)
    return jnp.where(token < vocab, token, last_positive)


def residual_weights(
    num_accepted: IntScalar,
    verdict: Verdict,
    draft_tokens: DraftTokensRow,
    draft_probs: DraftProbsRow | None,
    target_probs: TargetProbsRow,
) -> Float[Array, " vocab"]:
    """The unnormalised distribution the correction token is drawn from, for one row.

    $(c_n p_n - q_n)_+$ when $n < \\gamma$ (with $c_n$ the verdict's residual scale),
    $p_\\gamma$ when $n = \\gamma$, and $p_n$ when the residual has no mass (p and q equal
    up to rounding). Only rows $n$ of `target_probs` and `draft_probs` are read.
    """
    gamma, vocab = target_probs.shape[0] - 1, target_probs.shape[1]
    if draft_probs is None:
        dtype = compute_dtype(target_probs.dtype, verdict.residual_scale.dtype)
    else:
        dtype = compute_dtype(
            target_probs.dtype, draft_probs.dtype, verdict.residual_scale.dtype
        )
    n = num_accepted.astype(jnp.int32)
    rejected_at = jnp.minimum(n, gamma - 1)
    p = target_probs[n].astype(dtype)
    if draft_probs is None:
        vocab_ids = jnp.arange(vocab, dtype=jnp.int32)
        q = (vocab_ids == draft_tokens[rejected_at].astype(jnp.int32)).astype(dtype)
    else:
        q = draft_probs[rejected_at].astype(dtype)
    scale = verdict.residual_scale[rejected_at].astype(dtype)
    residual = jnp.maximum(scale * p - q, 0)
    # Below the smallest normal number the mass is rounding noise (or flushed to zero).
    has_mass = jnp.sum(residual) > jnp.finfo(dtype).tiny
    return jnp.where((n < gamma) & has_mass, residual, p)


class AbstractResidualSampler(eqx.Module):
    """Draws the correction token $y$ of one row, given the number accepted.

    When $n < \\gamma$ the draft token at position $n$ was rejected and $y$ must follow the
    residual distribution that makes the step lossless; when $n = \\gamma$ every draft token
    was accepted and $y$ is the bonus token, drawn from $p_\\gamma$.
    """

    @abc.abstractmethod
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleUniform,
    ) -> IntScalar:
        """Draws the correction token of one row.

        **Arguments:**

        - `num_accepted`: int32 scalar $n$, from the prefix counter.
        - `verdict`: the [`eqx_specdec.Verdict`][] of the ratio test.
        - `draft_tokens`: integer of shape `(gamma,)`.
        - `draft_probs`: float of shape `(gamma, vocab)`, or `None` for one-hot drafts.
        - `target_probs`: float of shape `(gamma + 1, vocab)`.
        - `sample_uniform`: float scalar $s \\in [0, 1)$.

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
    residual scale (1 for the standard rule, so $r = \\operatorname{norm}((p_n - q_n)_+)$),
    and $q_n = \\mathrm{onehot}(x_n)$ when `draft_probs` is `None`.

    If the residual has no mass ($p_n$ and $q_n$ equal up to rounding), $y$ is drawn from
    $p_n$. If rounding leaves the final cumulative sum at or below $s$, $y$ is the last
    token with positive mass. Reads only rows $n$ of the distributions: $O(\\text{vocab})$.
    """

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
        weights = residual_weights(
            num_accepted, verdict, draft_tokens, draft_probs, target_probs
        )
        return inverse_cdf(weights, sample_uniform)
