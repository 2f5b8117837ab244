"""Node rules that draft a node's children as a set: the draft's top tokens with one
sampled (greedy multi-draft, SpecHub), and K i.i.d. drafts verified jointly (SpecTr's
K-SEQ, importance sampling)."""

import abc
import itertools
import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from .._stages.acceptance import accepted_mass
from .node_rules import (
    _IIDDrafting,
    _restricted,
    _subtract,
    _top_mask,
    _without_token,
    AbstractNodeRule,
    ResidualState,
    Row,
    Scalar,
)


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

    def ratio(self, state, token, child):
        residual, mass, draft = state.residual, state.mass, state.draft
        first = self._first_phase(draft)
        law = self._sampled_law(draft)
        return residual[token], mass * jnp.where(first, law[token], 1)

    def reject(self, state, token, child):
        residual, mass, draft = state.residual, state.mass, state.draft
        # First phase: r = (p - q')_+ off D (q' is zero on D, so p stays there).
        law = self._sampled_law(draft)
        first_residual, first_mass = _subtract(
            residual, mass, accepted_mass(law, residual / mass)
        )
        # Then: the tested child's token leaves the residual.
        later_residual, later_mass = _without_token(residual, mass, token)
        first = self._first_phase(draft)
        return ResidualState(
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


def _num_children(siblings):
    return jnp.sum(siblings.astype(jnp.int32))


def _repeated_failure(beta, count):
    """$c_i = \\sum_{j < i} (1 - \\beta)^j$, the expected number of i.i.d. tries, each
    passing with probability $\\beta$, until the first pass, capped at `count`."""
    count = count.astype(beta.dtype)
    geometric = -jnp.expm1(count * jnp.log1p(-beta)) / jnp.where(beta > 0, beta, 1)
    return jnp.where(beta > 0, geometric, count)


class _KSeqState(eqx.Module):
    target: Row
    draft: Row
    scale: Scalar  # rho
    beta: Scalar  # sum_v min(q(v), p(v) / rho)
    rejected: Int[Array, ""]


_KSEQ_BISECTIONS = 40


class SpecTrKSeq(_IIDDrafting):
    """SpecTr's K-SEQ (Sun et al., NeurIPS 2023): $K$ children drawn i.i.d. from $q$,
    each accepted with probability $\\min(1, p(c_k) / (\\rho\\, q(c_k)))$, the same
    for every child whatever failed before; if all $K$ fail, the correction follows

    $$p - \\min(q, p/\\rho)\\, \\frac{1 - (1 - \\beta)^K}{\\beta}, \\qquad
    \\beta = \\sum_v \\min(q(v), p(v)/\\rho).$$

    That residual is a distribution when $\\rho \\ge (1 - (1-\\beta)^K) / \\beta$;
    `init` finds the least such $\\rho \\in [1, K]$ by bisection (where the two sides
    cross), with $K$ the node's number of children, so that nodes of a tree may have
    different numbers of children. Lossless; the probability that some child is
    accepted is $1 - (1 - \\beta)^K$, at least $(1 - 1/e)$ times the optimum
    $\\alpha^*$ of i.i.d. drafts (their Theorem 2; checked by the test suite).
    $K = 1$ is the standard rule.
    """

    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    def init(self, target, draft, tokens, siblings):
        count = _num_children(siblings)
        dtype = target.dtype
        k = jnp.maximum(count, 1).astype(dtype)

        def beta_at(rho):
            return jnp.sum(jnp.minimum(draft, target / rho))

        def feasible(rho):
            return rho >= _repeated_failure(beta_at(rho), count)

        def bisect(_, bounds):
            lo, hi = bounds
            mid = (lo + hi) / 2
            ok = feasible(mid)
            return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

        one = jnp.ones((), dtype)
        # rho = K is always feasible (the sum is at most K); rho = 1 is when K <= 1.
        _, rho = jax.lax.fori_loop(0, _KSEQ_BISECTIONS, bisect, (one, k))
        rho = jnp.where(feasible(one), one, rho)
        return _KSeqState(target, draft, rho, beta_at(rho), jnp.int32(0))

    def ratio(self, state, token, child):
        return state.target[token], state.scale * state.draft[token]

    def reject(self, state, token, child):
        return eqx.tree_at(lambda s: s.rejected, state, state.rejected + 1)

    def correction(self, state):
        accepted = jnp.minimum(state.draft, state.target / state.scale)
        tries = _repeated_failure(state.beta, state.rejected)
        return jnp.maximum(state.target - accepted * tries, 0)


# The importance-sampling rule's exact law of the selected draft enumerates the
# multisets of the other drafts; it is refused beyond this many (multiset, token) pairs.
_IS_MAX_ENUMERATION = 1 << 22


def _multisets(vocab: int, size: int):
    """Every multiset of `size` tokens out of `vocab`, as counts `(n, vocab)`, and the
    multinomial coefficient of each (`(n,)`)."""
    counts = []
    for combo in itertools.combinations_with_replacement(range(vocab), size):
        row = np.zeros(vocab, np.int64)
        np.add.at(row, list(combo), 1)
        counts.append(row)
    counts = np.asarray(counts, np.int64).reshape(-1, vocab)
    coefficients = math.factorial(size) / np.prod(
        [[math.factorial(c) for c in row] for row in counts], axis=1
    )
    return counts, coefficients


def _enumeration_size(vocab: int, num_drafts: int) -> int:
    return vocab * sum(
        math.comb(vocab + k - 2, k - 1) for k in range(1, num_drafts + 1)
    )


def _importance_weights(target, draft):
    """$w = p / q$ where $q > 0$ (0 elsewhere: such a token is never drafted)."""
    drafted = draft > 0
    return jnp.where(drafted, target / jnp.where(drafted, draft, 1), 0)


class _ImportanceState(eqx.Module):
    target: Row
    selected_law: Row  # the law of the selected draft
    weights: Row  # w = p / q
    total: Scalar  # W, the siblings' total weight
    failed: Scalar  # F, the probability that an earlier sibling was accepted
    count: Int[Array, ""]


class ImportanceSampling(_IIDDrafting):
    """The importance-sampling verifier of Khisti et al. (ICLR 2025), in two steps: of
    the $K$ children, drawn i.i.d. from $q$, one is selected with probability
    proportional to its weight $w = p/q$ (uniformly when every weight is 0); the
    selected token $Y$ is then verified by the standard rule against $q_Y$, the exact
    law of $Y$: accepted with probability $\\min(1, p(Y) / q_Y(Y))$, else the correction
    follows $(p - q_Y)_+$. Lossless; the probability that some child is accepted is
    $\\sum_v \\min(p(v), q_Y(v))$.

    The walk tests the children one by one: child $k$ passes with probability
    $s_k a_k / (1 - \\sum_{j<k} s_j a_j)$, with $s_k$ its selection probability and
    $a_k$ its acceptance, which gives each child the same probability of being the one
    accepted as the two steps do.

    $q_Y(y) = K q(y)\\, E[w(y) / (w(y) + S)]$, with $S$ the total weight of $K - 1$
    other i.i.d. drafts, is computed exactly by enumerating the multisets of those
    drafts: $V \\binom{V + K - 2}{K - 1}$ terms, refused beyond $2^{22}$ (a vocabulary
    of 16 tokens with up to 8 drafts). For real vocabularies, verify rows restricted
    to their most likely tokens.

    **Arguments:**

    - `num_drafts`: the most children a node may have (a Python int $\\ge 1$); the law
        of $Y$ is enumerated for every count up to it. A node with more children has a
        NaN correction (an invalid draw, -1).
    """

    num_drafts: int = eqx.field(static=True)
    exact: ClassVar[bool] = True
    uses_draft_probs: ClassVar[bool] = True

    def __check_init__(self):
        if not isinstance(self.num_drafts, int) or self.num_drafts < 1:
            raise ValueError(
                "ImportanceSampling(`num_drafts`=...) must be a Python int >= 1 (the "
                f"most children a node may have); got {self.num_drafts!r}."
            )

    def selected_law(self, target: Row, draft: Row, count: Int[Array, ""]) -> Row:
        """$q_Y$: the law of the selected child when `count` children are drafted
        i.i.d. from `draft` (zeros for `count` 0; NaN above `num_drafts`).

        **Arguments:**

        - `target`, `draft`: float `(V,)`, $p$ and $q$.
        - `count`: int32 scalar, the number of children $K$.

        **Returns:**

        A float `(V,)` distribution.
        """
        vocab, dtype = target.shape[0], target.dtype
        size = _enumeration_size(vocab, self.num_drafts)
        if size > _IS_MAX_ENUMERATION:
            raise ValueError(
                f"ImportanceSampling(num_drafts={self.num_drafts}) enumerates "
                f"{size:,} terms for a vocabulary of {vocab} (at most "
                f"{_IS_MAX_ENUMERATION:,}): restrict the rows to their most likely "
                "tokens, or lower `num_drafts`."
            )
        weights = _importance_weights(target, draft)
        laws = [jnp.zeros((vocab,), dtype)]
        for k in range(1, self.num_drafts + 1):
            counts, coefficients = _multisets(vocab, k - 1)
            counts = jnp.asarray(counts, dtype)
            chance = jnp.asarray(coefficients, dtype) * jnp.prod(
                draft[None, :] ** counts, axis=1
            )  # (n,)
            others = counts @ weights  # (n,)
            total = weights[:, None] + others[None, :]  # (V, n)
            share = jnp.where(
                total > 0, weights[:, None] / jnp.where(total > 0, total, 1), 1 / k
            )
            laws.append(k * draft * (share @ chance))
        laws = jnp.stack(laws + [jnp.full((vocab,), jnp.nan, dtype)])
        return laws[jnp.clip(count, 0, self.num_drafts + 1)]

    def init(self, target, draft, tokens, siblings):
        count = _num_children(siblings)
        law = self.selected_law(target, draft, count)
        weights = _importance_weights(target, draft)
        total = jnp.sum(jnp.where(siblings, weights[tokens], 0))
        zero = jnp.zeros((), target.dtype)
        return _ImportanceState(target, law, weights, total, zero, count)

    def _accepted_share(self, state, token):
        """$s_k a_k$: the probability that this child is selected and accepted."""
        k = jnp.maximum(state.count, 1).astype(state.total.dtype)
        selected = jnp.where(
            state.total > 0,
            state.weights[token] / jnp.where(state.total > 0, state.total, 1),
            1 / k,
        )
        law = state.selected_law[token]
        accepted = jnp.where(
            law > 0, jnp.minimum(1, state.target[token] / jnp.where(law > 0, law, 1)), 0
        )
        return selected * accepted

    def ratio(self, state, token, child):
        return self._accepted_share(state, token), 1 - state.failed

    def reject(self, state, token, child):
        failed = state.failed + self._accepted_share(state, token)
        return eqx.tree_at(lambda s: s.failed, state, failed)

    def correction(self, state):
        return jnp.maximum(state.target - state.selected_law, 0)
