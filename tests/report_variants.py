"""Prints the variants table of docs/variants.md: acceptance and distance from the
target on one reference case, measured by exact quadrature (Monte Carlo for the
key-driven Gumbel sampler).

    python tests/report_variants.py
"""

import jax
import jax.numpy as jnp
import numpy as np
from lossless_cases import (
    distributions,
    REFERENCE_CASE,
    total_variation,
    typical_masked,
)

import eqx_specdec as es


def _row(name, estimate, target, draws=None):
    gamma = target.shape[0] - 1
    reached = estimate.reached / (draws or 1)
    accepted = reached[1:].sum()
    conditional = estimate.conditional()
    distance = max(
        total_variation(conditional[k], target[k])
        for k in range(gamma + 1)
        if reached[k] > 0
    )
    print(f"| {name} | {accepted / gamma:.3f} | {1 + accepted:.3f} | {distance:.4f} |")


def main():
    q, p, law = distributions(*REFERENCE_CASE)
    gamma, vocab = q.shape
    print(
        "| variant | acceptance rate | tokens per step | distance from its target (max TV) |"
    )
    print("|---|---|---|---|")
    quad = es.evaluation.emission_by_quadrature
    _row("standard", quad(es.Verifier(), q, p), p)
    greedy = es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler())
    _row(
        "greedy (target: greedy decoding)",
        quad(greedy, q, p),
        np.eye(vocab)[p.argmax(-1)],
    )
    argmax_drafter = np.eye(vocab)[q.argmax(-1)]
    _row(
        "one-hot drafts (argmax drafter)",
        quad(es.Verifier(), None, p, draft_law=argmax_drafter),
        p,
    )
    warp_p, warp_q = es.Warp(0.7, top_k=4), es.Warp(0.7)
    p_w = np.exp(
        np.asarray(warp_p(jnp.asarray(np.log(p)[None], jnp.float32)), np.float64)
    )[0]
    q_w = np.exp(
        np.asarray(warp_q(jnp.asarray(np.log(q)[None], jnp.float32)), np.float64)
    )[0]
    log_space = es.Verifier()
    _row(
        "warped, T = 0.7, top-k 4 (target: warped)",
        quad(log_space, q_w, p_w, log_inputs=True),
        p_w,
    )
    for lenience in (0.8, 0.5):
        with np.errstate(divide="ignore", invalid="ignore"):
            breaks = p[:gamma] / (lenience * q)
        verifier = es.Verifier(es.LenientRatioTest(lenience))
        _row(
            f"lenience l = {lenience}",
            quad(verifier, q, p, accept_breakpoints=breaks),
            p,
        )
    masked = [typical_masked(row) for row in p]
    breaks = np.concatenate([np.cumsum(m) / m.sum() for m in masked])
    for name, sampler in [
        ("argmax", es.ArgmaxSampler()),
        ("sampled", es.TypicalSampler()),
    ]:
        verifier = es.Verifier(es.TypicalRatioTest(), residual_sampler=sampler)
        _row(
            f"typical, {name} correction",
            quad(verifier, q, p, sample_breakpoints=breaks),
            p,
        )
    synthetic = es.Verifier(es.SyntheticRatioTest(0.5))
    _row(
        "synthetic, rates 0.5",
        quad(synthetic, q, p, accept_breakpoints=np.full((gamma, 1), 0.5)),
        p,
    )
    relaxed = es.TopNRelaxedRatioTest(top_n=10, delta=0.6)
    _row("top-N relaxed, N = 10, delta = 0.6", quad(es.Verifier(relaxed), q, p), p)
    _row(
        "top-N relaxed at the second position only",
        quad(es.Verifier(es.TopNRelaxedRatioTest(relaxed=np.arange(gamma) == 1)), q, p),
        p,
    )
    _row("FLy, theta = 0.3, W = 1", quad(es.Verifier(es.FLyRatioTest(0.3, 1)), q, p), p)
    schedule = es.ScheduledRatioTest(es.RatioTest(), relaxed, strict_tokens=1)
    _row(
        "schedule: exact for 1 token, then top-N", quad(es.Verifier(schedule), q, p), p
    )
    block = es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter())
    _row("block verification", quad(block, q, p), p)
    gumbel = es.Verifier(residual_sampler=es.GumbelSampler())
    draws = 400_000
    estimate = es.evaluation.emission_by_monte_carlo(
        gumbel, q, p, jax.random.key(0), draws
    )
    _row(f"Gumbel sampler (Monte Carlo, {draws} draws)", estimate, p, draws)


if __name__ == "__main__":
    main()
