"""Block verification (Sun et al., ICLR 2025): its ratio test, vectorised."""

import itertools
from typing import ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    IntScalar,
    PassedRow,
    TargetProbsRow,
)
from .acceptance import threshold
from .prefix_counter import AbstractPrefixCounter
from .ratio_test import AbstractRatioTest
from .row_context import ONE_DEVICE, RowContext
from .verdict import Verdict


def _needs_draft_probs(draft_probs):
    if draft_probs is None:
        raise ValueError(
            "BlockRatioTest needs `draft_probs`: block verification uses the whole "
            "draft distributions q_k, which one-hot drafts do not have."
        )


# A stand-in for +inf log-ratios (q(x) = 0 < p(x)): larger than any finite float32
# log-ratio sum over a draft (|log p - log q| < 210 per position), so min(1, .) clips right.
_LOG_RATIO_CAP = 1e4


def block_cumulative(p_x, q_x, log_space):
    """Block verification's clipped cumulative ratios $P_0, \\dots, P_G$ of one row, from
    $p_i(x_i)$ and $q_i(x_i)$: $\\log P_k = S_k - \\max(0, \\max_{j \\le k} S_j)$."""
    dtype = p_x.dtype
    if log_space:
        log_p, log_q = p_x, q_x
    else:
        log_p, log_q = jnp.log(p_x), jnp.log(q_x)
    dead = jnp.cumsum(log_p == -jnp.inf) > 0  # some p(x) = 0 so far: P = 0 from here
    log_ratio = jnp.where(
        log_q == -jnp.inf,
        _LOG_RATIO_CAP,
        jnp.maximum(log_p - log_q, -_LOG_RATIO_CAP),
    )
    running = jnp.cumsum(log_ratio)
    log_cum = running - jnp.maximum(0.0, jax.lax.cummax(running))
    cum = jnp.where(dead, 0.0, jnp.exp(log_cum)).astype(dtype)
    return jnp.concatenate([jnp.ones((1,), dtype), cum])


def block_h(cum, z):
    """The pass thresholds $h_1, \\dots, h_G$ from $P_0..P_G$ and the lookahead masses
    $Z_1, \\dots, Z_{G-1}$ (`z`); $h_G = P_G$."""
    gamma = cum.shape[0] - 1
    denominator = z + 1 - cum[1:gamma]
    h = jnp.where(denominator > 0, z / jnp.where(denominator > 0, denominator, 1), 1)
    return jnp.concatenate([h, cum[gamma:]])


PassRow = Float[Array, " G"]


class LastSuccessCounter(AbstractPrefixCounter):
    """Block verification's count: the position of the **last** pass,

    $$n = \\max\\{k : \\text{passed}_{k-1}\\} \\quad (0 \\text{ if none}),$$

    so that passes after a failure still count. Paired with
    [`eqx_specdec.BlockRatioTest`][]. (With the standard test this would not be lossless;
    with the block test, the first-failure count would not be.)
    """

    counts: ClassVar[str] = "last success"

    @jaxtyped(typechecker=beartype)
    def __call__(self, passed: PassedRow) -> IntScalar:
        positions = jnp.arange(1, passed.shape[0] + 1, dtype=jnp.int32)
        return jnp.max(jnp.where(passed, positions, 0)).astype(jnp.int32)

    def reach_probabilities(self, pass_probs: PassRow) -> PassRow:
        """$P(n \\ge k) = 1 - \\prod_{i \\ge k - 1} (1 - a_i)$: some test from position
        $k - 1$ on passes."""
        return 1 - jax.lax.cumprod(1 - pass_probs, reverse=True)


