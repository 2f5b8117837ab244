"""Typical acceptance (Medusa): its ratio test and its sampled correction."""

from typing import ClassVar

import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    IntScalar,
    SampleUniform,
    TargetProbsRow,
)
from .._misc import check_hyperparameter
from .._search import has_mass, inverse_cdf
from .greedy import ArgmaxSampler
from .ratio_test import AbstractRatioTest
from .residual_sampler import AbstractResidualSampler
from .row_context import ONE_DEVICE, RowContext
from .verdict import Verdict


def check_typical(epsilon, delta):
    """The invariants of typical acceptance's hyperparameters, shared by its stages."""
    check_hyperparameter("epsilon", epsilon, 0.0, 1.0, low_open=True)
    check_hyperparameter("delta", delta, 0.0, float("inf"), low_open=True)


def typical_threshold(probs, epsilon, delta):
    """$\\min(\\epsilon, \\delta e^{-H(p)})$ per row, $H(p) = -\\sum_v p(v) \\log(p(v) + 10^{-5})$."""
    entropy = -jnp.sum(probs * jnp.log(probs + 1e-5), axis=-1)
    epsilon = jnp.asarray(epsilon, probs.dtype)
    delta = jnp.asarray(delta, probs.dtype)
    return jnp.minimum(epsilon, delta * jnp.exp(-entropy))


def typical_masked(p, epsilon=0.09, delta=0.3):
    """p with the tokens at or under the typical threshold zeroed (NumPy)."""
    entropy = -np.sum(p * np.log(p + 1e-5), axis=-1, keepdims=True)
    return np.where(p > np.minimum(epsilon, delta * np.exp(-entropy)), p, 0)


class TypicalRatioTest(AbstractRatioTest):
    """Typical acceptance (Medusa; Cai et al. 2024): $x_i$ passes when

    $$p_i(x_i) > \\min\\big(\\epsilon, \\delta\\, e^{-H(p_i)}\\big), \\qquad
    H(p) = -\\sum_v p(v) \\log(p(v) + 10^{-5}).$$

    **Lossy**: tokens the target finds typical enough are kept whatever their exact
    probability. Needs no $q$ and no uniforms; reads the whole rows $p_i$. Pairs with
    [`eqx_specdec.ArgmaxSampler`][] (the Medusa default, what a
    [`eqx_specdec.Verifier`][] built with the test alone uses) or
    [`eqx_specdec.TypicalSampler`][]. Has no vocabulary-parallel form (the entropy
    needs whole rows).

    **Arguments:**

    - `epsilon`: the hard threshold $\\epsilon > 0$. Default 0.09.
    - `delta`: the entropy-scaled threshold $\\delta > 0$. Default 0.3.
    """

    exact: ClassVar[bool] = False
    sampler: ClassVar[AbstractResidualSampler] = ArgmaxSampler()
    uses_uniforms: ClassVar[bool] = False
    epsilon: Float[Array, ""] | float = 0.09
    delta: Float[Array, ""] | float = 0.3

    def __check_init__(self):
        check_typical(self.epsilon, self.delta)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        probs = context.probabilities(target_probs[:-1])
        p_x = jnp.take_along_axis(probs, draft_tokens[:, None], axis=1)[:, 0]
        return Verdict(p_x > typical_threshold(probs, self.epsilon, self.delta))

    def pass_probabilities(self, draft_law, target_probs):
        threshold = typical_threshold(target_probs, self.epsilon, self.delta)
        return (target_probs > threshold[:, None]).astype(target_probs.dtype)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}


class TypicalSampler(AbstractResidualSampler):
    """Typical acceptance's sampled correction: $y$ is drawn by inverse CDF from $p_n$
    with the tokens under the typical threshold masked out,

    $$r \\propto p_n(v)\\, [\\, p_n(v) > \\min(\\epsilon, \\delta e^{-H(p_n)})\\,].$$

    (If the mask removed every token, $r = p_n$.) **Lossy**, like the test it pairs with,
    [`eqx_specdec.TypicalRatioTest`][]; use the same `epsilon` and `delta`.

    **Arguments:**

    - `epsilon`: the hard threshold $\\epsilon > 0$. Default 0.09.
    - `delta`: the entropy-scaled threshold $\\delta > 0$. Default 0.3.
    """

    randomness: ClassVar[str] = "uniform"
    draws: ClassVar[str] = "typical"
    reads: ClassVar[str] = "row n"
    epsilon: Float[Array, ""] | float = 0.09
    delta: Float[Array, ""] | float = 0.3

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
        context: RowContext = ONE_DEVICE,
    ) -> IntScalar:
        probs = context.probabilities(target_probs[num_accepted])
        threshold = typical_threshold(probs, self.epsilon, self.delta)
        masked = jnp.where(probs > threshold, probs, 0)
        weights = jnp.where(has_mass(jnp.sum(masked), probs.dtype), masked, probs)
        return inverse_cdf(weights, sample_uniform)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        masked = typical_masked(target_probs, float(self.epsilon), float(self.delta))
        masked = np.where(masked.sum(-1, keepdims=True) > 0, masked, target_probs)
        cdfs = np.cumsum(masked, -1) / masked.sum(-1, keepdims=True)
        return dict(sample_breakpoints=cdfs.ravel())
