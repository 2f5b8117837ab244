"""Cached models in the decoding loops: the contract (no stale read, proven by a model
that would see one, with the control that makes the loop break it), the transformer's
cache against its uncached forward pass, the whole loop lossless with a cached
transformer target, and the errors."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_packed_call_scores_each_row_s_tokens

import eqx_specdec as es
from eqx_specdec._decoding.speedup import speedup_table, straightforward_decode
from eqx_specdec._proposal import chain as chain_module


class CachedNGram(es.models.AbstractCachedModel):
    """An n-gram model that reads its context from its own state (the token written at
    each position), not from the loop's buffer: it returns the stateless model's
    distributions exactly when every position it reads holds the committed token, and
    other distributions after a stale read."""

    ngram: es.demo.NGramModel

    def init_state(self, max_length):
        return jnp.full((max_length,), -1, jnp.int32)

    def __call__(self, tokens, positions, state):
        state = state.at[positions].set(tokens)
        return self.ngram(jnp.maximum(state, 0), positions), state


def _tiny_models(vocab=4, seed=0):
    """Two trigram models: each reads the two tokens before the position it predicts,
    so a stale entry at either is seen."""
    rng = np.random.default_rng(seed)
    target = np.maximum(rng.dirichlet(np.ones(vocab), (vocab**2,)), 0.05)
    draft = 0.5 * rng.dirichlet(np.ones(vocab), (vocab**2,)) + 0.5 / vocab
    return (
        es.demo.NGramModel(jnp.asarray(draft, jnp.float32), 3),
        es.demo.NGramModel(
            jnp.asarray(target / target.sum(-1, keepdims=True), jnp.float32), 3
        ),
    )


def _prompts(batch, vocab, seed=1):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, batch).astype(np.int32)  # prompts of 1 token included
    return rng.integers(0, vocab, (batch, 4)).astype(np.int32), lengths


@pytest.mark.parametrize(
    "proposal",
    [es.Chain(3), es.Chain(3, draft_length=es.StopWhenUnlikely(0.6))],
    ids=["G = 3", "drafts that stop"],
)
def test_cached_models_never_read_a_stale_entry(proposal):
    draft, target = _tiny_models()
    tokens, lengths = _prompts(64, 4)
    key = jax.random.key(0)
    stateless = es.speculative_decode(
        draft, target, tokens, lengths, 24, key, proposal=proposal
    )
    cached = es.speculative_decode(
        CachedNGram(draft),
        CachedNGram(target),
        tokens,
        lengths,
        24,
        key,
        proposal=proposal,
    )
    # Rows accepted every token they drafted (the case that needs the draft's
    # catch-up call): whole chains, or chains cut short by the policy.
    if proposal.draft_length.always_full:
        assert np.asarray(stateless.accepted_histogram)[:, -1].sum() > 0
    else:
        drafted, steps = np.asarray(stateless.drafted), stateless.target_calls
        assert drafted.sum() < 3 * np.asarray(steps).sum()
    np.testing.assert_array_equal(cached.tokens, stateless.tokens)
    np.testing.assert_array_equal(cached.drafted, stateless.drafted)
    plain = es.autoregressive_decode(target, tokens, lengths, 24, key)
    np.testing.assert_array_equal(
        es.autoregressive_decode(CachedNGram(target), tokens, lengths, 24, key), plain
    )


def test_the_stale_read_control_is_caught(monkeypatch):
    """Without the draft's catch-up (one committed position written per step instead of
    two), a draft token accepted at the end of a chain is never written to the draft's
    cache: the next step reads a stale entry, and the tokens differ."""
    monkeypatch.setattr(chain_module, "CATCH_UP", 1)
    draft, target = _tiny_models()
    tokens, lengths = _prompts(48, 4)  # a batch of its own: a program of its own
    key = jax.random.key(0)
    options = dict(proposal=es.Chain(3))
    stateless = es.speculative_decode(
        draft, target, tokens, lengths, 24, key, **options
    )
    cached = es.speculative_decode(
        CachedNGram(draft), CachedNGram(target), tokens, lengths, 24, key, **options
    )
    assert (np.asarray(cached.tokens) != np.asarray(stateless.tokens)).any()


def _small_transformer(vocab, seed=0, sharpness=4.0, context=16):
    model = es.demo.Transformer.init(
        jax.random.key(seed),
        vocab_size=vocab,
        dim=16,
        depth=2,
        heads=2,
        context=context,
    )
    # Sharper logits than at initialisation: distributions far from uniform.
    return eqx.tree_at(lambda m: m.embedding, model, sharpness * model.embedding)


def test_the_transformer_cache_agrees_with_its_uncached_forward_pass():
    model = _small_transformer(7)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 7, 14), jnp.int32)
    full = eqx.filter_jit(model.logits)(tokens)
    state = model.init_state(16)
    pieces = []
    call = eqx.filter_jit(model.__call__)  # as the loop calls it (not op by op)
    out, state = call(tokens[:5], jnp.arange(5), state)  # a prefill
    pieces.append(out)
    # Stale entries past the context, as rejected drafts leave them...
    _, state = call(jnp.asarray([3, 1, 4]), jnp.arange(5, 8), state)
    # ...overwritten by the calls that follow, one to three tokens each.
    for start, stop in [(5, 6), (6, 9), (9, 11), (11, 14)]:
        out, state = call(tokens[start:stop], jnp.arange(start, stop), state)
        pieces.append(out)
    np.testing.assert_allclose(jnp.concatenate(pieces), full, rtol=1e-5, atol=1e-5)


def test_a_packed_transformer_call_scores_each_row_s_tokens():
    assert_packed_call_scores_each_row_s_tokens(_small_transformer(7, context=32), 7)


def _transformer_sequence_probabilities(model, prompt, length, vocab, warp=None):
    """The cached transformer's own distribution of `length` tokens after the prompt
    (one token, or a list of them), by enumeration with its uncached forward pass; with
    a `warp`, its rows warped."""
    prompt = [int(t) for t in np.atleast_1d(prompt)]
    seqs = np.asarray(list(itertools.product(range(vocab), repeat=length)), np.int32)
    start = np.tile(np.asarray([prompt], np.int32), (len(seqs), 1))
    full = np.concatenate([start, seqs], 1)
    logits = jax.vmap(model.logits)(jnp.asarray(full[:, :-1]))
    log_probs = jax.nn.log_softmax(logits, -1) if warp is None else warp(logits)
    log_probs = np.asarray(log_probs, np.float64)
    picked = np.take_along_axis(log_probs[:, len(prompt) - 1 :], seqs[..., None], -1)
    return np.exp(picked[..., 0].sum(-1))


def _sequence_chi_square(tokens, target, prompt, vocab, warp=None):
    """The chi-square of the emitted sequences (the rows of `tokens`) against the cached
    transformer's law after `prompt` (see `_transformer_sequence_probabilities`):
    `(statistic, threshold, expected)`."""
    tokens = np.asarray(tokens)
    rows, length = tokens.shape
    codes = (tokens * vocab ** np.arange(length)[::-1]).sum(-1)
    counts = np.bincount(codes, minlength=vocab**length).astype(np.float64)
    expected = _transformer_sequence_probabilities(target, prompt, length, vocab, warp)
    estimate = es.evaluation.EmissionEstimate(
        counts[None], np.array([float(rows)]), rows
    )
    chi = estimate.chi_square(expected[None])
    return float(chi["statistic"][0]), float(chi["threshold"][0]), expected


def _model_free_chi_square(draft, prompt, verifier, proposal, vocab=3, rows=12_000):
    """A model-free `draft` (`outputs="probs"`) before the small cached transformer
    (`_small_transformer(vocab)`, logits), every row the same `prompt`, 3 tokens each:
    `_sequence_chi_square` of the emitted sequences, and the run's result."""
    target = _small_transformer(vocab)
    prompts = jnp.tile(jnp.asarray([prompt], jnp.int32), (rows, 1))
    result = es.speculative_decode(
        draft,
        target,
        prompts,
        None,
        3,
        jax.random.key(0),
        verifier=verifier,
        proposal=proposal,
        outputs=("probs", "logits"),
    )
    statistic, threshold, _ = _sequence_chi_square(result.tokens, target, prompt, vocab)
    return statistic, threshold, result


