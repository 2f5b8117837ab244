"""The everyday variants: greedy, one-hot drafts, logits with warping, typical acceptance,
lenience, the Gumbel sampler and the key-based entry point."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_from_key, accept_logits, random_case, reference, softmax
from lossless_cases import (
    distributions,
    lenient_first_position,
    total_variation,
    typical_first_position,
    typical_masked,
)
from user_stages import LenientRatioTest as UserLenientRatioTest

import eqx_specdec


GREEDY = eqx_specdec.Verifier(
    eqx_specdec.GreedyRatioTest(), residual_sampler=eqx_specdec.ArgmaxSampler()
)
STANDARD = eqx_specdec.Verifier()


def _greedy_reference(x, p):
    best = p.argmax(-1)
    batch, gamma = x.shape
    n = np.array(
        [
            next((i for i in range(gamma) if x[b, i] != best[b, i]), gamma)
            for b in range(batch)
        ]
    )
    tokens = np.full((batch, gamma + 1), -1)
    for b in range(batch):
        tokens[b, : n[b]] = x[b, : n[b]]
        tokens[b, n[b]] = best[b, n[b]]
    return n, tokens


# --- Greedy -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_greedy_against_reference(seed):
    x, q, p, _, _ = random_case(seed, 16, 5, 64)
    # Make many draft tokens the argmax, so that prefixes of every length occur.
    best = p[:, :5].argmax(-1)
    take = np.random.default_rng(seed).random(x.shape) < 0.8
    x = np.where(take, best, x).astype(np.int32)
    out = eqx_specdec.speculative_accept(x, q, p, None, None, verifier=GREEDY)
    n, tokens = _greedy_reference(x, p)
    np.testing.assert_array_equal(out["num_accepted"], n)
    np.testing.assert_array_equal(out["tokens"], tokens)
    assert len(set(n.tolist())) >= 3


def test_greedy_ties_go_to_the_lowest_id():
    p = np.full((1, 2, 4), 0.25, np.float32)
    out = eqx_specdec.speculative_accept(
        np.array([[1]], np.int32), None, p, None, None, verifier=GREEDY
    )
    np.testing.assert_array_equal(out["tokens"], [[0, -1]])


@pytest.mark.parametrize("case", [("peaked", 2, 5, 0), ("flat", 3, 4, 1)])
def test_greedy_is_exact_greedy_decoding(case):
    """Whatever the draft, the greedy verifier emits the target's argmax at every
    reached position (quadrature over every draft sequence)."""
    q, p, law = distributions(*case)
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        GREEDY, q, p, draft_law=law
    )
    greedy_target = np.eye(p.shape[1])[p.argmax(-1)]
    assert estimate.max_error(greedy_target) < 1e-12


# --- One-hot drafts --------------------------------------------------------------------


def _one_hot_temp_bytes(gamma, batch=32, vocab=32_000):
    x = jnp.zeros((batch, gamma), jnp.int32)
    p = jnp.full((batch, gamma + 1, vocab), 1 / vocab, jnp.float32)
    u = jnp.zeros((batch, gamma), jnp.float32)
    s = jnp.zeros((batch,), jnp.float32)
    step = jax.jit(lambda x, p, u, s: eqx_specdec.Verifier()(x, None, p, u, s))
    return step.lower(x, p, u, s).compile().memory_analysis().temp_size_in_bytes


def test_one_hot_drafts_never_materialise_q():
    """The compiled one-hot step's temporary memory is O(B V): it does not grow with G,
    and stays below the size of a single (B, G, V) one-hot q."""
    small, large = _one_hot_temp_bytes(8), _one_hot_temp_bytes(16)
    assert large <= 1.1 * small
    assert large < 32 * 16 * 32_000 * 4 / 4


# --- Logits and warping ---------------------------------------------------------------


def _warp_reference(logits, temperature, top_k=None, top_p=None, min_p=None, bias=None):
    logits = np.asarray(logits, np.float64)
    out = np.empty_like(logits)
    for idx in np.ndindex(logits.shape[:-1]):
        row, t = logits[idx], temperature[idx[0]]
        if bias is not None:
            row = row + bias[idx[0]]
        if t == 0:
            out[idx] = np.where(np.arange(len(row)) == np.argmax(row), 0.0, -np.inf)
            continue
        z = row / t
        if top_k is not None and top_k[idx[0]] > 0:
            kth = np.sort(z)[::-1][top_k[idx[0]] - 1]
            z = np.where(z < kth, -np.inf, z)
        if top_p is not None:
            probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
            order = np.argsort(-probs, kind="stable")
            before = np.cumsum(probs[order]) - probs[order]
            keep = max(int(np.sum(before < top_p[idx[0]])), 1)
            cutoff = probs[order][keep - 1]
            z = np.where(probs < cutoff, -np.inf, z)
        if min_p is not None:
            probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
            z = np.where(probs < min_p[idx[0]] * probs.max(), -np.inf, z)
        out[idx] = z - np.log(np.sum(np.exp(z - z.max()))) - z.max()
    return out


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [
        ([1.0, 0.5, 2.0], None, None),
        ([0.0, 1.0, 0.7], None, None),
        ([1.0, 1.0, 0.8], [5, 0, 20], None),
        ([1.0, 0.9, 1.3], None, [0.9, 0.5, 1.0]),
        ([0.8, 0.0, 1.0], [10, 3, 40], [0.95, 0.9, 0.3]),
    ],
)
def test_warp_against_reference(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(3, 4, 50)) * 2
    warp = eqx_specdec.Warp(
        jnp.asarray(temperature, jnp.float32),
        None if top_k is None else jnp.asarray(top_k, jnp.int32),
        None if top_p is None else jnp.asarray(top_p, jnp.float32),
    )
    got = np.asarray(warp(jnp.asarray(logits, jnp.float32)))
    expected = _warp_reference(
        logits.astype(np.float32), temperature, top_k, None if top_p is None else top_p
    )
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], atol=1e-5)


@pytest.mark.parametrize(
    "temperature, top_k, min_p, bias",
    [
        ([1.0, 0.7, 1.3], None, [0.1, 0.0, 0.5], False),
        ([1.0, 0.0, 0.8], [10, 0, 5], [0.05, 0.2, 1.0], True),
        ([0.9, 1.0, 0.0], None, None, True),
    ],
)
def test_min_p_and_logit_bias_against_reference(temperature, top_k, min_p, bias):
    """min-p after the other warps, the per-row logit bias before them (-inf bans a
    token, and a greedy row takes the biased argmax)."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 4, 50)) * 2
    row_bias = None
    if bias:
        row_bias = rng.normal(size=(3, 50)) * 3
        row_bias[:, :5] = -np.inf  # banned tokens
    warp = eqx_specdec.Warp(
        jnp.asarray(temperature, jnp.float32),
        None if top_k is None else jnp.asarray(top_k, jnp.int32),
        min_p=None if min_p is None else jnp.asarray(min_p, jnp.float32),
        logit_bias=None if row_bias is None else jnp.asarray(row_bias, jnp.float32),
    )
    got = np.asarray(warp(jnp.asarray(logits, jnp.float32)))
    expected = _warp_reference(
        logits.astype(np.float32),
        temperature,
        top_k,
        min_p=min_p,
        bias=None if row_bias is None else row_bias.astype(np.float32),
    )
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], atol=1e-5)
    if bias:
        assert np.all(np.isinf(got[..., :5]))


