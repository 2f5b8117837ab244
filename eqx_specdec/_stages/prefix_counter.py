"""Prefix counters: the abstract base (from per-position outcomes to the number
accepted) and the standard count."""

import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from equinox import AbstractClassVar
from jaxtyping import Array, Float, jaxtyped

from .._capabilities import capability
from .._custom_types import IntScalar, PassedRow


PassRow = Float[Array, " G"]


class AbstractPrefixCounter(eqx.Module):
    """Turns the per-position outcomes of a ratio test into the number of accepted
    draft tokens $n \\in \\{0, \\dots, G\\}$ of one row.

    The count is a traced value: implementations must not branch on it in Python.

    **Declared by every subclass:**

    - `counts` (class attribute, str): which count it performs, `"first failure"` (the
        standard count) or `"last success"` (block verification's), or a name of your
        own. A ratio test fits the counters whose `counts` equals its own counter's
        (see [`eqx_specdec.AbstractRatioTest`][]'s `counter`); a
        [`eqx_specdec.Verifier`][] refuses a counter that does not fit an exact test.
    """

    counts: AbstractClassVar[str]

    @abc.abstractmethod
    def __call__(self, passed: PassedRow) -> IntScalar:
        """Counts the accepted draft tokens of one row.

        **Arguments:**

        - `passed`: boolean of shape `(G,)`, the `passed` field of the
            [`eqx_specdec.Verdict`][] returned by the ratio test.

        **Returns:**

        An int32 scalar $n$ with $0 \\le n \\le G$: the first $n$ draft tokens are
        accepted.
        """

    @capability
    def reach_probabilities(self, pass_probs: PassRow) -> PassRow:
        """Capability for the acceptance objectives
        ([`eqx_specdec.evaluation.acceptance_by_position`][]): $P(n \\ge k)$ for $k = 1, \\dots,
        G$ when the tests pass independently, position $i$ with probability
        `pass_probs[i]`. Traced and differentiable.

        **Arguments:**

        - `pass_probs`: float of shape `(G,)`, in $[0, 1]$.

        **Returns:**

        Float of shape `(G,)`: entry $k - 1$ is the probability that at least $k$
        draft tokens are accepted.
        """


class PrefixCounter(AbstractPrefixCounter):
    """The standard count: the number of tests passed before the first failure,

    $$n = \\max\\{k : \\text{passed}_0, \\dots, \\text{passed}_{k-1}\\},$$

    or $G$ when every test passes. Outcomes after the first failure do not matter.
    """

    counts: ClassVar[str] = "first failure"

    @jaxtyped(typechecker=beartype)
    def __call__(self, passed: PassedRow) -> IntScalar:
        return jnp.sum(jnp.cumprod(passed.astype(jnp.int32)), dtype=jnp.int32)

    def reach_probabilities(self, pass_probs: PassRow) -> PassRow:
        """$P(n \\ge k) = \\prod_{i < k} a_i$."""
        return jnp.cumprod(pass_probs)
