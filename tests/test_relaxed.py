"""Relaxed rules: top-N/delta under a per-row, per-position mask, FLy's look-ahead test
and the schedule by generated position, against NumPy references, per row as computed
alone, against exact quadrature, and in the decoding loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_case

import eqx_specdec as es


def _standard_passes(x, q, p, u):
    p_x = np.take_along_axis(p[:, :-1], x[..., None], -1)[..., 0]
    q_x = np.take_along_axis(q, x[..., None], -1)[..., 0]
    return u * q_x < p_x, p_x


def _top_n_reference(x, q, p, u, mask, top_n, delta):
    native, p_x = _standard_passes(x, q, p, u)
    rows = p[:, :-1]
    above = (rows > p_x[..., None]).sum(-1)
    relaxed = (above < top_n) & (p_x >= rows.max(-1) - delta)
    return np.where(mask, relaxed, native)


def _fly_reference(x, q, p, u, theta, window):
    native, p_x = _standard_passes(x, q, p, u)
    batch, gamma = x.shape
    out = native.copy()
    for b in range(batch):
        for i in range(gamma):
            top = np.sort(p[b, i])[::-1][:3]
            entropy = -sum(t * np.log(t) for t in top if t > 0)
            ahead = i + window < gamma and native[b, i + 1 : i + window + 1].all()
            if entropy >= theta and p_x[b, i] > 0 and ahead:
                out[b, i] = True
    return out


def _first_failures(passed):
    return np.cumprod(passed, axis=1).sum(1)


def _case(seed, batch=16, gamma=5, vocab=12):
    x, q, p, u, s = random_case(seed, batch, gamma, vocab)
    return [np.asarray(a) for a in (x, q, p, u, s)]


@pytest.mark.parametrize("batching", ["vmap", "map"])
def test_top_n_against_reference_with_a_per_row_mask(batching):
    x, q, p, u, s = _case(0)
    mask = np.random.default_rng(1).random(x.shape) < 0.5
    mask[0] = False  # a strict row
    test = es.TopNRelaxedRatioTest(top_n=3, delta=0.2, relaxed=jnp.asarray(mask))
    verifier = es.Verifier(ratio_test=test, batching=batching)
    out = es.speculative_accept(x, q, p, u, s, verifier=verifier)
    expected = _first_failures(
        _top_n_reference(x, q.astype(np.float64), p, u, mask, 3, 0.2)
    )
    np.testing.assert_array_equal(out["num_accepted"], expected)
    standard = es.speculative_accept(x, q, p, u, s)
    np.testing.assert_array_equal(out["tokens"][0], standard["tokens"][0])
    # Each row, verified alone with its own mask (shape (G,)), gives the same tokens.
    for b in range(4):
        alone = es.speculative_accept(
            x[b : b + 1], q[b : b + 1], p[b : b + 1], u[b : b + 1], s[b : b + 1],
            verifier=es.Verifier(
                ratio_test=es.TopNRelaxedRatioTest(3, 0.2, jnp.asarray(mask[b]))
            ),
        )  # fmt: skip
        np.testing.assert_array_equal(out["tokens"][b], alone["tokens"][0])
    # The mask matters: relaxed rows decide differently from the standard rule.
    assert (expected != _first_failures(_standard_passes(x, q, p, u)[0])).any()


def test_fly_against_reference():
    x, q, p, u, s = _case(2, gamma=6, vocab=6)
    for theta, window in ((0.3, 2), (0.0, 1), (0.8, 3)):
        verifier = es.Verifier(ratio_test=es.FLyRatioTest(theta, window))
        out = es.speculative_accept(x, q, p, u, s, verifier=verifier)
        expected = _first_failures(_fly_reference(x, q, p, u, theta, window))
        np.testing.assert_array_equal(out["num_accepted"], expected)
    # A look-ahead as long as the draft: the standard test, bit for bit.
    fly = es.speculative_accept(
        x, q, p, u, s, verifier=es.Verifier(ratio_test=es.FLyRatioTest(0.0, 6))
    )
    np.testing.assert_array_equal(
        fly["tokens"], es.speculative_accept(x, q, p, u, s)["tokens"]
    )


def test_schedule_by_generated_position():
    x, q, p, u, s = _case(3)
    relaxed = es.TopNRelaxedRatioTest(top_n=4, delta=0.3)
    generated = np.arange(16) % 7  # rows at different points of their responses

    def run(test):
        return es.speculative_accept(
            x, q, p, u, s, verifier=es.Verifier(ratio_test=test)
        )

    schedule = es.ScheduledRatioTest(
        es.RatioTest(), relaxed, strict_tokens=4, generated=jnp.asarray(generated)
    )
    got = run(schedule)["num_accepted"]
    native, _ = _standard_passes(x, q, p, u)
    loose = _top_n_reference(x, q, p, u, np.ones_like(native), 4, 0.3)
    exact_here = generated[:, None] + np.arange(5)[None] < 4
    np.testing.assert_array_equal(
        got, _first_failures(np.where(exact_here, native, loose))
    )
    never = es.ScheduledRatioTest(es.RatioTest(), relaxed, strict_tokens=100)
    np.testing.assert_array_equal(run(never)["tokens"], run(es.RatioTest())["tokens"])
    always = es.ScheduledRatioTest(es.RatioTest(), relaxed, strict_tokens=0)
    np.testing.assert_array_equal(run(always)["tokens"], run(relaxed)["tokens"])


def test_schedule_in_the_decoding_loop():
    """The loop tells the schedule each row's position: the first `strict_tokens` tokens
    are those of the exact loop, bit for bit; later ones differ."""
    draft, target = es.demo.builtin_models()
    prompts = np.tile(es.demo.encode("the ")[None], (8, 1))

    def run(test):
        return es.speculative_decode(
            draft, target, prompts, None, 48, jax.random.key(0),
            verifier=es.Verifier(ratio_test=test),
        ).tokens  # fmt: skip

    exact = np.asarray(run(es.RatioTest()))
    relaxed = es.TopNRelaxedRatioTest(top_n=5, delta=0.5)
    mixed = np.asarray(run(es.ScheduledRatioTest(es.RatioTest(), relaxed, 12)))
    np.testing.assert_array_equal(mixed[:, :12], exact[:, :12])
    assert (mixed != exact).any()


RELAXED = {
    "top-N": es.TopNRelaxedRatioTest(top_n=2, delta=0.3),
    "top-N, second position only": es.TopNRelaxedRatioTest(
        top_n=2, delta=0.3, relaxed=jnp.asarray([False, True])
    ),
    "schedule": es.ScheduledRatioTest(
        es.RatioTest(), es.TopNRelaxedRatioTest(top_n=2, delta=0.3), strict_tokens=1
    ),
}


@pytest.mark.parametrize("name", list(RELAXED))
def test_pass_probabilities_match_exact_quadrature(name):
    """The theory the rules declare exact (their `pass_probabilities`, read by the
    objectives) equals exact quadrature of the rule itself."""
    verifier = es.Verifier(ratio_test=RELAXED[name])
    for kind, seed in (("peaked", 0), ("flat", 1)):
        q, p, _ = es.evaluation.synthetic_distributions(kind, 2, 4, seed)
        exact = es.evaluation.evaluate_verifier(verifier, q, p, method="quadrature")
        theory = es.evaluation.acceptance_by_position(
            jnp.asarray(q[None], jnp.float32),
            jnp.asarray(p[None], jnp.float32),
            verifier=verifier,
        )
        np.testing.assert_allclose(np.asarray(theory)[0], exact.reached[1:], atol=1e-6)


def test_objectives_read_each_rows_mask():
    """A per-row mask in the objectives: each row's objective is that of the row alone
    with its own mask."""
    q, p, _ = es.evaluation.synthetic_distributions("peaked", 2, 4, 0)
    mask = jnp.asarray([[True, False], [False, True], [False, False]])
    batch_q = jnp.asarray(np.broadcast_to(q, (3,) + q.shape), jnp.float32)
    batch_p = jnp.asarray(np.broadcast_to(p, (3,) + p.shape), jnp.float32)

    def objective(relaxed, rows):
        test = es.TopNRelaxedRatioTest(top_n=2, delta=0.3, relaxed=relaxed)
        return es.evaluation.acceptance_by_position(
            batch_q[rows], batch_p[rows], verifier=es.Verifier(ratio_test=test)
        )

    together = objective(mask, slice(None))
    for b in range(3):
        alone = objective(mask[b], slice(b, b + 1))
        np.testing.assert_allclose(together[b], alone[0], rtol=1e-6)
    assert not np.allclose(together[0], together[2])


def test_fly_accepts_at_least_the_standard_rule():
    """FLy's declared lower bound holds, strictly, by exact quadrature."""
    q, p, _ = es.evaluation.synthetic_distributions("flat", 3, 4, 0)
    fly = es.evaluation.evaluate_verifier(
        es.Verifier(ratio_test=es.FLyRatioTest(0.1, 1)), q, p, method="quadrature"
    )
    standard = es.evaluation.evaluate_verifier(es.Verifier(), q, p, method="quadrature")
    assert fly.acceptance_rate > standard.acceptance_rate + 1e-3
    assert fly.distance > 1e-3 and standard.distance < 1e-6


