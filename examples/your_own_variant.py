"""Your own variant in 30 lines: one uniform per row instead of one per position.

A draft position is only tested once every earlier one passed, and given that
u < r_0 = min(1, p_0(x_0) / q_0(x_0)), the rescaled u / r_0 is again uniform on [0, 1).
So a single uniform can be recycled down the draft. Reusing it *without* the rescaling is
a subtle bug; the library's Monte Carlo check tells the two apart.
"""

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Integer

import eqx_specdec


class RecycledUniformTest(eqx_specdec.AbstractRatioTest):
    exact: ClassVar[bool] = True  # a claim the quadrature checks
    rescale: bool = True  # False: the buggy version, the same u at every position
    def __call__(
        self,
        draft_tokens: Integer[Array, " G"],
        draft_probs: Float[Array, "G V"],
        target_probs: Float[Array, "G+1 V"],
        accept_uniforms: Float[Array, " G"],
        context: eqx_specdec.RowContext,
    ) -> eqx_specdec.Verdict:
        p, q = context.gather(draft_tokens, draft_probs, target_probs)
        if context.log_space:  # logits given: back to probabilities
            p, q = jnp.exp(p), jnp.exp(q)
        ratio = jnp.where(q > 0, jnp.minimum(1.0, p / jnp.where(q > 0, q, 1)), 1.0)
        ratio = jnp.where(p > 0, ratio, 0.0)
        if self.rescale:  # the uniform seen at position i is u / (r_0 ... r_{i-1})
            passed = accept_uniforms[0] < jnp.cumprod(ratio)
        else:
            passed = accept_uniforms[0] < ratio
        return eqx_specdec.Verdict(passed)


def check(rescale: bool, draws: int = 200_000):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(16, 0.5), size=4)  # G = 3 draft positions, V = 16
    q = rng.dirichlet(np.full(16, 0.5), size=3)
    verifier = eqx_specdec.Verifier(ratio_test=RecycledUniformTest(rescale))
    estimate = eqx_specdec.evaluation.emission_by_monte_carlo(
        verifier, q, p, jax.random.key(0), draws
    )
    stats = estimate.chi_square(p)
    return stats["statistic"], stats["threshold"]


if __name__ == "__main__":
    for rescale in (True, False):
        statistic, threshold = check(rescale)
        verdict = "lossless" if np.all(statistic < threshold) else "NOT lossless"
        print(
            f"rescale={rescale}: chi-square per position {np.round(statistic)} "
            f"(thresholds {np.round(threshold)}): {verdict}"
        )
