"""A cached model's logits at a sampling temperature."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .cached import AbstractCachedModel


class Tempered(AbstractCachedModel):
    """A cached model returning logits, with its logits divided by a temperature $T$:
    decoding it samples from $\\mathrm{softmax}(z / T)$ (speculative decoding is
    lossless against that distribution). For temperature 0 decode greedily instead
    (the greedy verifier, or `key=None` in plain decoding).

    **Arguments:**

    - `model`: an [`eqx_specdec.AbstractCachedModel`][] returning logits.
    - `temperature`: $T > 0$, a float or a scalar array (traced: change it without
        recompiling).
    """

    model: AbstractCachedModel
    temperature: Float[Array, ""] | float = eqx.field(converter=jnp.asarray)

    def __check_init__(self):
        if not isinstance(self.model, AbstractCachedModel):
            raise TypeError(
                "Tempered(`model`=...) must be an eqx_specdec.AbstractCachedModel, got "
                f"{type(self.model).__name__}."
            )
        if self.temperature.ndim or not self.temperature > 0:
            raise ValueError(
                "Tempered(`temperature`=...) must be a scalar > 0 (for temperature 0 "
                f"decode greedily), got {self.temperature}."
            )

    def init_state(self, max_length: int) -> PyTree[Array]:
        """The wrapped model's state."""
        return self.model.init_state(max_length)

    def __call__(
        self,
        tokens: Int[Array, " k"],
        positions: Int[Array, " k"],
        state: PyTree[Array],
    ) -> tuple[Float[Array, "k V"], PyTree[Array]]:
        """The wrapped model's logits over the temperature, and its new state."""
        logits, state = self.model(tokens, positions, state)
        return logits / self.temperature.astype(logits.dtype), state