def test_relaxed_errors():
    with pytest.raises(ValueError, match=r"`top_n`=...\) must be an int >= 1"):
        es.TopNRelaxedRatioTest(top_n=0)
    with pytest.raises(ValueError, match=r"`delta` must lie in \[0, 1\]"):
        es.TopNRelaxedRatioTest(delta=2.0)
    with pytest.raises(ValueError, match=r"`window`=...\) must be an int >= 1"):
        es.FLyRatioTest(window=0)
    x, q, p, u, s = _case(4, batch=2, gamma=3)
    bad = es.TopNRelaxedRatioTest(relaxed=jnp.asarray([True, False]))
    with pytest.raises(ValueError, match="`relaxed` has 2 positions for 3 draft"):
        es.speculative_accept(x, q, p, u, s, verifier=es.Verifier(ratio_test=bad))
    three_rows = es.TopNRelaxedRatioTest(relaxed=jnp.ones((3, 3), bool))
    with pytest.raises(ValueError, match="`relaxed` holds values for 3 rows, but the"):
        es.speculative_accept(
            x, q, p, u, s, verifier=es.Verifier(ratio_test=three_rows)
        )
    mesh = jax.make_mesh((1,), ("batch",))
    per_row = es.TopNRelaxedRatioTest(relaxed=jnp.ones((2, 3), bool))
    with pytest.raises(ValueError, match="holds per-row field values"):
        es.ShardedVerifier(es.Verifier(ratio_test=per_row), mesh, batch_axis="batch")
