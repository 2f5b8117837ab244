"""How the candidate children of a tree node are tried: the node rules."""

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractClassVar
from jaxtyping import Array, Bool, Float, Int, PyTree

from .._capabilities import capability
from .._search import has_mass
from .._stages.acceptance import accepted_mass, passes, threshold
from .._stages.row_context import ONE_DEVICE
from .._stages.threshold_rule import AbstractThresholdRule, RatioTest
from .optimal import optimal_acceptance


Row = Float[Array, " V"]
Scalar = Float[Array, ""]
NodeRuleState = PyTree[Array]


class ResidualState(eqx.Module):
    """The state of the rules that keep an evolving target and draft (every built-in
    rule but [`eqx_specdec.SpecTrKSeq`][] and [`eqx_specdec.ImportanceSampling`][]):
    the target $p^{(k)} = $ `residual / mass` and the draft $q^{(k)}$ against which the
    $k$-th child is tried. The default state of
    [`eqx_specdec.AbstractNodeRule.init`][].

    **Fields:**

    - `residual`: float `(V,)`, the evolving target, unnormalised.
    - `mass`: float scalar, its total.
    - `draft`: float `(V,)`, the evolving draft (zeros for rules without one).
    """

    residual: Row
    mass: Scalar
    draft: Row


class AbstractNodeRule(eqx.Module):
    """How the candidate children of one tree node are tried, in order.

    At a node with target $p$ and draft $q$, the rule's `init` builds a state from
    $p$, $q$ and the node's children; the children $c_1, \\dots, c_K$ are then tested
    one after the other (`test`), each failure updating the state (`reject`). The
    first to pass is accepted and the walk descends into it; if all fail, the
    correction is drawn from the rule's `correction` of the final state.

    The state is any PyTree of arrays the rule chooses (as an Optimistix solver's
    state). By default it is a [`eqx_specdec.ResidualState`][]: an evolving target
    $p^{(k)}$ (and draft $q^{(k)}$) against which the $k$-th child is tested, and
    from which the correction is drawn. A rule whose test depends on the whole set of
    siblings (as [`eqx_specdec.ImportanceSampling`][]'s does), or on their number (as
    [`eqx_specdec.SpecTrKSeq`][]'s does), reads them in `init`.

    **Declared by every subclass:** `exact` (class attribute): whether the rule is
    exact (the emitted tokens follow the target exactly when children are drafted from
    its `candidate_law`); `uses_draft_probs` (class attribute): whether the rule reads
    the draft distributions (if not, `draft_probs` may be `None`); `ratio` (the test
    of a candidate, stated once: the walk's division-free `test` and exact
    evaluation's `pass_threshold` are derived from it) and `reject`.

    **Capabilities** (defaults raise [`eqx_specdec.MissingCapabilityError`][]):
    `candidate_law` (how the decoding loop and the evaluation tools draft a node's
    children), `optimal_acceptance` (the best acceptance of the rule's draft law,
    reported by [`eqx_specdec.evaluation.evaluate_verifier`][]).

    A rule that accepts a child with a probability computed from the node's target and
    draft is a threshold rule: write it once as an
    [`eqx_specdec.AbstractThresholdRule`][] and get its tree form from
    [`eqx_specdec.IIDCandidates`][]`(rule)` or
    [`eqx_specdec.WithoutReplacementCandidates`][]`(rule)`, with no node rule to write.

    A rule may accept a child after an earlier sibling failed by testing it against the
    residual (as [`eqx_specdec.GreedyMultiDraft`][] does): a draw from the residual that
    lands on a drafted child is the same, in distribution, as testing the drafted
    children one by one against it.
    """

    exact: AbstractClassVar[bool]
    uses_draft_probs: AbstractClassVar[bool]

    def init(
        self,
        target: Row,
        draft: Row,
        tokens: Int[Array, " nodes"],
        siblings: Bool[Array, " nodes"],
    ) -> NodeRuleState:
        """The state at a node, before its first child is tried.

        **Arguments:**

        - `target`: float `(V,)`, the target's distribution $p$ after the node.
        - `draft`: float `(V,)`, the draft's $q$ after the node (zeros for rules
            without `uses_draft_probs`).
        - `tokens`: int32 `(N,)`, the token of every node of the tree.
        - `siblings`: boolean `(N,)`, which nodes are this node's children; in index
            order, they are the order the children are tried in.

        **Returns:**

        The rule's state, a PyTree of arrays. By default
        `ResidualState(target, 1, draft)`.
        """
        del tokens, siblings
        return ResidualState(target, jnp.ones((), target.dtype), draft)

    @abc.abstractmethod
    def ratio(
        self, state: NodeRuleState, token: Int[Array, ""], child: Int[Array, ""]
    ) -> tuple[Scalar, Scalar]:
        """The rule's test of one candidate, stated once: the candidate passes with
        uniform $u$ when $u < \\text{numerator} / \\text{denominator}$. The walk
        tests it without division (`test`), and exact evaluation cuts the uniforms at
        the ratio (`pass_threshold`); both are derived from this.

        **Arguments:**

        - `state`: the rule's state: from `init` for a node's first child, from
            `reject` after.
        - `token`: the candidate $c_k$.
        - `child`: $k - 1$, which sibling this is: 0 for the node's first child, 1 for
            the child tried after it failed, and so on (int32 scalar).

        **Returns:**

        `(numerator, denominator)`, two float scalars $\\ge 0$ (for the standard rule,
        $p^{(k)}(c_k)$ and $q^{(k)}(c_k)$).
        """

    def test(
        self,
        state: NodeRuleState,
        token: Int[Array, ""],
        uniform: Scalar,
        child: Int[Array, ""],
    ) -> Bool[Array, ""]:
        """Whether candidate `token` passes with uniform $u$ = `uniform`:
        $u \\cdot \\text{denominator} < \\text{numerator}$ from `ratio`."""
        numerator, denominator = self.ratio(state, token, child)
        return passes(numerator, denominator, uniform, log_space=False)

    @abc.abstractmethod
    def reject(
        self, state: NodeRuleState, token: Int[Array, ""], child: Int[Array, ""]
    ) -> NodeRuleState:
        """The state after candidate `token` failed.

        **Arguments:**

        - as for `test`, without the uniform.

        **Returns:**

        The next state, of the same structure.
        """

    def correction(self, state: NodeRuleState) -> Row:
        """The (unnormalised) distribution the correction is drawn from when every
        child of the node failed (or the node has none).

        **Arguments:**

        - `state`: the final state.

        **Returns:**

        A float `(V,)` row. By default `state.residual`.
        """
        return state.residual

    @capability
    def candidate_law(self, draft: Row, drafted: Bool[Array, " V"]) -> Row:
        """Capability for drafting trees (in [`eqx_specdec.speculative_decode`][] and
        the evaluation tools): the law of a node's next child, given the draft's
        distribution at the node and the tokens of the siblings already drafted. A
        one-hot law is a deterministic choice. Traced.

        **Arguments:**

        - `draft`: float `(vocab,)`, the draft's distribution $q$ at the node.
        - `drafted`: boolean `(vocab,)`, the tokens of the earlier siblings.

        **Returns:**

        A float `(vocab,)` distribution (summing to 1).
        """

    @capability
    def optimal_acceptance(self, target: Row, draft: Row, num_children: int) -> Scalar:
        """Capability for [`eqx_specdec.evaluation.evaluate_verifier`][]: $\\alpha^*$, the best
        probability of accepting some child that any lossless verifier reaches when
        `num_children` children are drafted as this rule drafts them (see
        [`eqx_specdec.evaluation.optimal_acceptance`][]). Traced.

        **Arguments:**

        - `target`, `draft`: float `(vocab,)`, $p$ and $q$ at the node.
        - `num_children`: the number of children $K$, a Python int.

        **Returns:**

        A float scalar.
        """

    def pass_threshold(
        self, state: NodeRuleState, token: Int[Array, ""], child: Int[Array, ""]
    ) -> Scalar:
        """For exact evaluation of trees ([`eqx_specdec.evaluation.emission_by_quadrature`][]
        with a tree): the value $t$ such that `test(state, token, u, child)` passes
        exactly when $u < t$, from `ratio` ($+\\infty$ allowed)."""
        return threshold(*self.ratio(state, token, child))


