"""A cached model's logits at a sampling temperature."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .cached import AbstractCachedModel
from .wrapped import AbstractLogitsTransform


class Tempered(AbstractLogitsTransform):
    """A cached model returning logits, with its logits divided by a temperature $T$:
    decoding it samples from $\\mathrm{softmax}(z / T)$ (speculative decoding is
    lossless against that distribution). For temperature 0 decode greedily instead
    (the greedy verifier, or `key=None` in plain decoding).

    **Arguments:**

    - `model`: an [`eqx_specdec.models.AbstractCachedModel`][] returning logits.
    - `temperature`: $T > 0$, a float or a scalar array (traced: change it without
        recompiling).
    """

    model: AbstractCachedModel
    temperature: Float[Array, ""] | float = eqx.field(converter=jnp.asarray)

    def __check_init__(self):
        if self.temperature.ndim or not self.temperature > 0:
            raise ValueError(
                "Tempered(`temperature`=...) must be a scalar > 0 (for temperature 0 "
                f"decode greedily), got {self.temperature}."
            )

    def transform(self, logits: Float[Array, "k V"]) -> Float[Array, "k V"]:
        """The logits over the temperature."""
        return logits / self.temperature.astype(logits.dtype)
