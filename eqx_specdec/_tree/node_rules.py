"""How the candidate children of a tree node are tried: the node rules."""

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractClassVar
from jaxtyping import Array, Bool, Float, Int

from .._capabilities import capability
from .._search import has_mass
from .optimal import optimal_acceptance


Row = Float[Array, " V"]
Scalar = Float[Array, ""]


class AbstractNodeRule(eqx.Module):
    """How the candidate children of one tree node are tried, in order.

    At a node with target $p$ the candidates $c_1, \\dots, c_K$ are tested one after the
    other against an evolving target $p^{(k)}$ (and, for some rules, an evolving draft
    $q^{(k)}$). The first to pass is accepted and the walk descends into it; if all fail,
    the correction is drawn from the final $p^{(K+1)}$.

    The evolving target is kept unnormalised, as `residual` with total `mass`:
    $p^{(k)} = \\text{residual} / \\text{mass}$.

    **Declared by every subclass:** `exact` (class attribute): whether the rule is
    exact (the emitted tokens follow the target exactly when children are drafted from
    its `candidate_law`); `uses_draft_probs` (class attribute): whether the rule reads
    the draft distributions (if not, `draft_probs` may be `None`).

    **Capabilities** (defaults raise [`eqx_specdec.MissingCapabilityError`][]):
    `candidate_law` (how the decoding loop and the evaluation tools draft a node's
    children), `pass_threshold` (exact evaluation of trees), `optimal_acceptance` (the
    best acceptance of the rule's draft law, reported by
    [`eqx_specdec.evaluate_verifier`][]).

    A rule may accept a child after an earlier sibling failed by testing it against the
    residual (as [`eqx_specdec.GreedyMultiDraft`][] does): a draw from the residual that
    lands on a drafted child is the same, in distribution, as testing the drafted
    children one by one against it.
    """

    exact: AbstractClassVar[bool]
    uses_draft_probs: AbstractClassVar[bool]

    @abc.abstractmethod
    def test(
        self,
        residual: Row,
        mass: Scalar,
        draft: Row,
        token: Int[Array, ""],
        uniform: Scalar,
        child: Int[Array, ""],
    ) -> Bool[Array, ""]:
        """Whether candidate `token` passes, given the evolving state.

        **Arguments:**

        - `residual`, `mass`: the evolving target, $p^{(k)} = $ `residual / mass`. At
            a node's first child (`child == 0`) they are the target's row after the
            node, unnormalised only by rounding (`mass` is 1).
        - `draft`: the evolving draft $q^{(k)}$ (zeros for rules without one); at the
            first child, the draft's row after the node.
        - `token`: the candidate $c_k$.
        - `uniform`: its uniform $u_k$.
        - `child`: $k - 1$, which sibling this is: 0 for the node's first child, 1 for
            the child tried after it failed, and so on (int32 scalar).

        **Returns:**

        A boolean scalar.
        """

    @abc.abstractmethod
    def reject(
        self,
        residual: Row,
        mass: Scalar,
        draft: Row,
        token: Int[Array, ""],
        child: Int[Array, ""],
    ) -> tuple[Row, Scalar, Row]:
        """The state after candidate `token` failed: `(residual, mass, draft)`.

        **Arguments:**

        - as for `test`, without the uniform.

        **Returns:**

        The next `(residual, mass, draft)`.
        """

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
        """Capability for [`eqx_specdec.evaluate_verifier`][]: $\\alpha^*$, the best
        probability of accepting some child that any lossless verifier reaches when
        `num_children` children are drafted as this rule drafts them (see
        [`eqx_specdec.optimal_acceptance`][]). Traced.

        **Arguments:**

        - `target`, `draft`: float `(vocab,)`, $p$ and $q$ at the node.
        - `num_children`: the number of children $K$, a Python int.

        **Returns:**

        A float scalar.
        """

    @capability
    def pass_threshold(
        self,
        residual: Row,
        mass: Scalar,
        draft: Row,
        token: Int[Array, ""],
        child: Int[Array, ""],
    ) -> Scalar:
        """Capability for exact evaluation of trees
        ([`eqx_specdec.emission_by_quadrature`][] with a tree): the value $t$ such that
        `test(residual, mass, draft, token, u, child)` passes exactly when $u < t$.
        Traced.

        **Arguments:**

        - as for `test`, without the uniform.

        **Returns:**

        A float scalar ($+\\infty$ allowed).
        """


def _passes(residual, mass, draft, token, uniform):
    """$u\\, q(c) < p^{(k)}(c)$, with $p^{(k)} = $ `residual / mass`."""
    return uniform.astype(residual.dtype) * draft[token] * mass < residual[token]


def _threshold(residual, mass, draft, token):
    """`residual[c] / (mass q(c))`: where `_passes` flips (+inf where q(c) = 0)."""
    denominator = mass * draft[token]
    return jnp.where(
        denominator > 0,
        residual[token] / jnp.where(denominator > 0, denominator, 1),
        jnp.inf,
    )