def _logit_case(seed, batch=16, gamma=4, vocab=200, scale=1.0):
    rng = np.random.default_rng(seed)
    target = rng.normal(size=(batch, gamma + 1, vocab)) * 2
    draft = target[:, :gamma] + rng.normal(size=(batch, gamma, vocab))
    x = np.array(
        [
            [rng.choice(vocab, p=softmax(draft[b, i])) for i in range(gamma)]
            for b in range(batch)
        ],
        np.int32,
    )
    u = rng.random((batch, gamma)).astype(np.float32)
    s = rng.random(batch).astype(np.float32)
    return (
        x,
        (draft * scale).astype(np.float32),
        (target * scale).astype(np.float32),
        u,
        s,
    )


def test_logits_match_probabilities_path():
    """Log-space verification of softmax(logits) agrees with the probability path on the
    same distributions, away from ties."""
    x, draft, target, u, s = _logit_case(0)
    out = accept_logits(x, draft, target, u, s)
    q, p = softmax(draft.astype(np.float64)), softmax(target.astype(np.float64))
    n, tokens, ambiguous = reference(x, q, p, u, s)
    np.testing.assert_array_equal(
        np.asarray(out["tokens"])[~ambiguous], tokens[~ambiguous]
    )
    assert (~ambiguous).sum() >= 12


