"""Token assemblers: the output row from the count, the draft and the correction."""

import abc

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import jaxtyped

from .._custom_types import DraftTokensRow, IntScalar, TokensRow


class AbstractTokenAssembler(eqx.Module):
    """Writes the output token row of one sequence from the accepted count, the draft
    tokens and the correction token."""

    @abc.abstractmethod
    def __call__(
        self,
        num_accepted: IntScalar,
        draft_tokens: DraftTokensRow,
        correction: IntScalar,
    ) -> TokensRow:
        """Assembles the emitted tokens of one row.

        **Arguments:**

        - `num_accepted`: int32 scalar $n$, from the prefix counter.
        - `draft_tokens`: integer of shape `(G,)`, the draft tokens.
        - `correction`: int32 scalar $y$, from the residual sampler.

        **Returns:**

        An int32 array of shape `(G + 1,)`.
        """


class TokenAssembler(AbstractTokenAssembler):
    """The contract's layout: the $n$ accepted draft tokens, then $y$, then `-1` padding.

    $$\\text{tokens} = (x_0, \\dots, x_{n-1}, y, -1, \\dots, -1).$$
    """

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        num_accepted: IntScalar,
        draft_tokens: DraftTokensRow,
        correction: IntScalar,
    ) -> TokensRow:
        position = jnp.arange(draft_tokens.shape[0] + 1, dtype=jnp.int32)
        padded = jnp.append(draft_tokens.astype(jnp.int32), jnp.int32(-1))
        n = num_accepted.astype(jnp.int32)
        tail = jnp.where(position == n, correction.astype(jnp.int32), jnp.int32(-1))
        return jnp.where(position < n, padded, tail)
