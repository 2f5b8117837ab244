import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Float, jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    TargetProbsRow,
)
from .._misc import check_hyperparameter, compute_dtype
from .verdict import Verdict


def gather_draft_probs(
    draft_tokens: DraftTokensRow,
    draft_probs: DraftProbsRow | None,
    target_probs: TargetProbsRow,
    *,
    log_space: bool = False,
):
    """Gathers $p_i(x_i)$ and $q_i(x_i)$ for every draft position of one row.

    With `draft_probs=None` (one-hot drafts, $q_i = \\mathrm{onehot}(x_i)$), $q_i(x_i) = 1$
    (0 in log space). Both are returned in the row's compute dtype (at least float32).
    """
    index = draft_tokens[:, None]
    p_x = jnp.take_along_axis(target_probs[:-1], index, axis=1)[:, 0]
    if draft_probs is None:
        dtype = compute_dtype(target_probs.dtype)
        q_x = jnp.full(p_x.shape, 0.0 if log_space else 1.0, dtype)
    else:
        dtype = compute_dtype(target_probs.dtype, draft_probs.dtype)
        q_x = jnp.take_along_axis(draft_probs, index, axis=1)[:, 0]
    return p_x.astype(dtype), q_x.astype(dtype)


def _ratio_test(p_x, q_x, u, lenience, log_space):
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


class AbstractRatioTest(eqx.Module):
    """Decides, for every draft position of one row, whether the draft token passes.

    This is the extension point for acceptance rules. A subclass implements `__call__`;
    everything else in the pipeline (counting the accepted prefix, drawing the correction
    token, assembling the output) is done by the other stages of the
    [`eqx_specdec.Verifier`][].

    For the verifier to stay lossless, the test at position $i$ must pass with
    probability $\\min(1, p_i(x_i) / q_i(x_i))$ given the accepted prefix (or, for rules
    such as block verification, with the probabilities the matching prefix counter and
    residual expect).

    A subclass whose test draws no randomness sets the class attribute
    `uses_uniforms = False`; `accept_uniforms` may then be `None` at the entry points.
    """

    uses_uniforms: ClassVar[bool] = True

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
        - `accept_uniforms`: float of shape `(gamma,)`, the uniforms $u_i \\in [0, 1)$
            (zeros for a test with `uses_uniforms = False`).

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

    **Arguments:**

    - `log_space`: if `True`, the distributions given are log-probabilities and the test
        is $\\log u_i < \\log p_i(x_i) - \\log q_i(x_i)$, exact where probabilities would
        underflow (what [`eqx_specdec.speculative_accept_logits`][] uses).
    """

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
        return Verdict(_ratio_test(p_x, q_x, accept_uniforms, None, self.log_space))


class LenientRatioTest(AbstractRatioTest):
    """A lenient test, accepting more draft tokens than the standard one: $x_i$ passes when

    $$u_i < \\frac{p_i(x_i)}{l\\, q_i(x_i)}, \\quad l \\in (0, 1].$$

    $l = 1$ is the standard rule, bit for bit. For $l < 1$ the verifier is **lossy**: the
    emitted tokens drift from the target as $l$ falls (see the Variants page for the
    measured distance). The residual is left standard.

    **Arguments:**

    - `lenience`: $l$, a float or a scalar array in $(0, 1]$. An array can be swept
        under `jax.jit` without recompiling.
    - `log_space`: if `True`, the distributions given are log-probabilities.
    """

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
            _ratio_test(p_x, q_x, accept_uniforms, self.lenience, self.log_space)
        )


class GreedyRatioTest(AbstractRatioTest):
    """Greedy verification (temperature 0): $x_i$ passes when it is the target's most
    likely token, $x_i = \\arg\\max_v p_i(v)$ (ties: the lowest id).

    Exact with respect to greedy decoding of the target when paired with
    [`eqx_specdec.ArgmaxSampler`][]. Draws no randomness and ignores `draft_probs`; reads
    the whole rows $p_i$. Works on probabilities and log-probabilities alike.
    """

    uses_uniforms: ClassVar[bool] = False

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


class TypicalRatioTest(AbstractRatioTest):
    """Typical acceptance (Medusa; Cai et al. 2024): $x_i$ passes when

    $$p_i(x_i) > \\min\\big(\\epsilon, \\delta\\, e^{-H(p_i)}\\big), \\qquad
    H(p) = -\\sum_v p(v) \\log(p(v) + 10^{-5}).$$

    **Lossy**: tokens the target finds typical enough are kept whatever their exact
    probability. Needs no $q$ and no uniforms; reads the whole rows $p_i$. Pair with
    [`eqx_specdec.ArgmaxSampler`][] (the Medusa default) or
    [`eqx_specdec.TypicalSampler`][].

    **Arguments:**

    - `epsilon`: the hard threshold $\\epsilon > 0$. Default 0.09.
    - `delta`: the entropy-scaled threshold $\\delta > 0$. Default 0.3.
    - `log_space`: if `True`, the distributions given are log-probabilities.
    """

    uses_uniforms: ClassVar[bool] = False
    epsilon: Float[Array, ""] | float = 0.09
    delta: Float[Array, ""] | float = 0.3
    log_space: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        check_typical(self.epsilon, self.delta)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
    ) -> Verdict:
        probs = target_probs[:-1].astype(compute_dtype(target_probs.dtype))
        if self.log_space:
            probs = jnp.exp(probs)
        p_x = jnp.take_along_axis(probs, draft_tokens[:, None], axis=1)[:, 0]
        return Verdict(p_x > typical_threshold(probs, self.epsilon, self.delta))


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

    **Arguments:**

    - `log_space`: if `True`, the distributions given are log-probabilities.
    """

    log_space: bool = eqx.field(static=True, default=False)

    def weights(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow,
        target_probs: TargetProbsRow,
    ) -> tuple[Float[Array, " gamma+1"], Float[Array, " gamma"]]:
        """The clipped cumulative ratios $P_0, \\dots, P_G$ and the weights
        $h_1, \\dots, h_G$ of one row (float32, or float64 for float64 inputs).

        **Arguments:**

        - `draft_tokens`, `draft_probs`, `target_probs`: as for `__call__`.

        **Returns:**

        `(P, h)` of shapes `(gamma + 1,)` and `(gamma,)`.
        """
        if draft_probs is None:
            raise ValueError(
                "BlockRatioTest needs `draft_probs`: block verification uses the whole "
                "draft distributions q_k, which one-hot drafts do not have."
            )
        gamma = draft_tokens.shape[0]
        p_x, q_x = gather_draft_probs(
            draft_tokens, draft_probs, target_probs, log_space=self.log_space
        )
        cum = block_cumulative(p_x, q_x, self.log_space)
        # Z_k for k = 1 .. G-1 reads rows k of p and q.
        p_rows = target_probs[1:gamma].astype(cum.dtype)
        q_rows = draft_probs[1:gamma].astype(cum.dtype)
        if self.log_space:
            p_rows, q_rows = jnp.exp(p_rows), jnp.exp(q_rows)
        z = jnp.sum(jnp.maximum(cum[1:gamma, None] * p_rows - q_rows, 0), axis=-1)
        return cum, block_h(cum, z)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
    ) -> Verdict:
        cum, h = self.weights(draft_tokens, draft_probs, target_probs)
        passed = accept_uniforms.astype(h.dtype) < h
        return Verdict(passed, cum[:-1])
