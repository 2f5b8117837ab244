"""How the candidate children of a tree node are tried: the node rules."""

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractClassVar
from jaxtyping import Array, Bool, Float, Int

from ._errors import missing_capability
from ._search import has_mass


Row = Float[Array, " vocab"]
Scalar = Float[Array, ""]


class AbstractNodeRule(eqx.Module):
    """How the candidate children of one tree node are tried, in order.

    At a node with target $p$ the candidates $c_1, \\dots, c_K$ are tested one after the
    other against an evolving target $p^{(k)}$ (and, for some rules, an evolving draft
    $q^{(k)}$). The first to pass is accepted and the walk descends into it; if all fail,
    the correction is drawn from the final $p^{(K+1)}$.

    The evolving target is kept unnormalised, as `residual` with total `mass`:
    $p^{(k)} = \\text{residual} / \\text{mass}$.

    **Declared by every subclass:** `uses_draft_probs` (class attribute): whether the
    rule reads the draft distributions (if not, `draft_probs` may be `None`).

    **Capabilities** (defaults raise [`eqx_specdec.MissingCapabilityError`][]):
    `candidate_law` (how the decoding loop and the evaluation tools draft a node's
    children), `pass_threshold` (exact evaluation of trees).
    """

    uses_draft_probs: AbstractClassVar[bool]

    @abc.abstractmethod
    def test(
        self,
        residual: Row,
        mass: Scalar,
        draft: Row,
        token: Int[Array, ""],
        uniform: Scalar,
    ) -> Bool[Array, ""]:
        """Whether candidate `token` passes, given the evolving state.

        **Arguments:**

        - `residual`, `mass`: the evolving target, $p^{(k)} = $ `residual / mass`.
        - `draft`: the evolving draft $q^{(k)}$ (zeros for rules without one).
        - `token`: the candidate $c_k$.
        - `uniform`: its uniform $u_k$.

        **Returns:**

        A boolean scalar.
        """

    @abc.abstractmethod
    def reject(
        self, residual: Row, mass: Scalar, draft: Row, token: Int[Array, ""]
    ) -> tuple[Row, Scalar, Row]:
        """The state after candidate `token` failed: `(residual, mass, draft)`.

        **Arguments:**

        - as for `test`, without the uniform.

        **Returns:**

        The next `(residual, mass, draft)`.
        """

    def candidate_law(self, draft: Row, drafted: Bool[Array, " vocab"]) -> Row:
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
        raise missing_capability(
            self,
            "candidate_law",
            "drafting a tree (the decoding loop and the tree evaluation tools)",
        )

    def pass_threshold(
        self, residual: Row, mass: Scalar, draft: Row, token: Int[Array, ""]
    ) -> Scalar:
        """Capability for exact evaluation of trees
        ([`eqx_specdec.emission_by_quadrature`][] with a tree): the value $t$ such that
        `test(residual, mass, draft, token, u)` passes exactly when $u < t$. Traced.

        **Arguments:**

        - as for `test`, without the uniform.

        **Returns:**

        A float scalar ($+\\infty$ allowed).
        """
        raise missing_capability(
            self,
            "pass_threshold",
            "exact evaluation of trees",
            'use method="monte-carlo"',
        )


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

    uses_draft_probs: ClassVar[bool] = True

    def candidate_law(self, draft, drafted):
        return draft

    def pass_threshold(self, residual, mass, draft, token):
        return _threshold(residual, mass, draft, token)

    def test(self, residual, mass, draft, token, uniform):
        return _passes(residual, mass, draft, token, uniform)

    def reject(self, residual, mass, draft, token):
        residual, mass = _subtract(residual, mass, draft)
        return residual, mass, draft


class WithoutReplacementCandidates(AbstractNodeRule):
    """Candidates drawn from $q$ without replacement (Jeon et al. 2024): as
    [`eqx_specdec.IIDCandidates`][], with the draft updated after each rejection,
    $q^{(k+1)}(v) = q^{(k)}(v)\\,[v \\ne c_k] / (1 - q^{(k)}(c_k))$. Lossless."""

    uses_draft_probs: ClassVar[bool] = True

    def candidate_law(self, draft, drafted):
        remaining = jnp.where(drafted, 0, draft)
        total = jnp.sum(remaining)
        return jnp.where(total > 0, remaining / jnp.where(total > 0, total, 1), draft)

    def pass_threshold(self, residual, mass, draft, token):
        return _threshold(residual, mass, draft, token)

    def test(self, residual, mass, draft, token, uniform):
        return _passes(residual, mass, draft, token, uniform)

    def reject(self, residual, mass, draft, token):
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

    uses_draft_probs: ClassVar[bool] = False

    def candidate_law(self, draft, drafted):
        best = jnp.argmax(jnp.where(drafted, -1, draft))
        return jax.nn.one_hot(best, draft.shape[0], dtype=draft.dtype)

    def pass_threshold(self, residual, mass, draft, token):
        return residual[token] / mass

    def test(self, residual, mass, draft, token, uniform):
        return uniform.astype(residual.dtype) * mass < residual[token]

    def reject(self, residual, mass, draft, token):
        # (p - onehot(c))_+ is p with c zeroed: the i.i.d. update with q = onehot(c).
        one_hot = (jnp.arange(residual.shape[0], dtype=jnp.int32) == token).astype(
            residual.dtype
        )
        residual, mass = _subtract(residual, mass, one_hot)
        return residual, mass, draft