def _subtract(residual, mass, accepted):
    """The residual after a rejection, `(p - accepted)_+` with `p = residual / mass`,
    kept unnormalised; unchanged if nothing would remain."""
    new = jnp.maximum(residual / mass - accepted, 0)
    new_mass = jnp.sum(new)
    keep = has_mass(new_mass, residual.dtype)
    return jnp.where(keep, new, residual), jnp.where(keep, new_mass, mass)


class _IIDDrafting(AbstractNodeRule):
    """The drafting of rules whose children are drawn i.i.d. from $q$, and the optimum
    of that draft law."""

    def candidate_law(self, draft, drafted):
        return draft

    def optimal_acceptance(self, target, draft, num_children):
        return optimal_acceptance(target, draft, num_children, drafting="iid")


class _ThresholdAgainstResidual(AbstractNodeRule):
    """A threshold rule's tree form: the $k$-th child is tested by the rule's
    acceptance against the running target $p^{(k)} = $ `residual / mass` and draft
    $q^{(k)}$, passing when $u\\, q^{(k)}(c) < t^{(k)}(c)$; a rejection leaves
    $p^{(k+1)} = \\operatorname{norm}((p^{(k)} - \\min(q^{(k)}, t^{(k)}))_+)$."""

    rule: AbstractThresholdRule = RatioTest()
    uses_draft_probs: ClassVar[bool] = True

    def __check_init__(self):
        if not isinstance(self.rule, AbstractThresholdRule):
            raise TypeError(
                f"{type(self).__name__}(`rule`=...) must be an "
                "eqx_specdec.AbstractThresholdRule (a rule given by its acceptance "
                f"function), got {type(self.rule).__name__}."
            )

    @property
    def exact(self) -> bool:
        """Whether the rule is exact: its threshold rule's `exact`."""
        return self.rule.exact

    def _acceptance(self, state, token=None):
        """$t^{(k)}$ at `token` (every token when `None`), on probabilities."""
        target, draft = state.residual / state.mass, state.draft
        if token is not None:
            target, draft = target[token], draft[token]
        return self.rule.acceptance(target, draft, ONE_DEVICE)

    def ratio(self, state, token, child):
        return self._acceptance(state, token), state.draft[token]

    def _rejected(self, state):
        """The residual and mass after a rejection."""
        accepted = accepted_mass(state.draft, self._acceptance(state))
        return _subtract(state.residual, state.mass, accepted)


