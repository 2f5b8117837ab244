"""Each stage on its own, against NumPy, over tables holding every library stage and a
user-style subclass of every base."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case
from user_stages import (
    ArgminPrefixCounter,
    LenientRatioTest as UserLenientRatioTest,
    ScatterTokenAssembler,
    SearchsortedSampler,
    SwitchedRatioTest,
    TopKArgmaxSampler,
    UserIIDCandidates,
)

import eqx_specdec as es


def _name(stage):
    fields = {k: v for k, v in vars(stage).items() if not k.startswith("_")}
    shown = ", ".join(f"{k}={v}" for k, v in fields.items() if not hasattr(v, "shape"))
    return f"{type(stage).__name__}({shown})"


# --- Ratio tests: (stage, reads log-probabilities, NumPy thresholds). Each reference
# gives per position the threshold t_i with "passes" = u_i < t_i (for rules that draw no
# uniform, t_i is +inf or -inf).


def _standard(x, q, p, lenience=1.0):
    p_x = p[np.arange(len(x)), x]
    q_x = q[np.arange(len(x)), x]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q_x > 0, p_x / (lenience * q_x), np.inf) * (p_x > 0)


def _greedy(x, q, p):
    return np.where(np.argmax(p[:-1], -1) == x, np.inf, -np.inf)


def _typical(x, q, p, epsilon=0.09, delta=0.3):
    rows = p[:-1]
    entropy = -np.sum(rows * np.log(rows + 1e-5), -1)
    p_x = rows[np.arange(len(x)), x]
    return np.where(
        p_x > np.minimum(epsilon, delta * np.exp(-entropy)), np.inf, -np.inf
    )


def _block(x, q, p):
    """h_1..h_G of block verification (Sun et al.), from the definitions."""
    gamma = len(x)
    cum = [1.0]
    for i in range(gamma):
        ratio = p[i, x[i]] / q[i, x[i]] if q[i, x[i]] > 0 else np.inf
        cum.append(min(1.0, cum[-1] * ratio))
    h = []
    for k in range(1, gamma):
        z = np.maximum(cum[k] * p[k] - q[k], 0).sum()
        denominator = z + 1 - cum[k]
        h.append(z / denominator if denominator > 0 else 1.0)
    return np.array(h + [cum[gamma]])


RATIO_TESTS = [
    (es.RatioTest(), False, _standard),
    (es.RatioTest(), True, _standard),
    (es.LenientRatioTest(0.6), False, lambda x, q, p: _standard(x, q, p, 0.6)),
    (es.LenientRatioTest(0.6), True, lambda x, q, p: _standard(x, q, p, 0.6)),
    (es.GreedyRatioTest(), False, _greedy),
    (es.TypicalRatioTest(), False, _typical),
    (es.TypicalRatioTest(0.2, 0.5), True, lambda x, q, p: _typical(x, q, p, 0.2, 0.5)),
    (es.BlockRatioTest(), False, _block),
    (UserLenientRatioTest(0.6), False, lambda x, q, p: _standard(x, q, p, 0.6)),
    (UserLenientRatioTest(0.6), True, lambda x, q, p: _standard(x, q, p, 0.6)),
    (es.BlockRatioTest(), True, _block),
    (SwitchedRatioTest("division"), False, _standard),
]  # fmt: skip


@pytest.mark.parametrize(
    "ratio_test, log_space, thresholds",
    RATIO_TESTS,
    ids=[_name(e[0]) + ("-log" if e[1] else "") for e in RATIO_TESTS],
)
def test_ratio_test(ratio_test, log_space, thresholds):
    checked = 0
    for seed in range(4):
        x, q, p, u, _ = random_case(seed, 1, 6, 5)
        x, q, p, u = x[0], q[0], p[0], u[0]
        if seed == 0:
            # Boundary cases: q(x) = 0 < p(x) passes even for u near 1; p(x) = 0 never
            # passes, even for u = 0.
            q[0] = np.where(np.arange(5) == x[0], 0.0, q[0] / (1 - q[0, x[0]]))
            p[1] = np.where(np.arange(5) == x[1], 0.0, p[1] / (1 - p[1, x[1]]))
            u[0], u[1] = 0.99, 0.0
        t = thresholds(x, q.astype(np.float64), p.astype(np.float64))
        with np.errstate(divide="ignore"):
            inputs = (x, np.log(q), np.log(p), u) if log_space else (x, q, p, u)
        context = es.RowContext(log_space=log_space)
        verdict = jax.jit(ratio_test)(*(jnp.asarray(a) for a in inputs), context)
        assert verdict.passed.shape == (6,) and verdict.passed.dtype == jnp.bool_
        clear = np.abs(u - t) > 1e-4
        if isinstance(ratio_test, es.BlockRatioTest):
            # Block verification's passes are read through the last-success count.
            clear &= np.isfinite(t)
        np.testing.assert_array_equal(np.asarray(verdict.passed)[clear], (u < t)[clear])
        checked += clear.sum()
    assert checked >= 20


# --- Prefix counters: (stage, reference count of a pattern).

PREFIX_COUNTERS = [
    (es.PrefixCounter(), lambda row: next((i for i, ok in enumerate(row) if not ok), len(row))),
    (es.LastSuccessCounter(), lambda row: max([i + 1 for i, ok in enumerate(row) if ok], default=0)),
    (ArgminPrefixCounter(), lambda row: next((i for i, ok in enumerate(row) if not ok), len(row))),
]  # fmt: skip


@pytest.mark.parametrize(
    "counter, expected", PREFIX_COUNTERS, ids=[_name(e[0]) for e in PREFIX_COUNTERS]
)
@pytest.mark.parametrize("gamma", [1, 2, 5])
def test_prefix_counter_on_every_pattern(counter, expected, gamma):
    patterns = np.array(list(itertools.product([False, True], repeat=gamma)))
    counts = jax.jit(jax.vmap(counter))(jnp.asarray(patterns))
    np.testing.assert_array_equal(counts, [expected(row) for row in patterns])
    assert jnp.issubdtype(counts.dtype, jnp.integer)


# --- Residual samplers: (stage, reads log-probabilities, the distribution it draws
# from given n, None when deterministic: its token instead).


def _residual(x, q, p, n):
    gamma = len(x)
    if n == gamma:
        return p[gamma]
    residual = np.maximum(p[n] - q[n], 0)
    return residual if residual.sum() > 0 else p[n]


def _typical_weights(x, q, p, n):
    row = p[n]
    entropy = -np.sum(row * np.log(row + 1e-5))
    masked = np.where(row > min(0.09, 0.3 * np.exp(-entropy)), row, 0)
    return masked if masked.sum() > 0 else row


def _argmax(x, q, p, n):
    return np.eye(p.shape[1])[np.argmax(p[n])]


SAMPLERS = [
    (es.ResidualSampler(), False, _residual),
    (es.ResidualSampler(), True, _residual),
    (SearchsortedSampler(), True, _residual),
    (es.ArgmaxSampler(), False, _argmax),
    (es.TypicalSampler(), False, _typical_weights),
    (SearchsortedSampler(), False, _residual),
    (TopKArgmaxSampler(4), False, _argmax),
]  # fmt: skip


@pytest.mark.parametrize(
    "sampler, log_space, weights",
    SAMPLERS,
    ids=[_name(e[0]) + ("-log" if e[1] else "") for e in SAMPLERS],
)
def test_residual_sampler_at_every_count(sampler, log_space, weights):
    gamma, vocab = 4, 300
    x, q, p, _, _ = random_case(1, 1, gamma, vocab)
    x, q, p = x[0], q[0], p[0]
    verdict = es.Verdict(jnp.zeros(gamma, bool))
    inputs = (np.log(q), np.log(p)) if log_space else (q, p)
    run = jax.jit(sampler)
    checked = 0
    for n in range(gamma + 1):
        w = weights(x, q.astype(np.float64), p.astype(np.float64), n)
        cdf = np.cumsum(w / w.sum())
        for s in np.linspace(0.01, 0.99, 25):
            if np.min(np.abs(cdf - s)) < 1e-4:
                continue
            y = run(jnp.int32(n), verdict, jnp.asarray(x), *map(jnp.asarray, inputs),
                    jnp.float32(s), es.RowContext(log_space=log_space))  # fmt: skip
            assert int(y) == np.argmax(cdf > s)
            checked += 1
    assert checked > 100


def test_gumbel_sampler_draws_from_the_residual_by_key():
    """Key-driven: each key gives one token, in the residual's support, and the tokens
    of many keys follow the residual (a loose frequency check: 4000 draws, V = 6)."""
    gamma, vocab = 2, 6
    x, q, p, _, _ = random_case(2, 1, gamma, vocab)
    x, q, p = x[0], q[0], p[0]
    verdict = es.Verdict(jnp.zeros(gamma, bool))
    keys = jax.random.split(jax.random.key(0), 4000)
    draw = jax.jit(
        jax.vmap(es.GumbelSampler(), in_axes=(None, None, None, None, None, 0))
    )
    tokens = np.asarray(draw(jnp.int32(0), verdict, *map(jnp.asarray, (x, q, p)), keys))
    w = _residual(x, q.astype(np.float64), p.astype(np.float64), 0)
    frequencies = np.bincount(tokens, minlength=vocab) / len(tokens)
    assert np.all(frequencies[w == 0] == 0)
    np.testing.assert_allclose(frequencies, w / w.sum(), atol=0.04)


# --- Token assemblers.

ASSEMBLERS = [es.TokenAssembler(), ScatterTokenAssembler()]


@pytest.mark.parametrize("assembler", ASSEMBLERS, ids=_name)
def test_token_assembler_at_every_count(assembler):
    x = jnp.array([7, 8, 9], jnp.int32)
    for n in range(4):
        tokens = jax.jit(assembler)(jnp.int32(n), x, jnp.int32(42))
        expected = [7, 8, 9][:n] + [42] + [-1] * (3 - n)
        np.testing.assert_array_equal(tokens, expected)


# --- Node rules: `test` agrees with the `pass_threshold` capability, and
# `candidate_law` is a distribution that respects the rule's drafting.

NODE_RULES = [
    (es.IIDCandidates(), "with replacement"),
    (es.WithoutReplacementCandidates(), "without replacement"),
    (es.DeterministicCandidates(), "top-k"),
    (es.SpecTrKSeq(), "with replacement"),
    (es.ImportanceSampling(3), "with replacement"),
    (UserIIDCandidates(), "with replacement"),
]


@pytest.mark.parametrize(
    "rule, drafting", NODE_RULES, ids=[_name(e[0]) for e in NODE_RULES]
)
def test_node_rule_capabilities_agree_with_its_test(rule, drafting):
    rng = np.random.default_rng(0)
    vocab = 7
    p = jnp.asarray(rng.dirichlet(np.ones(vocab)), jnp.float32)
    q = jnp.asarray(rng.dirichlet(np.ones(vocab)), jnp.float32)
    draft = q if rule.uses_draft_probs else jnp.zeros(vocab, jnp.float32)
    tokens = jnp.asarray([3, 1, 5], jnp.int32)  # a node's candidates, each rejected
    state = rule.init(p, draft, tokens, jnp.ones(3, bool))
    for child, token in enumerate(tokens):
        child = jnp.int32(child)
        t = rule.pass_threshold(state, token, child)
        for u in np.linspace(0.005, 0.995, 50):
            if abs(u - float(t)) > 1e-5:
                passed = rule.test(state, token, jnp.float32(u), child)
                assert bool(passed) == (u < float(t))
        state = rule.reject(state, token, child)
    correction = np.asarray(rule.correction(state))
    assert np.all(correction >= 0) and correction.sum() > 0
    drafted = jnp.arange(vocab) < 2
    law = np.asarray(rule.candidate_law(q, drafted))
    assert law.sum() == pytest.approx(1.0, abs=1e-6) and np.all(law >= 0)
    if drafting == "with replacement":
        np.testing.assert_allclose(law, q, rtol=1e-6)
    elif drafting == "without replacement":
        assert np.all(law[:2] == 0)
        np.testing.assert_allclose(law[2:], q[2:] / q[2:].sum(), rtol=1e-5)
    else:
        assert law[2 + int(np.argmax(q[2:]))] == 1.0