@pytest.mark.parametrize(
    "verifier, lossless, warp",
    [
        (es.Verifier(), True, None),
        (es.Verifier(es.BlockRatioTest(), es.LastSuccessCounter()), True, None),
        (es.Verifier(), True, es.Warp(0.8, top_k=2)),
        (es.Verifier(es.LenientRatioTest(0.3)), False, None),
    ],
    ids=["standard", "block", "warped target", "lossy control: lenience 0.3"],
)
def test_the_whole_loop_is_lossless_with_a_cached_transformer_target(
    verifier, lossless, warp
):
    """Against the target's law of three tokens, by enumeration; with a `Warped` target
    (top-k 2 of 3 tokens at temperature 0.8), against the warped law, where a token
    outside the top 2 makes the statistic infinite."""
    vocab, length, rows = 3, 3, 24_000
    draft, _ = _tiny_models(vocab)
    target = _small_transformer(vocab)
    model = target if warp is None else es.models.Warped(target, warp)
    prompt = jnp.full((rows, 1), 1, jnp.int32)
    result = es.speculative_decode(
        draft,
        model,
        prompt,
        None,
        length,
        jax.random.key(0),
        verifier=verifier,
        proposal=es.Chain(2),
        outputs=("probs", "logits"),
    )
    statistic, threshold, expected = _sequence_chi_square(
        result.tokens, target, 1, vocab, warp
    )
    if warp is not None:  # the warp removes a token of every row
        assert np.sum(expected == 0) >= vocab**length - 2**length
    if lossless:
        assert statistic < threshold
        assert np.asarray(result.accepted_histogram)[:, 1:].sum() > 0
    else:
        assert statistic > 3 * threshold