def test_huge_logits_do_not_overflow():
    """Logits of 1e4 at temperature 1e4 give the same tokens as logits of 1 at 1."""
    x, draft, target, u, s = _logit_case(1)
    base = accept_logits(x, draft, target, u, s)
    huge = accept_logits(
        x, draft * 1e4, target * 1e4, u, s,
        target_warp=eqx_specdec.Warp(1e4), draft_warp=eqx_specdec.Warp(1e4),
    )  # fmt: skip
    np.testing.assert_array_equal(base["tokens"], huge["tokens"])
    assert np.abs(draft * 1e4).max() > 1e4


def test_mixed_greedy_and_sampled_rows_equal_rows_computed_separately():
    x, draft, target, u, s = _logit_case(2, batch=8)
    temperature = jnp.asarray([0.0, 1.0, 0.0, 0.7, 1.0, 0.0, 0.5, 1.3], jnp.float32)
    mixed = accept_logits(
        x, draft, target, u, s, target_warp=eqx_specdec.Warp(temperature)
    )
    for b in range(8):
        t = float(temperature[b])
        alone = accept_logits(
            x[b : b + 1], draft[b : b + 1], target[b : b + 1], u[b : b + 1], s[b : b + 1],
            target_warp=eqx_specdec.Warp(t),
        )  # fmt: skip
        np.testing.assert_array_equal(mixed["tokens"][b], alone["tokens"][0])
        if t == 0:  # a greedy row is greedy verification of the raw target
            greedy = eqx_specdec.speculative_accept(
                x[b : b + 1], None, softmax(target[b : b + 1].astype(np.float64)),
                None, None, verifier=GREEDY,
            )  # fmt: skip
            np.testing.assert_array_equal(mixed["tokens"][b], greedy["tokens"][0])


def test_a_subnormal_temperature_is_greedy_or_refused():
    """A temperature too small to divide by (a subnormal: flushed to zero by the
    hardware) means one thing on every path: traced, it is greedy, with finite
    log-probabilities; given concretely, it is refused with the fix."""
    x, draft, target, u, s = _logit_case(6, batch=4)
    run = jax.jit(
        lambda t: accept_logits(
            x, draft, target, u, s,
            target_warp=eqx_specdec.Warp(t), logprobs=eqx_specdec.LogProbs(),
        )
    )  # fmt: skip
    out = run(jnp.asarray([1e-38, 1e-40, 1e-45, 1e-39], jnp.float32))
    greedy = run(jnp.zeros(4, jnp.float32))
    np.testing.assert_array_equal(out["tokens"], greedy["tokens"])
    assert np.all(np.isfinite(out["logprobs"][out["tokens"] >= 0]))
    with pytest.raises(ValueError, match="`temperature` must be 0"):
        eqx_specdec.Warp(1e-38)


BIAS = np.array([0.5, -np.inf, 0.0, 2.0, -1.0, 0.0], np.float32)  # V = 6


@pytest.mark.parametrize(
    "target_warp, draft_warp",
    [
        (eqx_specdec.Warp(0.7, top_k=4), eqx_specdec.Warp(1.3)),
        (eqx_specdec.Warp(1.0, top_p=0.8), eqx_specdec.Warp(0.5, top_k=5)),
        (eqx_specdec.Warp(0.0), eqx_specdec.Warp(1.0)),
        (
            eqx_specdec.Warp(0.8, min_p=0.1, logit_bias=jnp.asarray(BIAS)),
            eqx_specdec.Warp(0.8, min_p=0.1, logit_bias=jnp.asarray(BIAS)),
        ),
    ],
)
def test_warped_verification_is_lossless(target_warp, draft_warp):
    """Quadrature: with x drawn from the warped draft, the log-space verifier emits the
    warped target exactly."""
    rng = np.random.default_rng(5)
    target = rng.normal(size=(1, 3, 6)) * 2
    draft = rng.normal(size=(1, 2, 6)) * 2
    p = np.exp(np.asarray(target_warp(jnp.asarray(target, jnp.float32)), np.float64))[0]
    q = np.exp(np.asarray(draft_warp(jnp.asarray(draft, jnp.float32)), np.float64))[0]
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        STANDARD, q, p, log_inputs=True
    )
    assert estimate.max_error(p) < 1e-6


