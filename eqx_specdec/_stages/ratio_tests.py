import abc

import equinox as eqx
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    TargetProbsRow,
)
from .._misc import compute_dtype
from .verdict import Verdict


def gather_draft_probs(
    draft_tokens: DraftTokensRow,
    draft_probs: DraftProbsRow | None,
    target_probs: TargetProbsRow,
):
    """Gathers $p_i(x_i)$ and $q_i(x_i)$ for every draft position of one row.

    With `draft_probs=None` (one-hot drafts, $q_i = \\mathrm{onehot}(x_i)$), $q_i(x_i) = 1$.
    Both are returned in the row's compute dtype (at least float32).
    """
    index = draft_tokens[:, None]
    p_x = jnp.take_along_axis(target_probs[:-1], index, axis=1)[:, 0]
    if draft_probs is None:
        dtype = compute_dtype(target_probs.dtype)
        q_x = jnp.ones(p_x.shape, dtype)
    else:
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)
        q_x = jnp.take_along_axis(draft_probs, index, axis=1)[:, 0]
    return p_x.astype(dtype), q_x.astype(dtype)


class AbstractRatioTest(eqx.Module):
    """Decides, for every draft position of one row, whether the draft token passes.

    This is the extension point for acceptance rules. A subclass implements `__call__`;
    everything else in the pipeline (counting the accepted prefix, drawing the correction
    token, assembling the output) is done by the other stages of the
    [`eqx_specdec.Verifier`][].

    For the verifier to stay lossless, the test at position $i$ must pass with probability
    $\\min(1, p_i(x_i) / q_i(x_i))$ given the accepted prefix (or, for rules such as block
    verification, with the probabilities the matching prefix counter and residual expect).
    """

    @abc.abstractmethod
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
    ) -> Verdict:
        """Runs the test at every draft position of one row.

        **Arguments:**

        - `draft_tokens`: integer of shape `(gamma,)`, the draft tokens $x_i$.
        - `draft_probs`: float of shape `(gamma, vocab)`, the draft distributions $q_i$,
            or `None` for one-hot drafts ($q_i = \\mathrm{onehot}(x_i)$).
        - `target_probs`: float of shape `(gamma + 1, vocab)`, the target distributions
            $p_i$; the last row follows the last draft token.
        - `accept_uniforms`: float of shape `(gamma,)`, the uniforms $u_i \\in [0, 1)$.
            Rules without randomness ignore them.

        **Returns:**

        A [`eqx_specdec.Verdict`][] holding the per-position outcomes (and, for rules
        that need it, the residual scale).
        """


class RatioTest(AbstractRatioTest):
    """The standard test of speculative sampling: draft token $x_i$ passes when

    $$u_i \\, q_i(x_i) < p_i(x_i),$$

    that is $u_i < p_i(x_i) / q_i(x_i)$ computed without division, so that
    $q_i(x_i) = 0 < p_i(x_i)$ passes and $p_i(x_i) = 0$ never passes. With
    `draft_probs=None`, $q_i(x_i) = 1$ (one-hot drafts): the test is $u_i < p_i(x_i)$.

    Lossless (Leviathan et al. 2023; Chen et al. 2023). Gathers only $p_i(x_i)$ and
    $q_i(x_i)$: $O(\\gamma)$ reads.
    """

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
    ) -> Verdict:
        p_x, q_x = gather_draft_probs(draft_tokens, draft_probs, target_probs)
        return Verdict(accept_uniforms.astype(p_x.dtype) * q_x < p_x)
