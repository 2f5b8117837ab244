"""Greedy decoding as stages: the test that keeps a draft token when it is the target's
argmax, and the correction that is the target's argmax."""

from typing import ClassVar, Literal

import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    IntScalar,
    SampleRandomness,
    TargetProbsRow,
)
from .._kernels.leading_argmax import fits, leading_argmax
from .._platform import on_tpu
from .ratio_test import AbstractRatioTest
from .residual_sampler import AbstractResidualSampler, Randomness, Reads
from .row_context import ONE_DEVICE, RowContext
from .verdict import Verdict


class ArgmaxSampler(AbstractResidualSampler):
    """The greedy correction: $y = \\arg\\max_v p_n(v)$ (ties: the lowest id), the
    target's most likely token at the first rejected position (or the bonus position).

    Deterministic (`randomness = "none"`); reads only row $n$ of `target_probs`. Works on
    probabilities and log-probabilities alike. With [`eqx_specdec.GreedyRatioTest`][] it
    gives greedy verification; with [`eqx_specdec.TypicalRatioTest`][], Medusa's typical
    acceptance.
    """

    randomness: ClassVar[Randomness] = "none"
    draws: ClassVar[str] = "argmax"
    reads: ClassVar[Reads] = "row n"
    vocab_parallel: ClassVar[bool] = True

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        num_accepted: IntScalar,
        verdict: Verdict,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        sample_uniform: SampleRandomness,
        context: RowContext = ONE_DEVICE,
    ) -> IntScalar:
        if context.shard is not None:
            row = target_probs[num_accepted]
            invalid = context.sum(jnp.any(jnp.isnan(row)).astype(jnp.int32)) > 0
            return jnp.where(invalid, -1, context.argmax(row)).astype(jnp.int32)
        # Every row's argmax, of which row n's is taken: the one pass greedy
        # verification's test makes too (XLA computes it once), where reading row n
        # alone would gather it (on a TPU, slower than the pass). A row holding a NaN
        # (or without mass) gives -1 (with the input checks off), never a token.
        best = context.argmax(target_probs)[num_accepted]
        return jnp.where(best < target_probs.shape[-1], best, -1).astype(jnp.int32)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}


class GreedyRatioTest(AbstractRatioTest):
    """Greedy verification (temperature 0): $x_i$ passes when it is the target's most
    likely token, $x_i = \\arg\\max_v p_i(v)$ (ties: the lowest id).

    Exact with respect to greedy decoding of the target when paired with
    [`eqx_specdec.ArgmaxSampler`][]. Draws no randomness and ignores `draft_probs`; reads
    the rows $p_i$ only through their argmax (`reads = "argmax"`), so on warped logits
    it is handed the logits as they are, without the warp's normalisers. Works on
    probabilities and log-probabilities alike. A row without a most likely token (a
    NaN, or no mass) never passes. Implements every capability.
    """

    exact: ClassVar[bool] = True
    reads: ClassVar[Literal["draft tokens", "argmax", "whole rows"]] = "argmax"
    vocab_parallel: ClassVar[bool] = True
    uses_uniforms: ClassVar[bool] = False
    sampler: ClassVar[AbstractResidualSampler] = ArgmaxSampler()

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        # Every row's, as the argmax sampler reads them: one pass, shared.
        best = context.argmax(target_probs)[:-1]
        return Verdict(best == draft_tokens.astype(jnp.int32))

    def argmax_pass(
        self, draft_tokens, target_probs, context=ONE_DEVICE, *, kernel=False
    ):
        """With `kernel`, where it fits (float32 rows given as an array, over the whole
        vocabulary), by the Pallas kernel that reads each sequence's rows one position
        after another and none after its first rejection: at the acceptance of real
        drafts, a fraction of the rows XLA's argmax of every row reads."""
        if not kernel or context.shard is not None or not fits(target_probs):
            return None
        return leading_argmax(
            draft_tokens,
            target_probs,
            log_space=context.log_space,
            interpret=not on_tpu(),
        )

    def pass_probabilities(self, draft_law, target_probs):
        vocab = target_probs.shape[-1]
        best = jnp.argmax(target_probs, -1)
        return jax.nn.one_hot(best, vocab, dtype=target_probs.dtype)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}
