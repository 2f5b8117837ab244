"""The (p, q) cases the losslessness tests and `report_losslessness.py` run on."""

import numpy as np

import eqx_specdec


def _softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _f32(a):
    # The verifier sees float32; the expected distributions are those float32 values.
    return np.asarray(a, np.float32).astype(np.float64)


def distributions(kind, gamma, vocab, seed):
    """Returns `(draft_probs or None, target_probs, draft_law)` for one case."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(gamma + 1, vocab))
    if kind == "flat":
        p = _softmax(0.1 * logits)
        q = _softmax(0.1 * rng.normal(size=(gamma, vocab)))
    elif kind == "peaked":
        p = _softmax(4.0 * logits)
        q = _softmax(
            4.0 * (0.7 * logits[:gamma] + 0.7 * rng.normal(size=(gamma, vocab)))
        )
    elif kind == "near-equal":
        p = _softmax(logits)
        q = _softmax(logits[:gamma] + 0.05 * rng.normal(size=(gamma, vocab)))
    elif kind == "disjoint":
        half = vocab // 2
        p = _softmax(logits)
        p[:gamma, half:] = 0
        q = _softmax(rng.normal(size=(gamma, vocab)))
        q[:, :half] = 0
    elif kind == "equal":
        p = _softmax(logits)
        q = p[:gamma].copy()
    elif kind == "sparse":  # zeros in both, overlapping supports
        p = _softmax(logits) * (rng.random((gamma + 1, vocab)) < 0.6)
        q = _softmax(rng.normal(size=(gamma, vocab))) * (
            rng.random((gamma, vocab)) < 0.6
        )
        p[:, 0] += 1e-3
        q[:, 0] += 1e-3
    elif kind in ("one-hot", "one-hot implicit"):
        # A target with a few likely tokens, so that one-hot drafts are often accepted.
        p = 0.5 * _softmax(8.0 * logits) + 0.5 * _softmax(logits)
        if kind == "one-hot implicit":  # drafter tokens drawn from a law close to p
            law = _softmax(
                8.0 * (logits[:gamma] + 0.3 * rng.normal(size=(gamma, vocab)))
            )
            return None, _f32(p / p.sum(-1, keepdims=True)), law
        # A deterministic drafter proposing the most likely target token (argmax), with
        # q_i = onehot(c_i) given as a dense array.
        q = np.eye(vocab)[np.argmax(p[:gamma], axis=-1)]
    else:
        raise ValueError(kind)
    p = _f32(p / p.sum(-1, keepdims=True))
    q = _f32(q / q.sum(-1, keepdims=True))
    return q, p, q


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

    def __call__(
        self,
        num_accepted,
        verdict,
        draft_tokens,
        draft_probs,
        target_probs,
        sample_uniform,
    ):
        return eqx_specdec.ResidualSampler()(
            num_accepted,
            verdict,
            draft_tokens,
            None if draft_probs is None else draft_probs * 0,
            target_probs,
            sample_uniform,
        )


QUADRATURE_CASES = [
    (kind, gamma, vocab, seed)
    for (gamma, vocab) in [(1, 8), (2, 5), (3, 4)]
    for seed, kind in enumerate(
        ["flat", "peaked", "near-equal", "disjoint", "equal", "sparse", "one-hot",
         "one-hot implicit"]
    )
]  # fmt: skip

MONTE_CARLO_CASES = [
    (kind, gamma, 4096, 100 + seed)
    for gamma in (1, 3)
    for seed, kind in enumerate(["flat", "peaked", "near-equal", "disjoint", "one-hot"])
] + [("one-hot implicit", 3, 4096, 200)]

NUM_DRAWS = 200_000


def lenient_first_position(q, p, lenience):
    """The exact distribution of the first emitted token under the lenient test with
    the standard residual, for x ~ q."""
    kept = np.minimum(q, p / lenience)
    residual = np.maximum(p - q, 0)
    return kept + (1 - kept.sum()) * residual / residual.sum()


def typical_masked(p, epsilon=0.09, delta=0.3):
    """p with the tokens at or under the typical threshold zeroed."""
    entropy = -np.sum(p * np.log(p + 1e-5))
    return np.where(p > min(epsilon, delta * np.exp(-entropy)), p, 0)


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
