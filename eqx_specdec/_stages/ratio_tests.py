"""The standard, lenient and greedy ratio tests, and the pass rule they share."""

from typing import ClassVar, Literal

import equinox as eqx
import jax
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
from .abstract_ratio_test import AbstractRatioTest
from .gather import gather_draft_probs
from .verdict import Verdict


def ratio_passes(p_x, q_x, u, lenience, log_space):
    """`u * l * q < p`, or in log space `log u + log l < log p - log q`."""
    u = u.astype(p_x.dtype)
    if log_space:
        # -inf - -inf is NaN, and NaN comparisons are false: p = q = 0 never passes.
        threshold = p_x - q_x
        if lenience is not None:
            threshold = threshold - jnp.log(jnp.asarray(lenience, p_x.dtype))
        return jnp.log(u) < threshold
    if lenience is not None:
        u = u * jnp.asarray(lenience, p_x.dtype)
    return u * q_x < p_x


def clipped_ratio(p, q, scale=1.0):
    """$\\min(1, p / (l q))$ elementwise, 1 where $l q = 0$: the probability that the
    (lenient) ratio test passes a drafted token."""
    scaled = scale * q
    return jnp.where(
        scaled > 0, jnp.minimum(1.0, p / jnp.where(scaled > 0, scaled, 1)), 1
    )


class RatioTest(AbstractRatioTest):
    """The standard test of speculative sampling: draft token $x_i$ passes when

    $$u_i \\, q_i(x_i) < p_i(x_i),$$

    that is $u_i < p_i(x_i) / q_i(x_i)$ computed without division, so that
    $q_i(x_i) = 0 < p_i(x_i)$ passes and $p_i(x_i) = 0$ never passes. With
    `draft_probs=None`, $q_i(x_i) = 1$ (one-hot drafts): the test is $u_i < p_i(x_i)$.

    Lossless (Leviathan et al. 2023; Chen et al. 2023). Gathers only $p_i(x_i)$ and
    $q_i(x_i)$: $O(\\gamma)$ reads. Implements every capability.

    **Arguments:**

    - `log_space`: if `True`, the distributions given are log-probabilities and the test
        is $\\log u_i < \\log p_i(x_i) - \\log q_i(x_i)$, exact where probabilities would
        underflow (what [`eqx_specdec.speculative_accept_logits`][] uses).
    """

    uses_uniforms: ClassVar[bool] = True
    reads: ClassVar[Literal["draft tokens", "whole rows"]] = "draft tokens"
    log_space: bool = eqx.field(static=True, default=False)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
    ) -> Verdict:
        p_x, q_x = gather_draft_probs(
            draft_tokens, draft_probs, target_probs, log_space=self.log_space
        )
        return Verdict(ratio_passes(p_x, q_x, accept_uniforms, None, self.log_space))

    def pass_probabilities(self, draft_law, target_probs):
        return clipped_ratio(target_probs, draft_law)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}

    def vocab_parallel(
        self, shard, draft_tokens, draft_probs, target_probs, accept_uniforms
    ):
        p_x, q_x = shard.gather_draft_probs(
            draft_tokens, draft_probs, target_probs, log_space=self.log_space
        )
        return Verdict(ratio_passes(p_x, q_x, accept_uniforms, None, self.log_space))


class LenientRatioTest(AbstractRatioTest):
    """A lenient test, accepting more draft tokens than the standard one: $x_i$ passes when

    $$u_i < \\frac{p_i(x_i)}{l\\, q_i(x_i)}, \\quad l \\in (0, 1].$$

    $l = 1$ is the standard rule, bit for bit. For $l < 1$ the verifier is **lossy**: the
    emitted tokens drift from the target as $l$ falls (see the Variants page for the
    measured distance). The residual is left standard. Implements every capability.

    **Arguments:**

    - `lenience`: $l$, a float or a scalar array in $(0, 1]$. A Python float is static
        (each value compiles once); pass an array to sweep it without recompiling.
    - `log_space`: if `True`, the distributions given are log-probabilities.
    """

    uses_uniforms: ClassVar[bool] = True
    reads: ClassVar[Literal["draft tokens", "whole rows"]] = "draft tokens"
    lenience: Float[Array, ""] | float = 1.0
    log_space: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        check_hyperparameter("lenience", self.lenience, 0.0, 1.0, low_open=True)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
    ) -> Verdict:
        p_x, q_x = gather_draft_probs(
            draft_tokens, draft_probs, target_probs, log_space=self.log_space
        )
        return Verdict(
            ratio_passes(p_x, q_x, accept_uniforms, self.lenience, self.log_space)
        )

    def pass_probabilities(self, draft_law, target_probs):
        lenience = jnp.asarray(self.lenience, draft_law.dtype)
        return clipped_ratio(target_probs, draft_law, lenience)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        if draft_probs is None:
            return dict(accept_breakpoints=target_probs[:-1] / float(self.lenience))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = target_probs[:-1] / (float(self.lenience) * draft_probs)
        return dict(accept_breakpoints=ratios)

    def vocab_parallel(
        self, shard, draft_tokens, draft_probs, target_probs, accept_uniforms
    ):
        p_x, q_x = shard.gather_draft_probs(
            draft_tokens, draft_probs, target_probs, log_space=self.log_space
        )
        return Verdict(
            ratio_passes(p_x, q_x, accept_uniforms, self.lenience, self.log_space)
        )


class GreedyRatioTest(AbstractRatioTest):
    """Greedy verification (temperature 0): $x_i$ passes when it is the target's most
    likely token, $x_i = \\arg\\max_v p_i(v)$ (ties: the lowest id).

    Exact with respect to greedy decoding of the target when paired with
    [`eqx_specdec.ArgmaxSampler`][]. Draws no randomness and ignores `draft_probs`; reads
    the whole rows $p_i$. Works on probabilities and log-probabilities alike
    (`log_space = None`). Implements every capability.
    """

    uses_uniforms: ClassVar[bool] = False
    log_space: ClassVar[None] = None

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
    ) -> Verdict:
        best = jnp.argmax(target_probs[:-1], axis=-1)
        return Verdict(best.astype(jnp.int32) == draft_tokens.astype(jnp.int32))

    def pass_probabilities(self, draft_law, target_probs):
        vocab = target_probs.shape[-1]
        best = jnp.argmax(target_probs, -1)
        return jax.nn.one_hot(best, vocab, dtype=target_probs.dtype)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}

    def emission_target(self, target_probs):
        return np.eye(target_probs.shape[-1])[np.argmax(target_probs, -1)]

    def vocab_parallel(
        self, shard, draft_tokens, draft_probs, target_probs, accept_uniforms
    ):
        best = shard.argmax(target_probs[:-1])
        return Verdict(best == draft_tokens.astype(jnp.int32))