class BlockRatioTest(AbstractRatioTest):
    """Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh;
    ICLR 2025): the test that, with [`eqx_specdec.LastSuccessCounter`][] and the standard
    [`eqx_specdec.ResidualSampler`][], verifies the draft as a block and never accepts
    fewer tokens in expectation than the standard rule.

    With $P_0 = 1$ and $P_k = \\min(1, P_{k-1}\\, p_{k-1}(x_{k-1}) / q_{k-1}(x_{k-1}))$ (the
    clipped cumulative ratio after $k$ draft tokens),

    $$Z_k = \\sum_v \\big(P_k\\, p_k(v) - q_k(v)\\big)_+, \\qquad
    h_k = \\frac{Z_k}{Z_k + 1 - P_k} \\;(1 \\text{ if the denominator is } 0), \\qquad
    h_G = P_G,$$

    and draft token $k - 1$ *passes* when $u_{k-1} < h_k$. The number accepted is the **last**
    pass (not the first failure), and the correction is drawn from
    $\\operatorname{norm}((P_n\\, p_n - q_n)_+)$: the verdict's `residual_scale` is
    $(P_0, \\dots, P_{G-1})$.

    Vectorised, no sequential scan: $\\log P_k = S_k - \\max(0, \\max_{j \\le k} S_j)$ with $S$
    the running sum of $\\log p_i(x_i) - \\log q_i(x_i)$. Reads the full rows $p_k, q_k$ for
    $1 \\le k < G$ (for $Z_k$): $O(GV)$, inherent to the rule. Lossless.
    """

    exact: ClassVar[bool] = True
    vocab_parallel: ClassVar[bool] = True
    counter: ClassVar[AbstractPrefixCounter] = LastSuccessCounter()
    theory: ClassVar[Literal["exact", "lower bound"]] = "lower bound"

    def weights(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        context: RowContext = ONE_DEVICE,
    ) -> tuple[Float[Array, " G+1"], Float[Array, " G"]]:
        """The clipped cumulative ratios $P_0, \\dots, P_G$ and the weights
        $h_1, \\dots, h_G$ of one row (float32, or float64 for float64 inputs).

        **Arguments:**

        - `draft_tokens`, `draft_probs`, `target_probs`, `context`: as for
            `__call__`.

        **Returns:**

        `(P, h)` of shapes `(G + 1,)` and `(G,)`.
        """
        _needs_draft_probs(draft_probs)
        p_x, q_x = context.gather(draft_tokens, draft_probs, target_probs)
        gamma = p_x.shape[0]
        cum = block_cumulative(p_x, q_x, context.log_space)
        # Z_k for k = 1 .. G-1 reads rows k of p and q (this device's slices: the sum
        # over the devices completes it).
        p_rows = context.probabilities(target_probs[1:gamma]).astype(cum.dtype)
        q_rows = context.probabilities(draft_probs[1:gamma]).astype(cum.dtype)
        z = jnp.sum(jnp.maximum(cum[1:gamma, None] * p_rows - q_rows, 0), axis=-1)
        return cum, block_h(cum, context.sum(z))

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        cum, h = self.weights(draft_tokens, draft_probs, target_probs, context)
        passed = accept_uniforms.astype(h.dtype) < h
        return Verdict(passed, cum[:-1])

    def pass_probabilities_given_drafts(self, draft_tokens, draft_probs, target_probs):
        """The weights $h_1, \\dots, h_G$: draft token $k - 1$ passes when
        $u_{k-1} < h_k$, each with its own uniform."""
        return self.weights(draft_tokens, draft_probs, target_probs)[1]

    def pass_probabilities(self, draft_law, target_probs):
        # Block verification accepts at least as many tokens in expectation as the
        # standard rule (Sun et al., Theorem 2): the standard probabilities bound it.
        return jnp.minimum(1, threshold(target_probs, draft_law))

    def quadrature_breakpoints(self, draft_probs, target_probs):
        """Each $h_k$ (in $u$) and the cumulative sums of each residual
        $\\operatorname{norm}((P_n p_n - q_n)_+)$ (in $s$), over every draft sequence:
        enumerates all $V^G$ drafts."""
        _needs_draft_probs(draft_probs)
        q, p = np.asarray(draft_probs), np.asarray(target_probs)
        gamma, vocab = q.shape
        sequences = list(itertools.product(range(vocab), repeat=gamma))
        weights = jax.vmap(self.weights, in_axes=(0, None, None))
        cum, h = weights(
            jnp.asarray(sequences, jnp.int32),
            jnp.asarray(q, jnp.float32),
            jnp.asarray(p, jnp.float32),
        )
        cum = np.asarray(cum, np.float64)
        residuals = np.maximum(cum[:, :gamma, None] * p[None, :gamma] - q[None], 0)
        totals = residuals.sum(-1, keepdims=True)
        cdfs = np.cumsum(residuals, -1) / np.where(totals > 0, totals, 1)
        return dict(accept_breakpoints=np.asarray(h).T, sample_breakpoints=cdfs.ravel())