class WrongState(CachedNGram):
    def __call__(self, tokens, positions, state):
        out, state = super().__call__(tokens, positions, state)
        return out, state[:-1]


class NoState(CachedNGram):
    def __call__(self, tokens, positions, state):
        return super().__call__(tokens, positions, state)[0]


def test_bad_cached_models_are_named():
    draft, target = _tiny_models()
    tokens, lengths = _prompts(4, 4)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="`draft_model` must return a state of the"):
        es.speculative_decode(WrongState(draft), target, tokens, lengths, 4, key)
    with pytest.raises(ValueError, match=r"`target_model` is a cached model, so it"):
        es.speculative_decode(draft, NoState(target), tokens, lengths, 4, key)
    with pytest.raises(ValueError, match="The Transformer holds 16 positions, so "):
        es.speculative_decode(
            draft,
            _small_transformer(4),
            tokens,
            lengths,
            20,
            key,
            outputs=("probs", "logits"),
        )
    tree = es.TreeVerifier(es.IIDCandidates(), tree=(-1, 0))
    with pytest.raises(TypeError, match="`target_model` is a cached model .* Tree"):
        es.speculative_decode(
            draft, CachedNGram(target), tokens, lengths, 4, key, verifier=tree
        )
    with pytest.raises(ValueError, match="`outputs` must be"):
        es.speculative_decode(draft, target, tokens, lengths, 4, key, outputs=("x",))


def test_a_transformer_trains_on_the_builtin_text():
    corpus = es.demo.builtin_corpus()
    model, losses = es.demo.train_transformer(
        corpus,
        jax.random.key(0),
        vocab_size=len(es.demo.VOCABULARY),
        dim=32,
        depth=1,
        heads=2,
        context=32,
        steps=100,
        batch=16,
        window=32,
        learning_rate=1e-2,
    )
    # Below the entropy of the characters' frequencies: it learnt to read its context.
    frequencies = np.bincount(corpus) / corpus.size
    unigram = -np.sum(
        frequencies[frequencies > 0] * np.log(frequencies[frequencies > 0])
    )
    assert losses[-10:].mean() < unigram - 0.3
    assert isinstance(model, es.demo.Transformer)


def test_measure_speedup_reports_a_consistent_run():
    draft, _ = _tiny_models(vocab=4)
    target = _small_transformer(4, context=32)
    tokens, lengths = _prompts(2, 4)
    run = (draft, target, tokens, lengths, 12, jax.random.key(0))
    options = dict(proposal=es.Chain(3), outputs=("probs", "logits"))
    measured = es.evaluation.measure_speedup(*run, repeats=1, **options)
    result = es.speculative_decode(*run, **options)
    assert measured.tokens == 24 and measured.batch == 2
    assert measured.tokens_per_call == result.tokens_per_call()
    assert measured.steps == int(np.asarray(result.target_calls).max())
    assert measured.draft_calls_per_step == 3
    assert measured.speedup == measured.plain_seconds / measured.speculative_seconds
    # The cost model from its parts.
    step = 3 * measured.draft_call_seconds + measured.target_call_seconds
    expected = 12 * measured.plain_call_seconds / (measured.steps * step)
    np.testing.assert_allclose(measured.predicted_speedup, expected)
    # The loop's own work: a step's measured time less the calls the model counts.
    own = measured.speculative_seconds / measured.steps - step
    np.testing.assert_allclose(measured.loop_seconds_per_step, own)
    assert f"| {1e3 * own:.3f} (" in speedup_table({"2-gram": measured})
    # Every step called the target on G + 1 tokens a row: 2 rows of 4.
    assert measured.scored_tokens == 8 * measured.steps


