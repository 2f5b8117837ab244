"""The base of the cached models that wrap another and transform its logits."""

import abc

import equinox as eqx
from jaxtyping import Array, Float, Int, PyTree

from .cached import AbstractCachedModel


class AbstractLogitsTransform(AbstractCachedModel):
    """A cached model that calls the wrapped `model` (returning logits) and returns its
    rows through `transform`, with the wrapped model's state unchanged.
    [`eqx_specdec.models.Tempered`][] and [`eqx_specdec.models.Warped`][] are the two."""

    model: eqx.AbstractVar[AbstractCachedModel]

    def __check_init__(self):
        if not isinstance(self.model, AbstractCachedModel):
            raise TypeError(
                f"{type(self).__name__}(`model`=...) must be an "
                f"eqx_specdec.models.AbstractCachedModel, got {type(self.model).__name__}."
            )

    @abc.abstractmethod
    def transform(self, logits: Float[Array, "k V"]) -> Float[Array, "k V"]:
        """The rows returned for the wrapped model's `logits`."""

    def init_state(self, max_length: int) -> PyTree[Array]:
        """The wrapped model's state."""
        return self.model.init_state(max_length)

    def __call__(
        self,
        tokens: Int[Array, " k"],
        positions: Int[Array, " k"],
        state: PyTree[Array],
    ) -> tuple[Float[Array, "k V"], PyTree[Array]]:
        """The wrapped model's logits through `transform`, and its new state."""
        logits, state = self.model(tokens, positions, state)
        return self.transform(logits), state