class IIDCandidates(_IIDDrafting, _ThresholdAgainstResidual):
    """Candidates drawn i.i.d. from the draft $q$ at the node, tested one by one by a
    threshold rule against the running residual: accept $c_k$ if
    $u_k\\, q(c_k) < t^{(k)}(c_k)$, with $t^{(k)}$ the rule's acceptance on
    $(p^{(k)}, q)$; else $p^{(k+1)} = \\operatorname{norm}((p^{(k)} - \\min(q, t^{(k)}))_+)$.
    With the standard rule (the default), SpecInfer's (Miao et al. 2024): accept
    $c_k$ if $u_k < p^{(k)}(c_k) / q(c_k)$, else $p^{(k+1)} = \\operatorname{norm}((p^{(k)} - q)_+)$.

    Exact whenever the rule is: every child's accepted mass is then at most the
    residual it is tested against. On a chain-shaped tree it gives the chain's tokens
    with the same rule ([`eqx_specdec.Verifier`][]`(rule)`).

    **Arguments:**

    - `rule`: an [`eqx_specdec.AbstractThresholdRule`][]. Default
        [`eqx_specdec.RatioTest`][].
    """

    def reject(self, state, token, child):
        residual, mass = self._rejected(state)
        return ResidualState(residual, mass, state.draft)


