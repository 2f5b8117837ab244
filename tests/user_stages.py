"""Stages written the way a research user would: subclasses of the abstract bases."""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

import eqx_specdec


class LenientRatioTest(eqx_specdec.AbstractRatioTest):
    """Accept when `u * l * q(x) < p(x)`; `l = 1` is the standard rule."""

    lenience: Float[Array, ""] | float = 1.0

    def __call__(self, draft_tokens, draft_probs, target_probs, accept_uniforms):
        p = jnp.take_along_axis(target_probs[:-1], draft_tokens[:, None], 1)[:, 0]
        q = jnp.take_along_axis(draft_probs, draft_tokens[:, None], 1)[:, 0]
        lenience = jnp.asarray(self.lenience, p.dtype)
        return eqx_specdec.Verdict(accept_uniforms.astype(p.dtype) * lenience * q < p)


class ArgminPrefixCounter(eqx_specdec.AbstractPrefixCounter):
    """The first failure found with `argmin`, rather than a cumulative product."""

    def __call__(self, passed: Bool[Array, " gamma"]) -> Int[Array, ""]:
        first_failure = jnp.argmin(passed).astype(jnp.int32)
        return jnp.where(jnp.all(passed), passed.shape[0], first_failure)


class SearchsortedSampler(eqx_specdec.AbstractResidualSampler):
    """The standard residual, normalised, searched with `jnp.searchsorted`."""

    def __call__(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample_uniform,
    ):
        gamma = draft_tokens.shape[0]
        n = num_accepted
        p = target_probs[n]
        q = draft_probs[jnp.minimum(n, gamma - 1)]
        residual = jnp.where(n < gamma, jnp.maximum(p - q, 0), p)
        cdf = jnp.cumsum(residual / residual.sum())
        token = jnp.searchsorted(cdf, sample_uniform.astype(cdf.dtype), side="right")
        return jnp.minimum(token, p.shape[0] - 1).astype(jnp.int32)


class ScatterTokenAssembler(eqx_specdec.AbstractTokenAssembler):
    """Writes the output with `.at[].set()` scatters."""

    def __call__(self, num_accepted, draft_tokens, correction):
        gamma = draft_tokens.shape[0]
        position = jnp.arange(gamma, dtype=jnp.int32)
        kept = jnp.where(position < num_accepted, draft_tokens.astype(jnp.int32), -1)
        tokens = jnp.append(kept, jnp.int32(-1))
        return tokens.at[num_accepted].set(correction)
