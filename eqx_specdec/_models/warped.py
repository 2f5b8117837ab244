"""A cached model's logits through a sampling warp (temperature, top-k, top-p, min-p, a
logit bias)."""

import jax.numpy as jnp
from jaxtyping import Array, Float

from .._warps.warp import Warp
from .cached import AbstractCachedModel
from .wrapped import AbstractLogitsTransform


class Warped(AbstractLogitsTransform):
    """A cached model returning logits, whose rows go through a
    [`eqx_specdec.Warp`][]: it returns the warped log-probabilities (`-inf` for the
    tokens the warp removes) as its logits, so decoding it samples from the warped
    distribution, as a serving stack does with top-k or top-p.

    Speculative decoding with a `Warped` target is lossless against the warped target:
    wrap the draft too to draft from a warped draft (its tokens are then verified
    against the law they were drawn from), and pass `outputs="logits"` for both. The
    warp's cut-offs are [`eqx_specdec.Warp`][]'s exact ones. [`eqx_specdec.models.Tempered`][]
    is the temperature alone.

    **Arguments:**

    - `model`: an [`eqx_specdec.models.AbstractCachedModel`][] returning logits.
    - `warp`: the [`eqx_specdec.Warp`][], with scalar parameters (the model decodes one
        sequence; the loops `vmap` it) and no penalty (they count a history the model
        does not see). A temperature of 0 is greedy: each row is one-hot at its most
        likely token.
    """

    model: AbstractCachedModel
    warp: Warp

    def __check_init__(self):
        if not isinstance(self.warp, Warp):
            raise TypeError(
                "Warped(`warp`=...) must be an eqx_specdec.Warp (for example "
                f"`Warp(0.7, top_p=0.9)`), got {type(self.warp).__name__}."
            )
        if self.warp.needs_history():
            raise ValueError(
                "Warped(`warp`=...) has a history-dependent penalty, which counts the "
                "tokens before each position: a cached model is called on the new "
                "tokens only. Apply penalties with verify on Logits and its "
                "`history`, or leave them out of the warp."
            )
        for name in ("temperature", "top_k", "top_p", "min_p"):
            value = getattr(self.warp, name)
            if value is not None and jnp.ndim(value) != 0:
                raise ValueError(
                    f"Warped(`warp`=...): `{name}` must be a scalar (the model decodes "
                    f"one sequence; the loops vmap it), got shape {jnp.shape(value)}. "
                    "For parameters per row, warp the rows with "
                    "eqx_specdec.verify on Logits."
                )
        if self.warp.logit_bias is not None and jnp.ndim(self.warp.logit_bias) != 1:
            raise ValueError(
                "Warped(`warp`=...): `logit_bias` must have shape (V,) (the model "
                f"decodes one sequence), got {jnp.shape(self.warp.logit_bias)}."
            )

    def transform(self, logits: Float[Array, "k V"]) -> Float[Array, "k V"]:
        """The warped log-probabilities of the logits."""
        return self.warp(logits[None])[0]
