"""The emission of a threshold rule's chain verifier in closed form: exact at any
vocabulary size, without quadrature or sampling."""

import jax.numpy as jnp
import numpy as np

from .._stages.row_context import ONE_DEVICE
from .._stages.threshold_rule import is_threshold_rule
from .chain_emission import checked_row
from .emission import EmissionEstimate


def closed_form_problem(verifier) -> Exception | None:
    """Why the closed form does not apply to `verifier` (`None` when it does): it needs
    a chain verifier whose ratio test is a threshold rule, whose counter counts up to
    the first failure, and whose sampler draws the rule's derived correction."""
    test = getattr(verifier, "ratio_test", None)
    if test is None or not is_threshold_rule(test):
        name = type(test if test is not None else verifier).__name__
        return ValueError(
            f"the closed form needs a threshold rule ({name} is not an "
            "eqx_specdec.AbstractThresholdRule): use quadrature or Monte Carlo."
        )
    counter, sampler = verifier.prefix_counter, verifier.residual_sampler
    if counter.counts != "first failure" or not sampler.derives:
        return ValueError(
            f"the closed form needs a counter that counts up to the first failure and "
            f"a sampler that draws the rule's derived correction (`derives = True`); "
            f"{type(counter).__name__} counts {counter.counts!r} and "
            f"{type(sampler).__name__} declares `derives = {sampler.derives}`: use "
            "quadrature or Monte Carlo."
        )
    return None


def _rows(rule, p, q):
    """The rule's acceptance $t$ on float rows (the compute dtype JAX gives them),
    back as float64."""
    t = rule.acceptance(jnp.asarray(p), jnp.asarray(q), ONE_DEVICE)
    return np.asarray(t, np.float64)


def _normalised(weights, fallback):
    total = weights.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, weights / total, fallback)


def emission_in_closed_form(
    verifier, draft_probs, target_probs, *, draft_law=None
) -> EmissionEstimate:
    """Computes exactly, in closed form, how often a threshold rule's chain verifier
    emits each token at each position, for one row with fixed distributions: at any
    vocabulary size (the recorded rows of a real model's 49,152 tokens included), with
    no quadrature grid and no sampling.

    With $L_i$ the law the draft token at position $i$ is drawn from, $q_i$ the draft
    distribution the verifier is given and $t_i$ the rule's acceptance on
    $(p_i, q_i)$, draft token $v$ is accepted with probability
    $a_i(v) = \\min(1, t_i(v) / q_i(v))$, and a rejection draws the correction from
    $r_i = \\operatorname{norm}((p_i - \\min(q_i, t_i))_+)$ (from $p_i$ when that has no
    mass). So position $i$, once reached, emits

    $$L_i\\, a_i + (1 - \\beta_i)\\, r_i, \\qquad \\beta_i = \\sum_v L_i(v)\\, a_i(v),$$

    and is reached with probability $\\prod_{j < i} \\beta_j$; the bonus position emits
    $p_G$. For an exact rule ($\\min(q, t) \\le p$, $L = q$) the emission is $p$ at
    every position; for a lossy one its distance is $\\sum_v (\\min(q, t) - p)_+$.
    One-hot drafts (`draft_probs=None`): $q_i = \\mathrm{onehot}(v)$ at the drafted $v$.

    The rule's acceptance runs in JAX's default float precision; the sums in float64.

    **Arguments:**

    - `verifier`: an [`eqx_specdec.Verifier`][] whose ratio test is an
        [`eqx_specdec.AbstractThresholdRule`][], with a first-failure counter and a
        sampler that draws its derived correction (the defaults).
    - `draft_probs`: `(G, V)`, or `None` for one-hot drafts.
    - `target_probs`: `(G + 1, V)`.
    - `draft_law`: `(G, V)`, the law of the draft tokens; defaults to `draft_probs`
        (required when `draft_probs` is `None`).

    **Returns:**

    An [`eqx_specdec.evaluation.EmissionEstimate`][] of probabilities.

    **Raises:**

    - `ValueError`: when the closed form does not apply to `verifier`, or the shapes
        do not fit.
    """
    problem = closed_form_problem(verifier)
    if problem is not None:
        raise ValueError(f"emission_in_closed_form: {problem}")
    rule = verifier.ratio_test
    q, p, law = checked_row(draft_probs, target_probs, draft_law)
    gamma = law.shape[0]
    target = p[:gamma]
    if q is not None:
        t = _rows(rule, target, q)
        with np.errstate(invalid="ignore", divide="ignore"):
            a = np.where(q > 0, np.minimum(1, t / np.where(q > 0, q, 1)), t > 0)
        correction = _normalised(np.maximum(target - np.minimum(q, t), 0), target)
        rejected = 1 - (law * a).sum(-1, keepdims=True)
        conditional = law * a + rejected * correction
    else:
        # q = onehot(v) at the drafted v: a(v) = min(1, t(v)), and the correction
        # r_v lowers only entry v of p, to (p(v) - min(1, t(v)))_+.
        t = _rows(rule, target, np.ones_like(target))
        a = np.minimum(1, t)
        kept = np.maximum(target - a, 0)
        mass = 1 - target + kept  # total of r_v, unnormalised
        rejected = law * (1 - a)  # c_v
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(mass > 0, rejected / np.where(mass > 0, mass, 1), 0)
        # Rows v with no residual mass fall back to p: their whole weight goes to p.
        fallback = np.where(mass > 0, 0, rejected).sum(-1, keepdims=True)
        spread = share.sum(-1, keepdims=True) * target - share * target + share * kept
        conditional = law * a + spread + fallback * target
    beta = (law * a).sum(-1)
    reached = np.concatenate([[1.0], np.cumprod(beta)])
    rows = np.concatenate([conditional, p[gamma:] / p[gamma:].sum(-1, keepdims=True)])
    return EmissionEstimate(rows * reached[:, None], reached)
