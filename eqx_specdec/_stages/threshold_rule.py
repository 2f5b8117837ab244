"""Threshold rules: an acceptance rule written once, as its acceptance function, and
everything the library derives from it (the verdict, the exact correction, the pass
probabilities, the quadrature's cuts, the closed-form emission and the tree form); the
standard and lenient tests as such rules."""

import abc
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Bool, Float, jaxtyped

from .._custom_types import (
    AcceptUniformsRow,
    DraftProbsRow,
    DraftTokensRow,
    TargetProbsRow,
)
from .._kernels import leading_cutoffs
from .._misc import check_hyperparameter
from .._platform import on_tpu
from .acceptance import accepted_mass, passes, threshold, Values
from .ratio_test import AbstractRatioTest
from .row_context import ONE_DEVICE, RowContext
from .verdict import Verdict


class AbstractThresholdRule(AbstractRatioTest):
    """An acceptance rule written once, as its acceptance function: draft token $x$ is
    accepted with probability

    $$a(x) = \\min\\Big(1, \\frac{t(x)}{q(x)}\\Big),$$

    where $t$ = `acceptance(p, q, context)` is computed from the target and draft rows.
    The standard rule is $t = p$; a capped rule $t = c\\,p$; lenient acceptance
    $t = p / l$. Everything else follows from $t$, and is derived by the library:

    - the verdict, $u_i\\, q_i(x_i) < t_i(x_i)$ (in log space
        $\\log u_i < \\log t_i(x_i) - \\log q_i(x_i)$), division-free as the contract's
        standard test;
    - the exact correction: an accepted token carries mass $q \\cdot a = \\min(q, t)$,
        so the correction is drawn from
        $\\operatorname{norm}\\big((p - \\min(q, t))_+\\big)$ (from $p$ when that has no
        mass), and the emitted token follows $p$ exactly when $\\min(q, t) \\le p$
        everywhere;
    - `pass_probabilities` ($a$ itself), the quadrature's cuts ($u = t/q$), the
        closed-form emission of each position at any vocabulary size
        ([`eqx_specdec.evaluation.emission_in_closed_form`][]), and the tree form
        ([`eqx_specdec.IIDCandidates`][]`(rule)`,
        [`eqx_specdec.WithoutReplacementCandidates`][]`(rule)`: the same $a$ against
        each node's running residual).

    **Exactness is derived, and checked.** A threshold rule is exact by construction,
    with its derived correction, whenever $\\min(q, t) \\le p$; with the input checks on
    (the default), the entry points check that bound on every row $n$ the correction is
    drawn from, and raise (`RESULTS.not_exact`) naming the rule where it
    fails. A rule that accepts more than the target holds on purpose declares
    `exact = False` (lenient acceptance): it is then lossy by declaration, and its
    derived correction is the closest to $p$ that its acceptance allows (total
    variation $\\sum_v (\\min(q, t) - p)_+$).

    **Implemented by every subclass:** `acceptance`.

    **Declared with a default** (class attributes):

    - `exact` (default `True`): `False` for a rule lossy on purpose.
    - `proven` (default `False`): `True` when $\\min(q, t) \\le p$ holds for every
        input by construction (the library's standard rule: $\\min(q, p) \\le p$), so
        the run-time check of the bound is skipped.
    - `vocab_parallel`, `causal` and `reads` are those of an elementwise acceptance:
        `True`, `True` and `"draft tokens"` (the verdict reads $p_i(x_i)$ and
        $q_i(x_i)$ alone, $O(G)$ reads, on any slice of the vocabulary).

    The acceptance is elementwise: $t(v)$ from $p(v)$ and $q(v)$ at the same token. A
    rule that reads whole rows (a top-$k$ condition, an entropy) subclasses
    [`eqx_specdec.AbstractRatioTest`][].

    A rule whose acceptance is not of this form (block verification, typical
    acceptance) subclasses [`eqx_specdec.AbstractRatioTest`][] instead.
    """

    exact: ClassVar[bool] = True
    proven: ClassVar[bool] = False
    vocab_parallel: ClassVar[bool] = True
    causal: ClassVar[bool] = True
    reads: ClassVar[Literal["draft tokens", "argmax", "whole rows"]] = "draft tokens"

    @abc.abstractmethod
    def acceptance(
        self, target: Values, draft: Values, context: RowContext = ONE_DEVICE
    ) -> Values:
        """The rule's acceptance $t$: token $v$ drafted from $q$ is accepted with
        probability $\\min(1, t(v) / q(v))$.

        **Arguments:**

        - `target`: $p$ at some tokens (values of any shape), in the context's space.
        - `draft`: $q$ at the same tokens, in the same space (1, or 0 in log space, at
            a one-hot draft's token).
        - `context`: the [`eqx_specdec.RowContext`][]: `context.log_space` says
            whether the values are log-probabilities (then return $\\log t$);
            [`eqx_specdec.RowContext.times`][] scales a value in either space.

        **Returns:**

        $t$, of the shape of `target`, in the same space.
        """

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        draft_tokens: DraftTokensRow,
        draft_probs: DraftProbsRow | None,
        target_probs: TargetProbsRow,
        accept_uniforms: AcceptUniformsRow,
        context: RowContext = ONE_DEVICE,
    ) -> Verdict:
        p_x, q_x = context.gather(draft_tokens, draft_probs, target_probs)
        t_x = self.acceptance(p_x, q_x, context)
        t_x = t_x.astype(p_x.dtype)
        return Verdict(passes(t_x, q_x, accept_uniforms, context.log_space), rule=self)

    def accepted(self, target: Values, draft: Values) -> Values:
        """$q \\cdot a = \\min(q, t)$ on probability rows: the mass the rule accepts at
        each token (what the correction subtracts from $p$)."""
        return accepted_mass(draft, self.acceptance(target, draft, ONE_DEVICE))

    def excess(self, target: Values, draft: Values) -> Bool[Array, "..."]:
        """Whether the rule accepts more of some token than the target holds,
        $\\min(q, t) > p$ (beyond rounding), per row of probability rows `(..., V)`:
        where it does, the derived correction cannot make the rule exact."""
        over = self.accepted(target, draft) - target
        tolerance = 16 * jnp.finfo(target.dtype).eps * jnp.maximum(target, 1e-30)
        return jnp.any(over > tolerance, axis=-1)

    def normalise_pass(
        self,
        draft_tokens,
        draft_rows,
        target_rows,
        accept_uniforms,
        context=ONE_DEVICE,
        *,
        kernel=False,
    ):
        """With `kernel`, where it fits (warped float32 logits without greedy rows,
        over the whole vocabulary, a rule holding no array), by the Pallas kernel that
        reads each sequence's rows one position after another, decides the rule there
        from its `acceptance`, and reads no row after the first failure."""
        if (
            not kernel
            or context.shard is not None
            or not context.log_space
            or jax.tree.leaves(eqx.filter(self, eqx.is_array))
            or not leading_cutoffs.fits(draft_rows, target_rows)
        ):
            return None

        def acceptance(log_p, log_q):
            return self.acceptance(log_p, log_q, context)

        return leading_cutoffs.normalised_until_failure(
            draft_tokens,
            draft_rows,
            target_rows,
            accept_uniforms,
            acceptance,
            interpret=not on_tpu(),
        )

    def pass_probabilities(self, draft_law, target_probs):
        t = self.acceptance(target_probs, draft_law, ONE_DEVICE)
        return jnp.minimum(1.0, threshold(t, draft_law)).astype(target_probs.dtype)

    def quadrature_breakpoints(self, draft_probs, target_probs):
        p = target_probs[:-1]
        # One-hot drafts: q = onehot(v) at whichever token v is drafted, so the cut of
        # v is at t(v) / 1, and each v has a correction of its own.
        q = np.ones_like(p) if draft_probs is None else draft_probs
        t = self.acceptance(jnp.asarray(p), jnp.asarray(q), ONE_DEVICE)
        t = np.asarray(t, np.float64)
        cuts = np.asarray(threshold(jnp.asarray(t), jnp.asarray(q)), np.float64)
        if draft_probs is None:
            drafted = np.eye(p.shape[1])[None, :, :]  # (1, v, V): q = onehot(v)
            kept = np.maximum(p[:, None, :] - np.minimum(drafted, t[:, None, :]), 0)
        else:
            kept = np.maximum(p - np.minimum(q, t), 0)
        total = kept.sum(-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            cdfs = np.cumsum(kept, -1) / total
        return dict(
            accept_breakpoints=cuts,
            sample_breakpoints=cdfs[np.broadcast_to(total > 0, cdfs.shape)],
        )


class RatioTest(AbstractThresholdRule):
    """The standard test of speculative sampling, the threshold rule $t = p$: draft
    token $x_i$ passes when

    $$u_i \\, q_i(x_i) < p_i(x_i),$$

    that is $u_i < p_i(x_i) / q_i(x_i)$ computed without division, so that
    $q_i(x_i) = 0 < p_i(x_i)$ passes and $p_i(x_i) = 0$ never passes. With
    `draft_probs=None`, $q_i(x_i) = 1$ (one-hot drafts): the test is $u_i < p_i(x_i)$.
    On log-probabilities (logits given to the entry point) the test is
    $\\log u_i < \\log p_i(x_i) - \\log q_i(x_i)$, exact where probabilities would
    underflow. Its correction is $\\operatorname{norm}((p_n - q_n)_+)$.

    Lossless (Leviathan et al. 2023; Chen et al. 2023), provably: $\\min(q, p) \\le p$.
    Gathers only $p_i(x_i)$ and $q_i(x_i)$: $O(G)$ reads.
    """

    proven: ClassVar[bool] = True

    def acceptance(self, target, draft, context=ONE_DEVICE):
        return target


class LenientRatioTest(AbstractThresholdRule):
    """A lenient test, accepting more draft tokens than the standard one, the threshold
    rule $t = p / l$: $x_i$ passes when

    $$u_i < \\frac{p_i(x_i)}{l\\, q_i(x_i)}, \\quad l \\in (0, 1].$$

    $l = 1$ is the standard rule. For $l < 1$ the verifier is **lossy** (it accepts
    $\\min(q, p/l) > p$ wherever $p < q$): the emitted tokens drift from the target as
    $l$ falls, by exactly $\\sum_v (\\min(q, p/l) - p)_+$ in total variation, the least
    any correction allows. Its derived correction,
    $\\operatorname{norm}((p - \\min(q, p/l))_+)$, is the standard one,
    $\\operatorname{norm}((p - q)_+)$: where $p < q$ neither leaves anything.

    **Arguments:**

    - `lenience`: $l$, a float or a scalar array in $(0, 1]$. A Python float is static
        (each value compiles once); pass an array to sweep it without recompiling.
    """

    exact: ClassVar[bool] = False
    lenience: Float[Array, ""] | float = 1.0

    def __check_init__(self):
        check_hyperparameter("lenience", self.lenience, 0.0, 1.0, low_open=True)

    def acceptance(self, target, draft, context=ONE_DEVICE):
        return context.times(target, 1 / jnp.asarray(self.lenience, target.dtype))


def is_threshold_rule(stage) -> bool:
    """Whether `stage` is a threshold rule (its law derived from its acceptance)."""
    return isinstance(stage, AbstractThresholdRule)
