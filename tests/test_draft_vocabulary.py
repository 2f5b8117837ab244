"""Serving inputs: a draft vocabulary mapped into the target's (EAGLE-3 `d2t`), and the
warps' logit bias and min-p checked like every other input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import accept_logits

import eqx_specdec


LOG_SPACE = eqx_specdec.Verifier()  # what the logits entry points run
# Draft ids 0..3 are target ids 0, 2, 3, 5 of a vocabulary of 6.
VOCAB = eqx_specdec.models.DraftVocabulary(jnp.asarray([0, 1, 1, 2], jnp.int32), 6)


def test_tokens_and_distributions_map_into_the_target_vocabulary():
    np.testing.assert_array_equal(VOCAB.target_ids(), [0, 2, 3, 5])
    tokens = VOCAB.tokens(jnp.asarray([[3, 0], [1, 4]], jnp.int32))
    np.testing.assert_array_equal(tokens, [[5, 0], [2, -1]])  # 4: not a draft id
    q = jnp.asarray([[0.1, 0.2, 0.3, 0.4]], jnp.float32)
    np.testing.assert_allclose(VOCAB.probs(q), [[0.1, 0, 0.2, 0.3, 0, 0.4]])
    logits = np.asarray(VOCAB.logits(jnp.log(q)))
    np.testing.assert_array_equal(np.isinf(logits), [[0, 1, 0, 0, 1, 0]])


def test_a_draft_id_outside_the_draft_vocabulary_is_an_error_not_a_token():
    x, q, p, u, s = eqx_specdec.example_inputs(batch=2, gamma=3, vocab=6)
    draft = jnp.asarray([[0, 1, 2], [3, 9, 0]], jnp.int32)  # 9 is no draft id
    with pytest.raises(RuntimeError, match="`draft_tokens` holds a token id outside"):
        eqx_specdec.speculative_accept(VOCAB.tokens(draft), None, p, u, s)


@pytest.mark.parametrize(
    "warp",
    [
        eqx_specdec.Warp(),
        eqx_specdec.Warp(
            0.8,
            top_k=4,
            min_p=0.05,
            logit_bias=jnp.asarray([0.3, 0.0, -jnp.inf, 1.0, 0.0, -0.5]),
        ),
    ],
)
def test_verification_through_the_map_is_lossless(warp):
    """Quadrature: draft tokens drawn from the draft's warped law, in its own vocabulary
    and mapped, emit the warped target exactly; the same warp (in target ids) on both
    sides, after the draft's logits are scattered."""
    rng = np.random.default_rng(0)
    target_logits = jnp.asarray(rng.normal(size=(1, 3, 6)) * 2, jnp.float32)
    draft_logits = jnp.asarray(rng.normal(size=(1, 2, 4)) * 2, jnp.float32)
    p = np.exp(np.asarray(warp(target_logits), np.float64))[0]
    q = np.exp(np.asarray(warp(VOCAB.logits(draft_logits)), np.float64))[0]
    assert np.all(q[:, [1, 4]] == 0)
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        LOG_SPACE, q, p, log_inputs=True
    )
    assert estimate.max_error(p) < 1e-6