class WithoutReplacementCandidates(_ThresholdAgainstResidual):
    """Candidates drawn from $q$ without replacement (Jeon et al. 2024): as
    [`eqx_specdec.IIDCandidates`][], with the draft updated after each rejection,
    $q^{(k+1)}(v) = q^{(k)}(v)\\,[v \\ne c_k] / (1 - q^{(k)}(c_k))$. Exact whenever
    its rule is (the standard rule by default).

    **Arguments:**

    - `rule`: an [`eqx_specdec.AbstractThresholdRule`][]. Default
        [`eqx_specdec.RatioTest`][].
    """

    def candidate_law(self, draft, drafted):
        remaining = jnp.where(drafted, 0, draft)
        total = jnp.sum(remaining)
        return jnp.where(total > 0, remaining / jnp.where(total > 0, total, 1), draft)

    def optimal_acceptance(self, target, draft, num_children):
        return optimal_acceptance(
            target, draft, num_children, drafting="without replacement"
        )

    def reject(self, state, token, child):
        residual, mass = self._rejected(state)
        draft = state.draft
        ids = jnp.arange(draft.shape[0], dtype=jnp.int32)
        remaining = 1 - draft[token]
        draft = jnp.where(
            (ids == token) | (remaining <= 0),
            0,
            draft / jnp.where(remaining > 0, remaining, 1),
        )
        return ResidualState(residual, mass, draft)


class DeterministicCandidates(AbstractNodeRule):
    """Distinct children chosen deterministically (top-$k$ trees, EAGLE-2-style; no $q$):
    accept $c_k$ if $u_k < p^{(k)}(c_k)$; else zero $c_k$ in $p^{(k)}$. The probability
    that some child is accepted is $\\sum_k p(c_k)$. Lossless for any distinct children
    fixed by the draft (whatever rule picked them: the draft's top-$k$, or
    [`eqx_specdec.DynamicTree`][]'s best-first expansion). Its `candidate_law` is the
    draft's most likely tokens, in order (one-hot)."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = False

    def candidate_law(self, draft, drafted):
        best = jnp.argmax(jnp.where(drafted, -1, draft))
        return jax.nn.one_hot(best, draft.shape[0], dtype=draft.dtype)

    def optimal_acceptance(self, target, draft, num_children):
        # A deterministic set D: P(S in H) is 1 when H holds D, else 0, so alpha* = p(D).
        return jnp.sum(jnp.where(_top_mask(draft, num_children), target, 0))

    def ratio(self, state, token, child):
        return state.residual[token], state.mass

    def reject(self, state, token, child):
        residual, mass = _without_token(state.residual, state.mass, token)
        return ResidualState(residual, mass, state.draft)


def _without_token(residual, mass, token):
    """The residual with `token`'s entry zeroed (unchanged if nothing would remain)."""
    rest = jnp.where(
        jnp.arange(residual.shape[0], dtype=jnp.int32) == token, 0, residual
    )
    rest_mass = jnp.sum(rest)
    keep = has_mass(rest_mass, residual.dtype)
    return jnp.where(keep, rest, residual), jnp.where(keep, rest_mass, mass)


def _top_mask(draft, k: int):
    """The draft's `k` most likely tokens (ties: the lowest ids), as a boolean mask."""
    if k <= 0:
        return jnp.zeros(draft.shape, bool)
    _, top = jax.lax.top_k(draft, k)
    return jnp.zeros(draft.shape, bool).at[top].set(True)


def _restricted(draft, excluded):
    """`draft` restricted to the tokens not `excluded`, renormalised (zeros if none)."""
    rest = jnp.where(excluded, 0, draft)
    total = jnp.sum(rest)
    return rest / jnp.where(total > 0, total, 1)
