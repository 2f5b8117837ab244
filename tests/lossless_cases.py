"""The (p, q) cases the losslessness tests and `report_losslessness.py` run on."""

from typing import ClassVar

import numpy as np

import eqx_specdec
from eqx_specdec._evaluation.evaluate import synthetic_distributions  # noqa: F401
from eqx_specdec._stages.typical import typical_masked  # noqa: F401


# The synthetic cases live in the library (the `evaluate` command uses them too).
distributions = synthetic_distributions


def acceptance_products(draft_probs, target_probs, draft_law):
    """P(n >= k), k = 0..G: the product of the per-position acceptance probabilities,
    sum_v min(p_i(v), q_i(v)) for a sampled draft, E_x[p_i(x)] for one-hot drafts."""
    gamma = target_probs.shape[0] - 1
    if draft_probs is None:
        beta = np.sum(draft_law * target_probs[:gamma], axis=-1)
    else:
        beta = np.minimum(target_probs[:gamma], draft_probs).sum(-1)
    return np.concatenate([[1.0], np.cumprod(beta)])


class TargetOnlySampler(eqx_specdec.AbstractResidualSampler):
    """A classic bug: the correction drawn from p_n rather than the residual."""

    draws: ClassVar[str] = "target"  # a classic bug: not the residual
    randomness: ClassVar[str] = "uniform"

    def quadrature_breakpoints(self, draft_probs, target_probs):
        # It draws from p_n: the cumulative sums of every row of p.
        return {"sample_breakpoints": np.cumsum(target_probs, -1).ravel()}

    def __call__(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample_uniform,
        context,
    ):
        return eqx_specdec.ResidualSampler()(
            num_accepted,
            verdict,
            draft_tokens,
            None if draft_probs is None else draft_probs * 0,
            target_probs,
            sample_uniform,
            context,
        )


QUADRATURE_CASES = [
    (kind, gamma, vocab, seed)
    for (gamma, vocab) in [(1, 8), (2, 5), (3, 4)]
    for seed, kind in enumerate(
        ["flat", "peaked", "near-equal", "disjoint", "equal", "sparse", "one-hot",
         "one-hot implicit"]
    )
]  # fmt: skip

# V = 256 exercises the samplers' two-level search, as every V above 32 does.
MONTE_CARLO_VOCAB = 256
MONTE_CARLO_CASES = [
    (kind, gamma, MONTE_CARLO_VOCAB, 100 + seed)
    for gamma in (1, 3)
    for seed, kind in enumerate(["flat", "peaked", "near-equal", "disjoint", "one-hot"])
] + [("one-hot implicit", 3, MONTE_CARLO_VOCAB, 200)]

NUM_DRAWS = 200_000


def lenient_first_position(q, p, lenience):
    """The exact distribution of the first emitted token under the lenient test with
    the standard residual, for x ~ q."""
    kept = np.minimum(q, p / lenience)
    residual = np.maximum(p - q, 0)
    return kept + (1 - kept.sum()) * residual / residual.sum()


def typical_first_position(q, p, epsilon=0.09, delta=0.3, sampled=False):
    """The exact distribution of the first emitted token under typical acceptance, for
    x ~ q, with the greedy or the masked-sampled correction."""
    masked = typical_masked(p, epsilon, delta)
    kept = q * (masked > 0)
    if sampled:
        correction = masked / masked.sum()
    else:
        correction = np.eye(len(p))[np.argmax(p)]
    return kept + (1 - kept.sum()) * correction


def total_variation(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


# The reference case of the Variants page: G = 2, V = 8.
REFERENCE_CASE = ("peaked", 2, 8, 11)
