"""Synthetic acceptance: a ratio test that passes at prescribed rates, for benchmarking
a serving stack at a chosen acceptance length."""

from typing import ClassVar, Literal

import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    TargetProbsRow,
)
from .._misc import check_hyperparameter
from .ratio_test import AbstractRatioTest
from .row_context import ONE_DEVICE, RowContext
from .verdict import Verdict


class SyntheticRatioTest(AbstractRatioTest):
    """Synthetic acceptance (vLLM's benchmarking tool): draft token $x_i$ passes when
    $u_i < c_i$, with prescribed conditional rates $c_i$, whatever $p$ and $q$.

    With the standard [`eqx_specdec.PrefixCounter`][], $P(n \\ge k) = \\prod_{i < k} c_i$:
    a decoding loop then runs at a chosen acceptance length,
    $E[n] = \\sum_k \\prod_{i < k} c_i$, for measuring the rest of a serving stack.
    **Lossy** (the tokens kept ignore the target); the correction is drawn by the
    residual sampler as usual. Reads no distribution values. Implements every capability.

    **Arguments:**

    - `rates`: $c_i \\in [0, 1]$, a float or an array: a scalar (one rate at every
        position) or of shape `(G,)` (one per position). An array is traced: sweep it
        without recompiling.
    """

    exact: ClassVar[bool] = False
    vocab_parallel: ClassVar[bool] = True
    reads: ClassVar[Literal["draft tokens", "argmax", "whole rows"]] = "draft tokens"
    rates: Float[Array, ""] | Float[Array, " G"] | float = 0.5

    def __check_init__(self):
        check_hyperparameter("rates", self.rates, 0.0, 1.0, low_open=False)
        if np.ndim(self.rates) > 1:
            raise ValueError(
                "`rates` must be a scalar or of shape (G,), one rate per draft "
                f"position; got shape {np.shape(self.rates)}."
            )

    def _rates(self, gamma: int, dtype):
        rates = jnp.asarray(self.rates, dtype)
        if rates.ndim == 1 and rates.shape[0] != gamma:
            raise ValueError(
                f"SyntheticRatioTest has {rates.shape[0]} `rates` for {gamma} draft "
                f"positions: give one rate per position (shape ({gamma},)) or a scalar."
            )
        return jnp.broadcast_to(rates, (gamma,))

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        rates = self._rates(draft_tokens.shape[0], accept_uniforms.dtype)
        return Verdict(accept_uniforms < rates)

    def pass_probabilities(self, draft_law, target_probs):
        rates = self._rates(draft_law.shape[0], draft_law.dtype)
        return jnp.broadcast_to(rates[:, None], draft_law.shape)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        gamma = target_probs.shape[0] - 1
        rates = np.broadcast_to(np.asarray(self.rates, np.float64), (gamma,))
        return dict(accept_breakpoints=rates[:, None])