def test_the_map_gives_the_tokens_of_dense_target_vocabulary_drafts():
    """speculative_accept_logits on mapped tokens and scattered logits equals the same
    call on drafts already in the target's vocabulary."""
    rng = np.random.default_rng(1)
    batch, gamma = 64, 3
    draft_logits = jnp.asarray(rng.normal(size=(batch, gamma, 4)), jnp.float32)
    target_logits = jnp.asarray(rng.normal(size=(batch, gamma + 1, 6)), jnp.float32)
    keys = jax.random.split(jax.random.key(0), 3)
    draft = jax.random.categorical(keys[0], draft_logits).astype(jnp.int32)
    u = jax.random.uniform(keys[1], (batch, gamma))
    s = jax.random.uniform(keys[2], (batch,))
    mapped = accept_logits(
        VOCAB.tokens(draft), VOCAB.logits(draft_logits), target_logits, u, s
    )
    dense_logits = np.full((batch, gamma, 6), -np.inf, np.float32)
    dense_logits[..., [0, 2, 3, 5]] = np.asarray(draft_logits)
    dense = accept_logits(
        jnp.asarray(np.array([0, 2, 3, 5])[np.asarray(draft)], jnp.int32),
        jnp.asarray(dense_logits),
        target_logits,
        u,
        s,
    )
    np.testing.assert_array_equal(mapped["tokens"], dense["tokens"])
    # Accepted draft tokens are always mapped draft ids, never ids the draft lacks.
    n = np.asarray(mapped["num_accepted"])
    accepted = np.asarray(mapped["tokens"])[np.arange(gamma + 1)[None] < n[:, None]]
    assert accepted.size > 0 and not np.isin(accepted, [1, 4]).any()


def test_bad_maps_and_warps_are_clear_errors():
    with pytest.raises(ValueError, match="same target id"):
        eqx_specdec.models.DraftVocabulary(jnp.asarray([0, 0, -1], jnp.int32), 6)
    with pytest.raises(ValueError, match=r"outside the target's vocabulary \[0, 6\)"):
        eqx_specdec.models.DraftVocabulary(jnp.asarray([0, 5], jnp.int32), 6)
    with pytest.raises(ValueError, match=r"outside the target's vocabulary \[0, 6\)"):
        eqx_specdec.models.DraftVocabulary(jnp.asarray([-1, 0], jnp.int32), 6)  # id -1
    with pytest.raises(ValueError, match=r"`min_p` must lie in \[0, 1\]"):
        eqx_specdec.Warp(min_p=1.5)
    x, q, p, u, s = eqx_specdec.example_inputs(batch=2, gamma=3, vocab=6)
    logits = jnp.log(p)
    with pytest.raises(
        ValueError, match=r"`logit_bias` must have shape \(V,\) = \(6,\)"
    ):
        accept_logits(
            x,
            jnp.log(q),
            logits,
            u,
            s,
            target_warp=eqx_specdec.Warp(logit_bias=jnp.zeros(5)),
        )
    banned = jnp.zeros((2, 6)).at[1].set(-jnp.inf)
    with pytest.raises(
        RuntimeError,
        match=r"`target_warp.logit_bias` bans every token of a distribution .* in row 1",
    ):
        accept_logits(
            x, jnp.log(q), logits, u, s, target_warp=eqx_specdec.Warp(logit_bias=banned)
        )
    with pytest.raises(
        RuntimeError,
        match=r"`draft_warp.logit_bias` holds a NaN or \+inf in row 0",
    ):
        accept_logits(
            x,
            jnp.log(q),
            logits,
            u,
            s,
            draft_warp=eqx_specdec.Warp(logit_bias=jnp.zeros(6).at[2].set(jnp.nan)),
        )


# Two tokenizers: the draft's ids 0..4 and the target's 0..5 share "a", "b" and "c".
DRAFT_STRINGS = ["a", "<s>", "c", "b", "zz"]
TARGET_STRINGS = ["b", "x", "a", "c", "y", "</s>"]
SHARED = eqx_specdec.models.SharedVocabulary.from_token_strings(
    DRAFT_STRINGS, TARGET_STRINGS
)