def _subtract(residual, mass, draft):
    """`norm((p - q)_+)` kept unnormalised; unchanged if nothing would remain."""
    new = jnp.maximum(residual - mass * draft, 0)
    new_mass = jnp.sum(new)
    keep = has_mass(new_mass, residual.dtype)
    return jnp.where(keep, new, residual), jnp.where(keep, new_mass, mass)


class IIDCandidates(AbstractNodeRule):
    """Candidates drawn i.i.d. from the draft $q$ at the node (SpecInfer; Miao et al.
    2024): accept $c_k$ if $u_k < p^{(k)}(c_k) / q(c_k)$; else
    $p^{(k+1)} = \\operatorname{norm}((p^{(k)} - q)_+)$. Lossless."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    def candidate_law(self, draft, drafted):
        return draft

    def optimal_acceptance(self, target, draft, num_children):
        return optimal_acceptance(target, draft, num_children, drafting="iid")

    def pass_threshold(self, residual, mass, draft, token, child):
        return _threshold(residual, mass, draft, token)

    def test(self, residual, mass, draft, token, uniform, child):
        return _passes(residual, mass, draft, token, uniform)

    def reject(self, residual, mass, draft, token, child):
        residual, mass = _subtract(residual, mass, draft)
        return residual, mass, draft


class WithoutReplacementCandidates(AbstractNodeRule):
    """Candidates drawn from $q$ without replacement (Jeon et al. 2024): as
    [`eqx_specdec.IIDCandidates`][], with the draft updated after each rejection,
    $q^{(k+1)}(v) = q^{(k)}(v)\\,[v \\ne c_k] / (1 - q^{(k)}(c_k))$. Lossless."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    def candidate_law(self, draft, drafted):
        remaining = jnp.where(drafted, 0, draft)
        total = jnp.sum(remaining)
        return jnp.where(total > 0, remaining / jnp.where(total > 0, total, 1), draft)

    def optimal_acceptance(self, target, draft, num_children):
        return optimal_acceptance(
            target, draft, num_children, drafting="without replacement"
        )

    def pass_threshold(self, residual, mass, draft, token, child):
        return _threshold(residual, mass, draft, token)

    def test(self, residual, mass, draft, token, uniform, child):
        return _passes(residual, mass, draft, token, uniform)

    def reject(self, residual, mass, draft, token, child):
        residual, mass = _subtract(residual, mass, draft)
        ids = jnp.arange(draft.shape[0], dtype=jnp.int32)
        remaining = 1 - draft[token]
        draft = jnp.where(
            (ids == token) | (remaining <= 0),
            0,
            draft / jnp.where(remaining > 0, remaining, 1),
        )
        return residual, mass, draft


