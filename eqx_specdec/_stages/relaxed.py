"""Relaxed acceptance rules (lossy research knobs): top-N/delta acceptance under a
per-position mask, FLy's look-ahead test, and a schedule that mixes two tests by
generated position."""

from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Bool, Float, Int, jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    TargetProbsRow,
)
from .._misc import check_hyperparameter, no_type_check
from .acceptance import passes, threshold
from .ratio_test import AbstractRatioTest
from .row_context import ONE_DEVICE, RowContext
from .row_fields import per_row_values
from .threshold_rule import RatioTest
from .verdict import Verdict


def _rows_and_standard(draft_tokens, draft_probs, target_probs, u, context):
    """The target rows $p_0..p_{G-1}$ as probabilities, $p_i(x_i)$, and the standard
    test's outcomes (in the rows' own space, so that it is the standard test's bit for
    bit)."""
    p_x, q_x = context.gather(draft_tokens, draft_probs, target_probs)
    native = passes(p_x, q_x, u, context.log_space)
    probs = context.probabilities(target_probs[:-1])
    p_x = jnp.take_along_axis(probs, draft_tokens[:, None], axis=1)[:, 0]
    return probs, p_x, native


@no_type_check
class TopNRelaxedRatioTest(AbstractRatioTest):
    """Top-N / delta relaxed acceptance (TensorRT-LLM, for reasoning spans): where
    `relaxed` is true, draft token $x_i$ passes when it is among the `top_n` most likely
    tokens of $p_i$ and

    $$p_i(x_i) \\ge \\max_v p_i(v) - \\delta;$$

    elsewhere the standard test $u_i\\, q_i(x_i) < p_i(x_i)$ decides. **Lossy** where
    relaxed (no randomness: the draft token is kept when the target finds it nearly as
    likely as its favourite); the correction is the residual sampler's. Reads the whole
    rows $p_i$. Implements `pass_probabilities` (exact) and `quadrature_breakpoints`.

    **Arguments:**

    - `top_n`: $N \\ge 1$ (static). Default 10.
    - `delta`: $\\delta \\in [0, 1]$, a float or a scalar array. Default 0.6.
    - `relaxed`: where the relaxed rule applies: a bool (everywhere or nowhere), a
        boolean array of shape `(G,)` (by draft position, for every row), or `(B, G)`
        (by row and position, a reasoning span say). Default `True`.
    """

    exact: ClassVar[bool] = False
    uses_uniforms: ClassVar[bool] = True
    row_fields: ClassVar[dict[str, int]] = {"relaxed": 1}
    top_n: int = eqx.field(static=True, default=10)
    delta: Float[Array, ""] | float = 0.6
    relaxed: Bool[Array, "*B G"] | bool = True

    def __check_init__(self):
        if not isinstance(self.top_n, int) or self.top_n < 1:
            raise ValueError(
                f"TopNRelaxedRatioTest(`top_n`=...) must be an int >= 1, got "
                f"{self.top_n!r}."
            )
        check_hyperparameter("delta", self.delta, 0.0, 1.0, low_open=False)

    def _mask(self, gamma):
        relaxed = jnp.asarray(self.relaxed, jnp.bool_)
        if relaxed.ndim == 1 and relaxed.shape[0] != gamma:
            raise ValueError(
                f"TopNRelaxedRatioTest's `relaxed` has {relaxed.shape[0]} positions for "
                f"{gamma} draft positions: give shape ({gamma},) or (B, {gamma})."
            )
        return jnp.broadcast_to(relaxed, (gamma,))

    def _criterion(self, probs, values):
        """Whether each of `values` (`(G, K)` entries of the rows `probs`) is among the
        top N and within delta of the row's most likely token. Among the top N (fewer
        than N entries of its row exceed it) is at least the row's N-th largest entry
        (counted with ties): found by `top_k`, in O(V) memory, never a `(V, V)`
        comparison."""
        n = min(self.top_n, probs.shape[-1])
        nth = jax.lax.top_k(probs, n)[0][..., -1:]
        top = jnp.max(probs, axis=-1, keepdims=True)
        delta = jnp.asarray(self.delta, probs.dtype)
        return (values >= nth) & (values >= top - delta)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        probs, p_x, native = _rows_and_standard(
            draft_tokens, draft_probs, target_probs, accept_uniforms, context
        )
        relaxed = self._criterion(probs, p_x[:, None])[:, 0]
        return Verdict(jnp.where(self._mask(draft_tokens.shape[0]), relaxed, native))

    def pass_probabilities(self, draft_law, target_probs):
        criterion = self._criterion(target_probs, target_probs).astype(
            target_probs.dtype
        )
        mask = self._mask(draft_law.shape[0])[:, None]
        return jnp.where(
            mask, criterion, jnp.minimum(1, threshold(target_probs, draft_law))
        )

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}