def test_the_shared_vocabulary_maps_equal_strings():
    np.testing.assert_array_equal(SHARED.draft_to_target, [2, -1, 3, 0, -1])
    assert SHARED.target_vocab == 6
    # normalise: tokenizers that spell a leading space differently.
    spaced = eqx_specdec.models.SharedVocabulary.from_token_strings(
        ["\u0120the", "a"], ["\u2581the", "b"], normalise=lambda t: t[-3:]
    )
    np.testing.assert_array_equal(spaced.draft_to_target, [0, -1])
    with pytest.raises(ValueError, match="The target vocabulary holds 'b' twice"):
        eqx_specdec.models.SharedVocabulary.from_token_strings(["a"], ["b", "b"])
    with pytest.raises(ValueError, match="share no token"):
        eqx_specdec.models.SharedVocabulary.from_token_strings(["a"], ["b"])
    with pytest.raises(ValueError, match=r"outside the target's vocabulary \[0, 6\)"):
        eqx_specdec.models.SharedVocabulary(jnp.asarray([-2, 0], jnp.int32), 6)
    with pytest.raises(ValueError, match="same target id"):
        eqx_specdec.models.SharedVocabulary(jnp.asarray([1, -1, 1], jnp.int32), 6)


def test_the_restricted_draft_is_one_law_in_both_vocabularies():
    """The draft's law restricted to the shared tokens, by probabilities or by logits,
    in its own vocabulary and scattered into the target's: the same renormalised law,
    zero off the map."""
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(2, 5)), jnp.float32)
    q = jax.nn.softmax(logits, -1)
    own = np.asarray(jax.nn.softmax(SHARED.restrict_logits(logits), -1))
    np.testing.assert_allclose(own, SHARED.restrict_probs(q), rtol=1e-6)
    assert np.all(own[:, [1, 4]] == 0)
    in_target = np.asarray(jax.nn.softmax(SHARED.logits(logits), -1))
    np.testing.assert_allclose(in_target, SHARED.probs(q), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(in_target[:, [2, 3, 0]], own[:, [0, 2, 3]], rtol=1e-6)
    assert np.all(in_target[:, [1, 4, 5]] == 0)


@pytest.mark.parametrize(
    "warp",
    [
        None,
        eqx_specdec.Warp(0.8, top_k=2, logit_bias=jnp.asarray([0.0, 0, 1, 0, 0, 0])),
    ],
)
def test_verification_over_the_shared_tokens_is_lossless(warp):
    """Quadrature: draft tokens drawn from the restricted draft and mapped emit the
    target exactly (its warped law, with the same warp on both sides)."""
    rng = np.random.default_rng(4)
    target_logits = jnp.asarray(rng.normal(size=(1, 3, 6)) * 2, jnp.float32)
    draft_logits = jnp.asarray(rng.normal(size=(1, 2, 5)) * 2, jnp.float32)
    warp = warp or eqx_specdec.Warp()
    p = np.exp(np.asarray(warp(target_logits), np.float64))[0]
    q = np.exp(np.asarray(warp(SHARED.logits(draft_logits)), np.float64))[0]
    assert np.all(q[:, [1, 4, 5]] == 0)
    estimate = eqx_specdec.evaluation.emission_by_quadrature(
        LOG_SPACE, q, p, log_inputs=True
    )
    assert estimate.max_error(p) < 1e-6


def test_a_draft_token_off_the_map_is_an_error_on_every_path():
    """Eagerly `tokens` raises a ValueError naming the token; traced, it maps to -1 and
    the verification's checks raise."""
    tokens = jnp.asarray([[0, 3], [2, 1]], jnp.int32)  # draft id 1 ("<s>") is off
    with pytest.raises(ValueError, match="draft id 1 at \\(1, 1\\)"):
        SHARED.tokens(tokens)
    np.testing.assert_array_equal(SHARED.tokens(tokens[:1]), [[2, 0]])
    x, q, p, u, s = eqx_specdec.example_inputs(batch=2, gamma=2, vocab=6)

    @jax.jit
    def mapped(tokens):
        return SHARED.tokens(tokens)

    np.testing.assert_array_equal(mapped(tokens), [[2, 0], [3, -1]])
    with pytest.raises(RuntimeError, match="`draft_tokens`"):
        eqx_specdec.speculative_accept(mapped(tokens), q, p, u, s)
