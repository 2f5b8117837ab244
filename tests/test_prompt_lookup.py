"""Prompt lookup and the trimmed target call: the lookup and its whole-chain proposal
against a Python reference on every position of a table of sequences, `Chain(trim=True)`
emitting exactly what the untrimmed chain emits, with the same keys, on a cached
transformer target, and the loop lossless with rows of every draft length, drafted one
token a call or proposed at once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_cached_models import _model_free_chi_square, _small_transformer

import eqx_specdec as es
from eqx_specdec._proposal.chain import packed_sizes, trimmed_widths


def _reference_match(tokens, position, max_ngram, min_ngram):
    """`(end, n)`: the latest earlier occurrence of the longest matching n-gram."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if position - n + 1 < 0:
            continue
        tail = tokens[position - n + 1 : position + 1]
        for end in range(position - 1, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == tail:
                return end, n
    return -1, 0


def _reference_lookup(tokens, position, max_ngram, min_ngram):
    """The token after the latest earlier occurrence of the longest matching n-gram."""
    end, n = _reference_match(tokens, position, max_ngram, min_ngram)
    return (tokens[end + 1], n) if n else (0, 0)


def _reference_propose(tokens, length, count, max_ngram, min_ngram):
    """The `count` tokens that followed the match, read on through the proposal itself
    where they reach the context's end."""
    context = list(tokens[:length])
    end, n = _reference_match(context, length - 1, max_ngram, min_ngram)
    if not n:
        return [0] * count, 0
    for k in range(count):
        context.append(context[end + 1 + k])
    return context[length:], count


@pytest.mark.parametrize(
    "tokens, max_ngram, min_ngram",
    [
        ([1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2], 3, 1),  # the latest of several matches
        ([5, 6, 7, 8, 9, 5, 6, 7, 1, 6, 7], 3, 2),  # a bigram beats the older trigram
        ([1, 1, 1, 1, 1, 1], 2, 1),  # overlapping occurrences
        ([3, 4, 5, 6, 7, 8], 3, 1),  # no match anywhere
        (list(np.random.default_rng(0).integers(0, 3, 40)), 4, 1),
    ],
)
def test_lookup_proposes_the_token_after_the_latest_longest_match(
    tokens, max_ngram, min_ngram
):
    draft = es.models.PromptLookupDraft(10, max_ngram, min_ngram)
    positions = jnp.arange(len(tokens), dtype=jnp.int32)
    # Scratch after each position must not be read: the row is padded with 9s.
    row = jnp.asarray(tokens + [9] * 5, jnp.int32)
    found = jax.jit(jax.vmap(draft.lookup, in_axes=(None, 0)))(row, positions)
    rows = jax.jit(draft)(row, positions)
    for position in range(len(tokens)):
        token, n = _reference_lookup(tokens, position, max_ngram, min_ngram)
        assert (int(found[0][position]), int(found[1][position])) == (token, n)
        expected = np.full(10, 0.1, np.float32) if n == 0 else np.eye(10)[token]
        np.testing.assert_allclose(rows[position], expected, rtol=1e-6)
    # The whole chain after each context at once, for G = 5.
    lengths = jnp.arange(1, len(tokens) + 1, dtype=jnp.int32)
    proposed, drafted = jax.jit(jax.vmap(lambda n: draft.propose(row, n, 5)))(lengths)
    for length in range(1, len(tokens) + 1):
        chain, count = _reference_propose(tokens, length, 5, max_ngram, min_ngram)
        assert list(np.asarray(proposed[length - 1])) == chain
        assert int(drafted[length - 1]) == count


def test_propose_drafting_needs_a_proposing_draft_and_its_own_lengths():
    with pytest.raises(ValueError, match="draft_length"):
        es.Chain(4, drafting="propose", draft_length=es.StopWhenUnlikely())
    target = _small_transformer(5)
    with pytest.raises(TypeError, match="draft_model"):
        es.speculative_decode(
            target,
            target,
            jnp.zeros((1, 3), jnp.int32),
            None,
            2,
            jax.random.key(0),
            proposal=es.Chain(2, drafting="propose"),
            outputs="logits",
        )


def test_trim_needs_a_policy_that_stops_without_the_target():
    with pytest.raises(ValueError, match="trim"):
        es.Chain(4, trim=True)
    with pytest.raises(ValueError, match="trim"):
        es.Chain(4, draft_length=es.StopWhenUnlikely(predictor="oracle"), trim=True)


def test_a_trimmed_target_call_emits_what_the_full_one_does():
    """A prompt-lookup draft on repetitive prompts (rows draft between 0 and G tokens:
    the crossing token is not kept, so some steps call the target on one position) and
    a cached transformer target (packed: the wide steps call it on the rows' drafted
    tokens alone): the tokens, the accepted-length histograms and the
    draft counts are identical, and the trimmed run scores no more positions. Rows
    that have finished draft nothing: with seven rows done after one step, the last
    row's tokens and scored positions are those of the row decoded alone (a finished
    row's repetitive context would otherwise keep drafting and widen every later
    target call)."""
    vocab, gamma = 5, 6
    target = _small_transformer(vocab, context=64)
    rng = np.random.default_rng(3)
    prompts = jnp.asarray(np.tile(rng.integers(0, vocab, (8, 4)), (1, 4)), jnp.int32)

    keys = jax.random.split(jax.random.key(0), 8)  # one per row

    def decode(trim, rows=slice(None), max_lengths=None):
        return es.speculative_decode(
            es.models.PromptLookupDraft(vocab),
            target,
            prompts[rows],
            None,
            24,
            keys[rows],
            proposal=es.Chain(
                gamma,
                draft_length=es.StopWhenUnlikely(keep_crossing=False),
                trim=trim,
            ),
            outputs=("probs", "logits"),
            max_lengths=max_lengths,
            logprobs=True,
        )

    results = [decode(trim) for trim in (False, True)]
    assert trimmed_widths(gamma) == (1, 7)
    # The transformer is packed: where rows drafted, the trimmed run scored their
    # tokens in calls of 28 or 56 rather than 8 rows of seven slots.
    assert packed_sizes(target, 8, gamma) == (28, 56)
    for field in ("tokens", "accepted_histogram", "drafted", "target_calls"):
        np.testing.assert_array_equal(
            getattr(results[0], field), getattr(results[1], field)
        )
    np.testing.assert_allclose(results[0].logprobs, results[1].logprobs, rtol=1e-5)
    assert len(np.unique(np.asarray(results[0].accepted_histogram).nonzero()[1])) > 2
    calls = np.asarray(results[0].target_calls)
    np.testing.assert_array_equal(results[0].scored_tokens, 8 * (gamma + 1) * calls)
    # The packed run's longest row ran every step; each step's call held every running
    # row's drafted tokens and last committed one, and fewer than the padded calls.
    longest = int(np.argmax(calls))
    scored = int(results[1].scored_tokens[longest])
    needed = int(np.sum(results[1].drafted) + np.sum(calls))
    assert needed <= scored < 8 * (gamma + 1) * calls[longest]

    limits = jnp.asarray([1] * 7 + [24], jnp.int32)
    done_early = decode(True, max_lengths=limits)
    alone = decode(True, slice(7, None))
    np.testing.assert_array_equal(done_early.target_calls[:7], 1)
    for field in ("tokens", "target_calls", "drafted"):
        np.testing.assert_array_equal(
            getattr(done_early, field)[7:], getattr(alone, field)
        )
    # Alone (one row: no packing), a step scores G + 1 tokens where the row drafted and
    # one otherwise, and some steps scored one.
    calls, steps = int(alone.target_calls[0]), int(alone.drafting_steps[0])
    assert int(alone.scored_tokens[0]) == calls + gamma * steps < (gamma + 1) * calls
    # The one-position steps emit what the full call emits, log-probabilities included.
    np.testing.assert_array_equal(alone.tokens, results[0].tokens[7:])
    np.testing.assert_allclose(alone.logprobs, results[0].logprobs[7:], rtol=1e-5)


STOP_BEFORE_MISS = es.Chain(
    2, draft_length=es.StopWhenUnlikely(keep_crossing=False), trim=True
)


@pytest.mark.parametrize(
    "verifier, proposal",
    [
        (es.Verifier(), STOP_BEFORE_MISS),
        (es.Verifier(residual_sampler=es.GumbelSampler()), STOP_BEFORE_MISS),
        (es.Verifier(), es.Chain(2, drafting="propose", trim=True)),
    ],
    ids=["standard", "key-driven sampler", "proposed at once"],
)
def test_rows_that_draft_nothing_keep_the_loop_lossless(verifier, proposal):
    """With `keep_crossing=False` a row whose lookup finds nothing drafts no token and
    takes a plain step (its token drawn from the target's first row): over the whole
    loop the emitted sequences follow the target's law exactly (chi-square over every
    sequence of 3 tokens, 12,000 rows), with rows of every draft length from 0 up. The
    same with the chain proposed at once (`drafting="propose"`: 0 or G tokens, one-hot
    drafts)."""
    # The first step finds no match (2 and (1, 2) occur nowhere earlier), later ones
    # often do.
    statistic, threshold, result = _model_free_chi_square(
        es.models.PromptLookupDraft(3, 2), [0, 1, 2], verifier, proposal
    )
    assert statistic < threshold
    # Drafts were accepted in later steps; every row's first step drafted nothing.
    assert np.asarray(result.accepted_histogram)[:, 1:].sum() > 0
    assert (np.asarray(result.drafting_steps) < np.asarray(result.target_calls)).all()