@no_type_check
class FLyRatioTest(AbstractRatioTest):
    """FLy (Li et al., ICLR 2026), a look-ahead ratio test: a draft token the standard
    test rejects is accepted anyway when the target is uncertain there and the draft
    goes on well,

    $$H_i = -\\sum_{v \\in \\mathrm{top}_3(p_i)} p_i(v) \\log p_i(v) \\ge \\theta, \\qquad
    p_i(x_i) > 0, \\qquad i + W < G \\text{ and positions } i + 1, \\dots, i + W
    \\text{ pass the standard test.}$$

    **Lossy**. A position's outcome depends on the uniforms of the $W$ positions after
    it, so its pass probabilities are not independent: `pass_probabilities` gives the
    standard ones as a lower bound (FLy accepts at least as much). Exact quadrature
    applies (its outcomes change only at the standard ratios). Reads the whole rows.

    **Arguments:**

    - `theta`: $\\theta \\ge 0$, the entropy threshold. Default 0.3.
    - `window`: $W \\ge 1$ (static), the look-ahead. Default 6 (so a draft of
        $G \\le 6$ is verified as by the standard test).
    """

    exact: ClassVar[bool] = False
    uses_uniforms: ClassVar[bool] = True
    theory: ClassVar[Literal["exact", "lower bound"]] = "lower bound"
    theta: Float[Array, ""] | float = 0.3
    window: int = eqx.field(static=True, default=6)

    def __check_init__(self):
        check_hyperparameter("theta", self.theta, 0.0, float("inf"), low_open=False)
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(
                f"FLyRatioTest(`window`=...) must be an int >= 1, got {self.window!r}."
            )

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        probs, p_x, native = _rows_and_standard(
            draft_tokens, draft_probs, target_probs, accept_uniforms, context
        )
        top = jax.lax.top_k(probs, min(3, probs.shape[-1]))[0]
        logs = jnp.log(jnp.where(top > 0, top, 1))
        entropy = -jnp.sum(top * logs, axis=-1)
        gamma, window = draft_tokens.shape[0], self.window
        failures = jnp.cumsum((~native).astype(jnp.int32))
        positions = jnp.arange(gamma)
        last = jnp.minimum(positions + window, gamma - 1)
        ahead_pass = (positions + window < gamma) & (failures[last] == failures)
        theta = jnp.asarray(self.theta, entropy.dtype)
        rescued = (entropy >= theta) & (p_x > 0) & ahead_pass
        return Verdict(native | rescued)

    def pass_probabilities(self, draft_law, target_probs):
        return jnp.minimum(1, threshold(target_probs, draft_law))

    def quadrature_breakpoints(self, draft_probs, target_probs):
        return {}


