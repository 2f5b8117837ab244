"""The standard correction drawn with the Gumbel-max trick from a key."""

from typing import ClassVar

import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, jaxtyped, Key

from .._custom_types import (
    DraftProbsRow,
    DraftTokensRow,
    IntScalar,
    TargetProbsRow,
)
from .._search import finite_or_invalid
from .residual_sampler import (
    AbstractResidualSampler,
    full_weights,
    Randomness,
    Reads,
    residual_parts,
)
from .row_context import ONE_DEVICE, RowContext
from .verdict import Verdict


class GumbelSampler(AbstractResidualSampler):
    """The standard correction (same distribution as [`eqx_specdec.ResidualSampler`][]),
    drawn with the Gumbel-max trick from a `jax.random` key:

    $$y = \\arg\\max_v \\big(\\log r(v) + g_v\\big), \\qquad g_v \\sim \\mathrm{Gumbel}(0, 1)
    \\text{ i.i.d.}$$

    Needs one key per row (`randomness = "key"`) and $V$ Gumbel draws. The Gumbel noise is
    drawn with `mode="high"`: in float32 the default mode never exceeds about 15.9, so a
    token more than about 16 nats below the best could never be picked; the high mode
    removes that cap. Zero-weight tokens are never picked. It has no
    `quadrature_breakpoints` (it draws from keys, not uniforms): evaluate it by Monte
    Carlo, or evaluate [`eqx_specdec.ResidualSampler`][], which draws the same
    distribution from a uniform, by quadrature.
    """

    randomness: ClassVar[Randomness] = "key"
    draws: ClassVar[str] = "residual"
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
        sample_uniform: Key[Array, ""],
        context: RowContext = ONE_DEVICE,
    ) -> IntScalar:
        gamma, vocab = target_probs.shape[0] - 1, target_probs.shape[1]
        dtype, p_and_residual = residual_parts(
            num_accepted, verdict, draft_tokens, draft_probs, target_probs, context
        )
        weights = full_weights(p_and_residual, vocab, num_accepted < gamma, dtype)
        noise = jax.random.gumbel(sample_uniform, (vocab,), dtype, mode="high")
        scores = jnp.where(weights > 0, jnp.log(weights) + noise, -jnp.inf)
        # -1 from a row holding a NaN or an infinity (with the input checks off).
        return finite_or_invalid(jnp.argmax(scores), jnp.sum(weights))