def test_one_verifier_serves_probabilities_and_logits():
    """The rows' space comes from the input's type: the same verifiers (the library's,
    and a user's stage written for probabilities, which converts through its context)
    give the tokens on logits that they give on the softmax of those logits."""
    x, draft, target, u, s = _logit_case(3, batch=8)
    for verifier in (STANDARD, eqx_specdec.Verifier(UserLenientRatioTest(0.7))):
        on_logits = accept_logits(x, draft, target, u, s, verifier=verifier)
        on_probs = eqx_specdec.speculative_accept(
            x, softmax(draft), softmax(target), u, s, verifier=verifier
        )
        for name in ("num_accepted", "tokens"):
            np.testing.assert_array_equal(on_logits[name], on_probs[name])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.at[1, 0, 3].set(jnp.nan), "`target_logits` holds a NaN or +inf logit in row 1 (the first such row)"),
        (lambda t: t.at[0, 1].set(-jnp.inf), "`target_logits` has a distribution whose logits are all -inf in row 0 (the first such row)"),
    ],
)  # fmt: skip
def test_bad_logits_fail_at_run_time(change, message):
    x, draft, target, u, s = _logit_case(4, batch=2)
    with pytest.raises(
        RuntimeError,
        match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+"),
    ):
        jax.block_until_ready(
            accept_logits(x, draft, change(jnp.asarray(target)), u, s)
        )


def test_bad_warp_parameters():
    with pytest.raises(ValueError, match="`temperature` must lie in"):
        eqx_specdec.Warp(-1.0)
    with pytest.raises(ValueError, match="`top_p` must lie in"):
        eqx_specdec.Warp(1.0, top_p=1.5)
    x, draft, target, u, s = _logit_case(4, batch=2)
    with pytest.raises(RuntimeError, match="`target_warp.temperature` is negative"):
        run = jax.jit(
            lambda t: accept_logits(
                x, draft, target, u, s, target_warp=eqx_specdec.Warp(t)
            )
        )
        jax.block_until_ready(run(jnp.asarray([1.0, -0.5], jnp.float32)))


# --- Lenience and typical acceptance (lossy) -------------------------------------------


def test_lenience_one_is_the_standard_verifier_bit_for_bit():
    x, q, p, u, s = random_case(7, 16, 5, 300)
    standard = eqx_specdec.speculative_accept(x, q, p, u, s)
    lenient = eqx_specdec.speculative_accept(
        x, q, p, u, s, verifier=eqx_specdec.Verifier(eqx_specdec.LenientRatioTest(1.0))
    )
    for key in standard:
        np.testing.assert_array_equal(standard[key], lenient[key])


# Measured on the reference case ("peaked", G = 1, V = 8, seed 11); quoted in docs/variants.md.
LENIENCE_DISTANCES = {1.0: 0.0, 0.8: 0.0073, 0.5: 0.0293, 0.25: 0.0880}


def test_lenience_trades_distance_for_acceptance():
    q, p, law = distributions("peaked", 1, 8, 11)
    distances, accepted = [], []
    for lenience, documented in LENIENCE_DISTANCES.items():
        verifier = eqx_specdec.Verifier(eqx_specdec.LenientRatioTest(lenience))
        with np.errstate(divide="ignore", invalid="ignore"):
            thresholds = p[:1] / (lenience * q)
        estimate = eqx_specdec.evaluation.emission_by_quadrature(
            verifier, q, p, draft_law=law, accept_breakpoints=thresholds
        )
        exact = lenient_first_position(q[0], p[0], lenience)
        np.testing.assert_allclose(estimate.conditional()[0], exact, atol=1e-6)
        distances.append(total_variation(estimate.conditional()[0], p[0]))
        accepted.append(estimate.reached[1])
        assert abs(distances[-1] - documented) < 5e-4
    assert distances == sorted(distances) and accepted == sorted(accepted)
    assert distances[-1] > 0.05 and accepted[-1] > accepted[0] + 0.05


TYPICAL_DISTANCES = {"argmax": 0.1148, "sampled": 0.0570}


@pytest.mark.parametrize("correction", ["argmax", "sampled"])
def test_typical_acceptance_distance(correction):
    q, p, law = distributions("peaked", 1, 8, 11)
    sampler = (
        eqx_specdec.ArgmaxSampler()
        if correction == "argmax"
        else eqx_specdec.TypicalSampler()
    )
    verifier = eqx_specdec.Verifier(
        eqx_specdec.TypicalRatioTest(), residual_sampler=sampler
    )
    exact = typical_first_position(q[0], p[0], sampled=correction == "sampled")
    # Cut the grid where the masked correction's cumulative sums lie.
    masked = [typical_masked(row) for row in p]
    breaks = np.concatenate([np.cumsum(m) / m.sum() for m in masked])
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        verifier, q, p, draft_law=law, sample_breakpoints=breaks
    )
    np.testing.assert_allclose(estimate.conditional()[0], exact, atol=1e-6)
    distance = total_variation(exact, p[0])
    assert abs(distance - TYPICAL_DISTANCES[correction]) < 5e-4