class DeterministicCandidates(AbstractNodeRule):
    """Distinct children chosen deterministically (top-$k$ trees, EAGLE-2-style; no $q$):
    accept $c_k$ if $u_k < p^{(k)}(c_k)$; else zero $c_k$ in $p^{(k)}$. The probability
    that some child is accepted is $\\sum_k p(c_k)$. Lossless. Its children are the draft's
    most likely tokens, in order (`candidate_law` is one-hot)."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = False

    def candidate_law(self, draft, drafted):
        best = jnp.argmax(jnp.where(drafted, -1, draft))
        return jax.nn.one_hot(best, draft.shape[0], dtype=draft.dtype)

    def optimal_acceptance(self, target, draft, num_children):
        # A deterministic set D: P(S in H) is 1 when H holds D, else 0, so alpha* = p(D).
        return jnp.sum(jnp.where(_top_mask(draft, num_children), target, 0))

    def pass_threshold(self, residual, mass, draft, token, child):
        return residual[token] / mass

    def test(self, residual, mass, draft, token, uniform, child):
        return uniform.astype(residual.dtype) * mass < residual[token]

    def reject(self, residual, mass, draft, token, child):
        # (p - onehot(c))_+ is p with c zeroed: the i.i.d. update with q = onehot(c).
        one_hot = (jnp.arange(residual.shape[0], dtype=jnp.int32) == token).astype(
            residual.dtype
        )
        residual, mass = _subtract(residual, mass, one_hot)
        return residual, mass, draft


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


class _TopPlusOne(AbstractNodeRule):
    """The shared rule of drafts made of the draft's top `K - 1` tokens $D$ and one token
    $x \\sim q' = q$ restricted to the rest, the sampled child tried first: accept $x$ if
    $u\\, q'(x) < p(x)$; else the residual is $r = (p - q')_+$ off $D$ and $p$ on $D$,
    against which the children in $D$ are then tested one by one, as
    [`eqx_specdec.DeterministicCandidates`][] tests its children. The first phase is
    marked by the evolving draft, zeroed after it."""

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    @abc.abstractmethod
    def _drafted_set(self, draft):
        """The deterministic children's tokens $D$, as a boolean mask."""

    def _first_phase(self, draft):
        return jnp.any(draft > 0)

    def _sampled_law(self, draft):
        return _restricted(draft, self._drafted_set(draft))

    def candidate_law(self, draft, drafted):
        first = ~jnp.any(drafted)
        best = jnp.argmax(jnp.where(drafted, -1, draft))
        one_hot = jax.nn.one_hot(best, draft.shape[0], dtype=draft.dtype)
        return jnp.where(first, self._sampled_law(draft), one_hot)

    def pass_threshold(self, residual, mass, draft, token, child):
        sampled = _threshold(residual, mass, self._sampled_law(draft), token)
        return jnp.where(self._first_phase(draft), sampled, residual[token] / mass)

    def test(self, residual, mass, draft, token, uniform, child):
        u = uniform.astype(residual.dtype)
        law = self._sampled_law(draft)
        sampled = _passes(residual, mass, law, token, uniform)
        deterministic = u * mass < residual[token]
        return jnp.where(self._first_phase(draft), sampled, deterministic)

    def reject(self, residual, mass, draft, token, child):
        ids = jnp.arange(residual.shape[0], dtype=jnp.int32)
        # First phase: r = (p - q')_+ off D (q' is zero on D, so p stays there).
        law = self._sampled_law(draft)
        first_residual, first_mass = _subtract(residual, mass, law)
        # Then: the tested child's token leaves the residual.
        rest = jnp.where(ids == token, 0, residual)
        rest_mass = jnp.sum(rest)
        keep = has_mass(rest_mass, residual.dtype)
        later_residual = jnp.where(keep, rest, residual)
        later_mass = jnp.where(keep, rest_mass, mass)
        first = self._first_phase(draft)
        return (
            jnp.where(first, first_residual, later_residual),
            jnp.where(first, first_mass, later_mass),
            jnp.zeros_like(draft),
        )

    def _acceptance(self, target, draft):
        law = self._sampled_law(draft)
        in_set = self._drafted_set(draft)
        return jnp.sum(jnp.where(in_set, target, jnp.minimum(target, law)))


class GreedyMultiDraft(_TopPlusOne):
    """Greedy multi-draft (Hu et al., ICLR 2025): the children of a node are the draft's
    top $K - 1$ tokens $D$ (deterministic) and one token $x \\sim q'$, $q$ restricted to
    the other tokens and renormalised, drafted first (the layout's first child).

    Verification: accept $x$ with probability $\\min(1, p(x) / q'(x))$; else the residual
    $r(v) = p(v) - \\min(p(v), q'(v))$ off $D$, $r(d) = p(d)$ on $D$, and a draw from it
    that lands on a child in $D$ descends into that child: the children in $D$ are tested
    one by one against $r$ (the same in distribution). Lossless; the probability that
    some child is accepted is $p(D) + \\sum_{v \\notin D} \\min(p(v), q'(v))$, the optimum
    ($\\alpha^*$) of its own draft law.

    **Arguments:**

    - `num_drafts`: $K$, the number of children per node (a Python int $\\ge 1$;
        $K = 1$ is the standard single-candidate rule).
    """

    num_drafts: int = eqx.field(static=True)

    def __check_init__(self):
        if not isinstance(self.num_drafts, int) or self.num_drafts < 1:
            raise ValueError(
                "GreedyMultiDraft(`num_drafts`=...) must be a Python int >= 1 (the "
                f"children per node); got {self.num_drafts!r}."
            )

    def _drafted_set(self, draft):
        return _top_mask(draft, self.num_drafts - 1)

    def optimal_acceptance(self, target, draft, num_children):
        return self._acceptance(target, draft)


class SpecHub(_TopPlusOne):
    """SpecHub (Sun et al., EMNLP 2024), two candidates per node: the hub
    $a = \\arg\\max q$ and, drawing $f \\sim q$, the pair $(f, a)$ if $f \\ne a$, else
    $(a, i)$ with $i \\sim q$ restricted to the other tokens. The non-hub candidate then
    follows $q' = q$ without $a$, renormalised, whatever $f$ was; it is drafted first and
    the hub second.

    Verification by sequential transport: accept the non-hub candidate with probability
    $\\min(1, p / q')$; else the hub, with the leftover target mass at it over the
    leftover mass; else the correction follows the leftover mass. Lossless, and it
    reaches $\\alpha^*$ of its draft law, $p(a) + \\sum_{v \\ne a} \\min(p(v), q'(v))$.
    """

    def _drafted_set(self, draft):
        return _top_mask(draft, 1)

    def optimal_acceptance(self, target, draft, num_children):
        return self._acceptance(target, draft)
