"""Draft-length policies in the decoding loop: the stopping rule's lengths, variable
lengths verified as chains of their own length, the statistics and the errors. (The
whole-loop losslessness of each policy is in test_decoding.py.)"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_specdec as es


def test_stopping_rule_lengths_against_a_reference():
    rng = np.random.default_rng(0)
    gamma, vocab = 6, 5
    compared = 0
    for predictor in ("confidence", "oracle"):
        for threshold in (0.0, 0.3, 0.6, 0.9, 1.0):
            rule = es.StopWhenUnlikely(threshold, predictor)
            for _ in range(20):
                q = rng.dirichlet(np.ones(vocab) * 0.5, size=gamma)
                p = rng.dirichlet(np.ones(vocab) * 0.5, size=gamma + 1)
                x = rng.integers(0, vocab, gamma)
                if predictor == "confidence":
                    a = q.max(-1)
                else:
                    a = np.minimum(p[:gamma], q).sum(-1)
                risk = 1 - np.cumprod(a)
                over = np.nonzero(risk > threshold)[0]
                expected = gamma if over.size == 0 else over[0] + 1
                got = rule(
                    jnp.asarray(x, jnp.int32),
                    jnp.asarray(q, jnp.float32),
                    jnp.asarray(p, jnp.float32),
                )
                # Away from ties of the risk with the threshold (float32 products).
                if np.all(np.abs(risk - threshold) > 1e-5):
                    assert int(got) == expected, (predictor, threshold)
                    compared += 1
    assert compared > 150  # of 200: ties with the threshold are rare
    assert (
        int(
            es.StopWhenUnlikely(0.0)(
                jnp.zeros(4, jnp.int32), jnp.full((4, 2), 0.5), jnp.full((5, 2), 0.5)
            )
        )
        == 1
    )


@pytest.mark.parametrize("batching", ["map", "vmap"])
def test_rows_verified_at_their_own_lengths(batching):
    """`Verifier.at_lengths` (one verification per row: a branch on its length) equals
    verifying each row alone as a chain of its length, and the base class's default
    (once per length), on both batching paths and for the block verifier, whose outcome
    depends on the whole chain."""
    from helpers import random_case

    batch, gamma, vocab = 12, 4, 7
    x, q, p, u, s = (jnp.asarray(a) for a in random_case(5, batch, gamma, vocab))
    lengths = jnp.asarray(np.arange(batch) % gamma + 1, jnp.int32)
    for verifier in (
        es.Verifier(batching=batching),
        es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter(), batching=batching),
    ):
        out = jax.jit(lambda *a, v=verifier: v.at_lengths(*a))(lengths, x, q, p, u, s)
        # The base class's default (once per length) agrees.
        default = eqx.filter_jit(es.AbstractVerifier.at_lengths)(
            verifier, lengths, x, q, p, u, s
        )
        for name in ("num_accepted", "tokens"):
            np.testing.assert_array_equal(out[name], default[name])
        row = eqx.filter_jit(verifier.row)  # one program per length, not op by op
        for b in range(batch):
            size = int(lengths[b])
            alone = row(x[b, :size], q[b, :size], p[b, : size + 1], u[b, :size], s[b])
            assert int(out["num_accepted"][b]) == int(alone["num_accepted"])
            expected = np.r_[np.asarray(alone["tokens"]), [-1] * (gamma - size)]
            np.testing.assert_array_equal(out["tokens"][b], expected)


def _run(gamma, draft_length, num_tokens=96):
    draft, target = es.demo.builtin_models()
    texts = es.demo.BUILTIN_PROMPTS[:8]
    prompts = np.zeros((8, max(map(len, texts))), np.int32)
    for row, text in enumerate(texts):
        prompts[row, : len(text)] = es.demo.encode(text)
    lengths = np.array([len(t) for t in texts])
    return es.speculative_decode(
        draft,
        target,
        prompts,
        lengths,
        num_tokens,
        jax.random.key(0),
        proposal=es.Chain(gamma, draft_length=draft_length),
    )


def test_full_length_and_variable_length_statistics():
    """A threshold of 1 drafts all G every step: the tokens of the fixed-length loop,
    bit for bit. A threshold between drafts fewer: fewer draft calls per token, the
    theory still equal to the measurement within the noise, and lengths under G."""
    fixed = _run(4, es.FixedDraftLength())
    always = _run(4, es.StopWhenUnlikely(1.0))
    np.testing.assert_array_equal(fixed.tokens, always.tokens)
    np.testing.assert_array_equal(fixed.drafted, always.drafted)
    assert int(np.asarray(fixed.drafted).sum()) == 4 * int(
        np.asarray(fixed.target_calls).sum()
    )
    stopped = _run(4, es.StopWhenUnlikely(0.5))
    steps = int(np.asarray(stopped.target_calls).sum())
    drafted = int(np.asarray(stopped.drafted).sum())
    assert (
        steps < drafted < 4 * steps
    )  # some steps drafted fewer than G, some more than 1
    assert stopped.draft_calls_per_token() < fixed.draft_calls_per_token()
    # The theory counts only the positions drafted: it still predicts the measurement.
    assert abs(stopped.tokens_per_call() - stopped.theoretical_tokens_per_call()) < 0.05


def test_draft_length_errors():
    with pytest.raises(ValueError, match=r"`threshold` must lie in \[0, 1\]"):
        es.StopWhenUnlikely(1.5)
    with pytest.raises(ValueError, match='`predictor`=...\\) must be "confidence"'):
        es.StopWhenUnlikely(0.5, "entropy")
    # A draft-length policy is a chain's (`Chain(draft_length=...)`): a tree's size is
    # its shape, so the two cannot be given together.
    with pytest.raises(TypeError, match=r"Chain\(`draft_length`=...\) must be an eqx"):
        es.Chain(4, draft_length=3)