def test_typical_threshold_rule():
    p = np.array([[[0.5, 0.3, 0.15, 0.05], [0.25] * 4]], np.float32)
    entropy = -np.sum(p[0, 0] * np.log(p[0, 0] + 1e-5))
    threshold = min(0.09, 0.3 * np.exp(-entropy))
    for token in range(4):
        verdict = eqx_specdec.TypicalRatioTest()(
            jnp.asarray([token], jnp.int32), None, jnp.asarray(p[0]), jnp.zeros(1)
        )
        assert bool(verdict.passed[0]) == bool(p[0, 0, token] > threshold)


# --- Samplers and keys -------------------------------------------------------------------


@pytest.mark.execution_bound
@pytest.mark.parametrize("case", [("flat", 1, 64, 100), ("peaked", 3, 64, 101)])
def test_gumbel_sampler_is_lossless(case):
    q, p, law = distributions(*case)
    verifier = eqx_specdec.Verifier(residual_sampler=eqx_specdec.GumbelSampler())
    estimate = eqx_specdec.evaluation.emission_by_monte_carlo(
        verifier, q, p, jax.random.key(9), 100_000, draft_law=law
    )
    stats = estimate.chi_square(p)
    reached = estimate.reached > 0
    assert np.all(stats["statistic"][reached] < stats["threshold"][reached])


def test_gumbel_sampler_never_picks_zero_weight_tokens():
    vocab = 1000
    p = np.zeros((2, vocab), np.float32)
    p[:, ::7] = 1.0
    p /= p.sum(-1, keepdims=True)
    verifier = eqx_specdec.Verifier(residual_sampler=eqx_specdec.GumbelSampler())
    out = accept_from_key(
        jax.random.key(0), jnp.zeros((64, 1), jnp.int32), None,
        jnp.broadcast_to(p, (64, 2, vocab)), verifier=verifier,
    )  # fmt: skip
    tokens = np.asarray(out["tokens"])
    assert np.all(tokens[tokens >= 0] % 7 == 0)


@pytest.mark.parametrize(
    "verifier",
    [
        eqx_specdec.Verifier(),
        eqx_specdec.Verifier(residual_sampler=eqx_specdec.GumbelSampler()),
    ],
)
def test_key_entry_point_is_reproducible_and_batch_invariant(verifier):
    x, q, p, _, _ = random_case(8, 16, 4, 100)
    key = jax.random.key(42)
    first = accept_from_key(key, x, q, p, verifier=verifier)
    again = accept_from_key(key, x, q, p, verifier=verifier)
    np.testing.assert_array_equal(first["tokens"], again["tokens"])
    head = accept_from_key(key, x[:5], q[:5], p[:5], verifier=verifier)
    np.testing.assert_array_equal(first["tokens"][:5], head["tokens"])
    other = accept_from_key(jax.random.key(43), x, q, p, verifier=verifier)
    assert not np.array_equal(first["tokens"], other["tokens"])
    drawn = eqx_specdec.Uniforms.from_key(key, 16, 4, verifier=verifier)
    u, s = drawn.accept, drawn.sample
    explicit = eqx_specdec.speculative_accept(x, q, p, u, s, verifier=verifier)
    np.testing.assert_array_equal(first["tokens"], explicit["tokens"])


def test_randomness_is_required_where_used():
    x, q, p, u, s = random_case(9, 2, 3, 10)
    with pytest.raises(
        TypeError, match="`accept_uniforms` is None, but RatioTest draws"
    ):
        eqx_specdec.speculative_accept(x, q, p, None, s)
    with pytest.raises(
        TypeError, match="`sample_uniforms` is None, but ResidualSampler"
    ):
        eqx_specdec.speculative_accept(x, q, p, u, None)
    gumbel = eqx_specdec.Verifier(residual_sampler=eqx_specdec.GumbelSampler())
    with pytest.raises(
        TypeError, match="GumbelSampler draws from one `jax.random` key"
    ):
        eqx_specdec.speculative_accept(x, q, p, u, s, verifier=gumbel)