@no_type_check
class ScheduledRatioTest(AbstractRatioTest):
    """A schedule of two ratio tests by generated position: `strict` for the first
    `strict_tokens` tokens of a response, `relaxed` after (exact verification while a
    response sets its course, a relaxed rule once it is under way). Draft position $i$
    of a row that has generated $g$ tokens is the response's token $g + i$.

    In [`eqx_specdec.speculative_decode`][] the loop sets $g$ for every row at every
    step (`in_decoding_loop`). For one step, give it as `generated`. Lossless where
    `strict` runs, if `strict` is; each position takes the verdict of its test, and the
    correction at the first rejected position is that position's test's (a threshold
    rule's derived correction, or the standard one).

    **Arguments:**

    - `strict`: the test for the first tokens. Default [`eqx_specdec.RatioTest`][].
    - `relaxed`: the test after. Default [`eqx_specdec.TopNRelaxedRatioTest`][].
    - `strict_tokens`: $L \\ge 0$, an int or a scalar array. Default 0.
    - `generated`: $g$, an int, or an integer array of shape `(B,)` (one per row).
        Default 0.
    """

    strict: AbstractRatioTest = RatioTest()
    relaxed: AbstractRatioTest = TopNRelaxedRatioTest()
    strict_tokens: Int[Array, ""] | int = 0
    generated: Int[Array, "*B"] | int = 0
    exact: ClassVar[bool] = False
    uses_uniforms: ClassVar[bool] = True
    row_fields: ClassVar[dict[str, int]] = {"generated": 0}
    vocab_parallel: ClassVar[bool] = True
    capabilities_from: ClassVar[dict[str, tuple[tuple[str, str], ...]]] = {
        name: (("strict", name), ("relaxed", name))
        for name in ("pass_probabilities", "quadrature_breakpoints", "vocab_parallel")
    }

    def __check_init__(self):
        for name in ("strict", "relaxed"):
            test = getattr(self, name)
            if not isinstance(test, AbstractRatioTest):
                raise TypeError(
                    f"ScheduledRatioTest(`{name}`=...) must be an "
                    f"eqx_specdec.AbstractRatioTest, got {type(test).__name__}."
                )
            if per_row_values(test):
                raise ValueError(
                    f"ScheduledRatioTest(`{name}`=...) has per-row fields; give them to "
                    "the schedule's tests shared by the batch (without the batch axis)."
                )
        check_hyperparameter(
            "strict_tokens", self.strict_tokens, 0.0, float("inf"), low_open=False
        )

    def _strict_here(self, gamma):
        first = jnp.asarray(self.generated, jnp.int32) + jnp.arange(
            gamma, dtype=jnp.int32
        )
        return first < jnp.asarray(self.strict_tokens, jnp.int32)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        inputs = (draft_tokens, draft_probs, target_probs, accept_uniforms, context)
        exact, relaxed = self.strict(*inputs), self.relaxed(*inputs)
        here = self._strict_here(draft_tokens.shape[0])
        scale = jnp.where(here, exact.residual_scale, relaxed.residual_scale)
        rule = None
        if exact.rule is not None or relaxed.rule is not None:
            # The correction at the first failure n follows the test of position n.
            passed = jnp.where(here, exact.passed, relaxed.passed)
            n = jnp.sum(jnp.cumprod(passed.astype(jnp.int32)))
            at = jnp.minimum(n, draft_tokens.shape[0] - 1)
            rule = _ScheduledCorrection(exact.rule, relaxed.rule, here[at])
        return Verdict(jnp.where(here, exact.passed, relaxed.passed), scale, rule)

    @property
    def theory(self) -> Literal["exact", "lower bound"]:
        """Exact when both tests' pass probabilities are (static: read from their
        classes)."""
        both = (self.strict.theory, self.relaxed.theory)
        return "exact" if both == ("exact", "exact") else "lower bound"

    def pass_probabilities(self, draft_law, target_probs):
        exact = self.strict.pass_probabilities(draft_law, target_probs)
        relaxed = self.relaxed.pass_probabilities(draft_law, target_probs)
        here = self._strict_here(draft_law.shape[0])[:, None]
        return jnp.where(here, exact, relaxed)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        merged = {}
        for test in (self.strict, self.relaxed):
            for key, value in test.quadrature_breakpoints(
                draft_probs, target_probs
            ).items():
                merged.setdefault(key, []).append(value)
        axis = {"accept_breakpoints": 1, "sample_breakpoints": 0}
        return {k: np.concatenate(v, axis=axis[k]) for k, v in merged.items()}

    def in_decoding_loop(self, generated):
        return eqx.tree_at(lambda t: t.generated, self, generated)


class _ScheduledCorrection(eqx.Module):
    """The correction of a schedule's verdict: at the first rejected position, the
    derived correction of the test that decided there (`None`: the standard one,
    which subtracts $q$ whole, as an acceptance $t = +\\infty$ would)."""

    strict: eqx.Module | None
    relaxed: eqx.Module | None
    strict_here: Bool[Array, ""]
    exact: ClassVar[bool] = False  # a schedule's bound is not checked at run time
    proven: ClassVar[bool] = False

    def acceptance(self, target, draft, context=ONE_DEVICE):
        def of(rule):
            if rule is None:
                return jnp.full(target.shape, jnp.inf, target.dtype)
            return rule.acceptance(target, draft, context).astype(target.dtype)

        return jnp.where(self.strict_here, of(self.strict), of(self.relaxed))
