"""The optimum of multi-draft verification: the best acceptance any lossless verifier can
reach for a given law of the draft set (Khisti et al., ICLR 2025; Hu et al., ICLR 2025)."""

import typing
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._misc import compute_dtype


def _exp_sinh_rule(step: float = 1 / 64, half_width: float = 4.0):
    """Nodes and weights of the exp-sinh rule on $[0, \\infty)$: $t = e^{\\pi/2 \\sinh s}$
    on a uniform grid in $s$. Exact to rounding for the smooth, exponentially decaying
    integrands below, over the many scales ($q_v$ from 1 down to $10^{-30}$) they mix."""
    s = np.arange(-half_width, half_width + step / 2, step)
    t = np.exp(np.pi / 2 * np.sinh(s))
    weights = step * t * np.pi / 2 * np.cosh(s)
    return t, weights


_NODES, _WEIGHTS = _exp_sinh_rule()


def _sorted_by_ratio(p, q):
    """p and q in the order of $p/q$ ascending (tokens the draft never proposes last)."""
    ratio = jnp.where(q > 0, p / jnp.where(q > 0, q, 1), jnp.inf)
    order = jnp.argsort(ratio, stable=True)
    return p[order], q[order]


def _iid_inclusion(q_sorted, k: int):
    """$P(S \\subseteq H_m) = q(H_m)^K$ for every prefix $H_m$, $m = 1..V$."""
    return jnp.cumsum(q_sorted) ** k


def _without_replacement_inclusion(q_sorted, k: int):
    """$P(S \\subseteq H_m)$ for K draws without replacement, every prefix $H_m$.

    Drawing without replacement proportionally to q is an exponential race: token $v$
    arrives at $T_v \\sim \\text{Exp}(q_v)$ and the draws are the first K arrivals. So
    $P(S \\subseteq H) = P(\\text{the } K\\text{-th arrival in } H
    \\text{ precedes every arrival outside})
    = \\int_0^\\infty r e^{-r t} P(N_H(t) \\ge K)\\, dt$ with $r = q(H^c)$ and $N_H(t)$
    the (Poisson-binomial) number of arrivals in $H$ by $t$, updated token by token as
    the prefix grows."""
    dtype = q_sorted.dtype
    t = jnp.asarray(_NODES, dtype)
    w = jnp.asarray(_WEIGHTS, dtype)
    outside = jnp.cumsum(q_sorted[::-1])[::-1]
    outside = jnp.concatenate([outside[1:], jnp.zeros((1,), dtype)])  # q(H_m^c)

    def add(counts, inputs):
        q_v, r = inputs
        arrived = -jnp.expm1(-q_v * t)  # P(T_v <= t)
        shifted = jnp.concatenate([jnp.zeros_like(counts[:, :1]), counts[:, :-1]], 1)
        counts = counts * (1 - arrived)[:, None] + shifted * arrived[:, None]
        at_least_k = jnp.clip(1 - jnp.sum(counts, axis=1), 0, 1)
        inclusion = jnp.sum(w * r * jnp.exp(-r * t) * at_least_k)
        return counts, jnp.where(r > 0, inclusion, 1)

    start = jnp.zeros((t.shape[0], k), dtype).at[:, 0].set(1)  # P(N = j), j < K
    _, inclusion = jax.lax.scan(add, start, (q_sorted, outside))
    return jnp.clip(inclusion, 0, 1)


# Independent drafters that differ: the minimum runs over every subset of the
# vocabulary, up to this size.
_SUBSETS_MAX_VOCAB = 16


def _independent_row(p, qs):
    """$\\min_H p(H) + 1 - \\prod_k q_k(H)$ over every subset $H$ of the vocabulary."""
    vocab = p.shape[-1]
    bits = (np.arange(2**vocab)[:, None] >> np.arange(vocab)) & 1
    masks = jnp.asarray(bits, p.dtype)  # (2^V, V)
    inclusion = jnp.prod(masks @ qs.T, axis=1)  # P(every draft in H)
    return jnp.clip(jnp.min(masks @ p + 1 - inclusion), 0, 1)


def _one_row(p, q, k: int, drafting: str):
    p_sorted, q_sorted = _sorted_by_ratio(p, q)
    if drafting == "iid":
        inclusion = _iid_inclusion(q_sorted, k)
    else:
        inclusion = _without_replacement_inclusion(q_sorted, k)
    values = jnp.cumsum(p_sorted) + 1 - inclusion
    return jnp.clip(jnp.min(values), 0, 1)  # H empty gives 1


