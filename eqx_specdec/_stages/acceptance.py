"""The one form of every acceptance test, $u < \\text{numerator} / \\text{denominator}$
written without division, its threshold, and the mass a threshold rule accepts: shared
by the chain's stages and the tree's node rules."""

import jax.numpy as jnp
from jaxtyping import Array, Float


Values = Float[Array, "*shape"]


def passes(numerator: Values, denominator: Values, uniform: Values, log_space: bool):
    """The one form of every ratio test: $u < \\text{numerator} / \\text{denominator}$,
    computed without division as `u * denominator < numerator`, or, in log space,
    `log u < numerator - denominator`. So a zero denominator passes any positive
    numerator, and a zero numerator never passes (in log space, `-inf - -inf` is NaN,
    and NaN comparisons are false)."""
    uniform = uniform.astype(numerator.dtype)
    if log_space:
        return jnp.log(uniform) < numerator - denominator
    return uniform * denominator < numerator


def threshold(numerator: Values, denominator: Values) -> Values:
    """Where `passes` flips, on probabilities: `numerator / denominator`, $+\\infty$
    where the denominator is 0 and the numerator positive, 0 where both are 0 (nothing
    passes)."""
    positive = denominator > 0
    ratio = numerator / jnp.where(positive, denominator, 1)
    return jnp.where(positive, ratio, jnp.where(numerator > 0, jnp.inf, 0))


def accepted_mass(draft: Values, bound: Values) -> Values:
    """$q \\cdot a = \\min(q, t)$: the mass a threshold rule accepts at each token, from
    the draft $q$ and the rule's acceptance $t$ (probabilities). An infinite $q$ (an
    invalid row) stays infinite, so that the residual it enters is NaN, never a
    plausible law."""
    return jnp.where(draft == jnp.inf, draft, jnp.minimum(draft, bound))