def test_the_straightforward_baseline_decodes_what_plain_decoding_does():
    """The loop a user writes, which `measure_speedup` times beside the library's plain
    loop: greedily, the same tokens, on prompts of several lengths (padded)."""
    target = _small_transformer(4, context=32)
    tokens, lengths = _prompts(3, 4)
    key = jax.random.key(0)
    straightforward = straightforward_decode(
        target, jnp.asarray(tokens), jnp.asarray(lengths), key, 12, True
    )
    plain = es.autoregressive_decode(target, tokens, lengths, 12, outputs="logits")
    np.testing.assert_array_equal(straightforward, plain)


def test_measure_speedup_prices_a_trimmed_chain_s_narrow_steps():
    """With prompt lookup and a trimmed chain, the steps where the row drafted nothing
    called the target on one position: the cost model counts them as plain calls (one
    row: the steps less those that drafted)."""
    target = _small_transformer(4, context=40)
    tokens, _ = _prompts(1, 4)
    run = (es.models.PromptLookupDraft(4), target, tokens, None, 24, jax.random.key(0))
    options = dict(
        proposal=es.Chain(3, drafting="propose", trim=True),
        outputs=("probs", "logits"),
    )
    measured = es.evaluation.measure_speedup(*run, repeats=1, **options)
    result = es.speculative_decode(*run, **options)
    drafting = int(np.asarray(result.drafting_steps)[0])
    m = measured
    narrow = m.steps - drafting
    assert 0 < narrow < m.steps
    assert m.scored_tokens == 4 * drafting + narrow  # G + 1 tokens, or one
    calls = (
        m.steps * m.draft_calls_per_step * m.draft_call_seconds
        + drafting * m.target_call_seconds
        + narrow * m.plain_call_seconds
    )
    np.testing.assert_allclose(m.predicted_speedup, 24 * m.plain_call_seconds / calls)
    np.testing.assert_allclose(
        m.loop_seconds_per_step, (m.speculative_seconds - calls) / m.steps
    )


class Unnormalised(CachedNGram):
    """Returns its distributions times 1.5 from the step at which a row reaches
    position 6: a bad output only the checked mode sees."""

    def __call__(self, tokens, positions, state):
        out, state = super().__call__(tokens, positions, state)
        return jnp.where((positions >= 6)[:, None], 1.5 * out, out), state


def test_the_checked_mode_names_a_model_that_returns_non_distributions():
    draft, target = _tiny_models()
    tokens, lengths = _prompts(4, 4)
    key = jax.random.key(0)
    bad = CachedNGram(draft), Unnormalised(target)
    unchecked = es.speculative_decode(*bad, tokens, lengths, 8, key)  # trusted
    assert unchecked.tokens.shape == (4, 8)
    with pytest.raises(RuntimeError, match="`target_model` returned a distri"):
        es.speculative_decode(*bad, tokens, lengths, 8, key, check_models=True)
    good = es.speculative_decode(
        draft, target, tokens, lengths, 8, key, check_models=True
    )
    np.testing.assert_array_equal(
        good.tokens,
        es.speculative_decode(draft, target, tokens, lengths, 8, key).tokens,
    )


def test_warped_refuses_what_one_sequence_cannot_take():
    """Per-row parameters, penalties (they count a history the model does not see) and
    a per-row logit bias are refused, naming the field."""
    model = _small_transformer(4)
    cases = [
        (es.Warp(jnp.array([0.7, 1.0])), "`temperature` must be a scalar"),
        (es.Warp(top_p=jnp.array([0.9, 0.5])), "`top_p` must be a scalar"),
        (es.Warp(repetition_penalty=1.2), "history-dependent penalty"),
        (es.Warp(logit_bias=jnp.zeros((2, 4))), "`logit_bias` must have shape"),
    ]
    for warp, message in cases:
        with pytest.raises(ValueError, match=message):
            es.models.Warped(model, warp)