@typing.no_type_check  # validated by hand, with messages naming the argument
def optimal_acceptance(
    target_probs: Float[Array, "*B V"],
    draft_probs: Float[Array, "*B V"],
    num_drafts: int,
    *,
    drafting: Literal["iid", "without replacement", "independent"] = "iid",
) -> Float[Array, "*B"]:
    """The best acceptance any lossless verifier can reach at one node with
    `num_drafts` candidates drawn from the draft (Khisti et al., ICLR 2025; Hu et al.,
    ICLR 2025): the probability that the emitted token is one of the drafts,

    $$\\alpha^* = \\min_{H \\subseteq \\mathcal{V}}\\; p(H) + 1 - P(S \\subseteq H),$$

    with $S$ the set of drafts. The minimising $H$ is a prefix of the tokens sorted by
    $p/q$ ascending (checked against exhaustive search by the test suite), so it costs a
    sort and a scan: $P(S \\subseteq H) = q(H)^K$ for i.i.d. drafts, and an exact
    exponential-race integral, updated token by token, without replacement.
    $K = 1$ gives $\\sum_v \\min(p(v), q(v))$. For independent drafters that differ
    (two draft models), $P(S \\subseteq H) = \\prod_k q_k(H)$ and no order of the
    tokens holds the minimiser in general: the minimum runs over all $2^V$ subsets, for
    vocabularies of up to 16 tokens (checked against a maximum flow over the couplings
    of $p$ and the drafts by the test suite). Traced (works under `jax.jit` and
    `jax.vmap`).

    **Arguments:**

    - `target_probs`: float `(..., V)`, the target $p$ at the node.
    - `draft_probs`: float `(..., V)`, the draft $q$ the candidates are drawn from;
        with `drafting="independent"`, `(..., K, V)`: candidate $k$ drawn from row $k$.
    - `num_drafts`: the number of candidates $K \\ge 1$, a Python int.
    - `drafting`: `"iid"` (independent draws), `"without replacement"` (distinct
        candidates, each drawn from $q$ renormalised over the tokens not yet drawn), or
        `"independent"` (independent draws, candidate $k$ from its own $q_k$).

    **Returns:**

    A float array of shape `(...)`: $\\alpha^*$ per row.
    """
    if (
        not isinstance(num_drafts, int)
        or isinstance(num_drafts, bool)
        or num_drafts < 1
    ):
        raise ValueError(
            f"`num_drafts` must be a Python int >= 1 (the number of candidates), got "
            f"{num_drafts!r}."
        )
    if drafting not in ("iid", "without replacement", "independent"):
        raise ValueError(
            '`drafting` must be "iid", "without replacement" or "independent" (how '
            f"the candidates are drawn from the draft), got {drafting!r}."
        )
    p, q = jnp.asarray(target_probs), jnp.asarray(draft_probs)
    if drafting == "independent":
        return _independent(p, q, num_drafts)
    if p.shape != q.shape or p.ndim < 1:
        raise ValueError(
            "`target_probs` and `draft_probs` must have the same shape (..., V); got "
            f"{p.shape} and {q.shape}."
        )
    dtype = compute_dtype(p.dtype, q.dtype)
    rows_p = p.astype(dtype).reshape(-1, p.shape[-1])
    rows_q = q.astype(dtype).reshape(-1, q.shape[-1])
    alpha = jax.vmap(lambda a, b: _one_row(a, b, num_drafts, drafting))(rows_p, rows_q)
    return alpha.reshape(p.shape[:-1])


def _independent(p, q, num_drafts: int):
    """`optimal_acceptance` for independent drafters that differ: `q` `(..., K, V)`."""
    if p.ndim < 1 or q.shape != p.shape[:-1] + (num_drafts, p.shape[-1]):
        raise ValueError(
            '`draft_probs` must have shape (..., K, V) with drafting="independent" (row '
            f"k: the law of candidate k), here (..., {num_drafts}, V) for "
            f"`target_probs` of shape {p.shape}; got {q.shape}."
        )
    if p.shape[-1] > _SUBSETS_MAX_VOCAB:
        raise ValueError(
            'optimal_acceptance with drafting="independent" minimises over every '
            f"subset of the vocabulary, for V <= {_SUBSETS_MAX_VOCAB}; got V = "
            f"{p.shape[-1]}. Restrict p and the drafts to the tokens that matter."
        )
    dtype = compute_dtype(p.dtype, q.dtype)
    rows_p = p.astype(dtype).reshape(-1, p.shape[-1])
    rows_q = q.astype(dtype).reshape((-1,) + q.shape[-2:])
    alpha = jax.vmap(_independent_row)(rows_p, rows_q)
    return alpha.reshape(p.shape[:-1])
