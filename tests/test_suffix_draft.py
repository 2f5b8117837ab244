"""Suffix decoding as a chain (`eqx_specdec.models.SuffixDraft`): its proposal and its
rows as a model (the continuations' shares, from which a dynamic tree grows) against a
Python reference on a table of sequences and settings (the longest repeated suffix,
the latest occurrences, the continuations' votes and the path's probability, the
periodic read at the context's end, a corpus of earlier texts ranked after the
context), and the decoding loop with it: greedy decoding's
tokens exactly, and the sampled loop's law (chi-square over every sequence, with rows
that draft nothing, some and all) with a lossy control caught."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_cached_models import _model_free_chi_square, _small_transformer

import eqx_specdec as es


def _continuations(tokens, length, count, draft):
    """The continuations of the latest occurrences of the context's longest repeated
    suffix, in Python (`[]` when no suffix of `min_match` tokens repeats)."""
    context = list(tokens[:length])
    corpus = [] if draft.corpus is None else [int(t) for t in draft.corpus]

    def matched(text, end):
        m = 0
        while (
            m < draft.max_match
            and end - m >= 0
            and length - 1 - m >= 0
            and text[end - m] >= 0
            and text[end - m] == context[length - 1 - m]
        ):
            m += 1
        return m

    own = {end: matched(context, end) for end in range(length - 2, -1, -1)}
    other = {
        end: matched(corpus, end)
        for end in range(len(corpus) - 2, -1, -1)
        if corpus[end + 1] >= 0
    }
    longest = max([*own.values(), *other.values()], default=0)
    if longest < draft.min_match:
        return []
    continuations = [  # the context's occurrences first, each the latest first
        [context[end + 1 + d % (length - 1 - end)] for d in range(count)]
        for end in own
        if own[end] == longest
    ]
    continuations += [
        [corpus[end + 1 + d] if end + 1 + d < len(corpus) else -1 for d in range(count)]
        for end in other
        if other[end] == longest
    ]
    return continuations[: draft.occurrences]


def _reference(tokens, length, count, draft):
    """The proposal, in Python: see `SuffixDraft`."""
    continuations = _continuations(tokens, length, count, draft)
    if not continuations:
        return [0] * count, 0
    agreeing = list(range(len(continuations)))
    probability = np.float32(1)
    proposed = []
    for d in range(count):
        votes = [
            sum(continuations[o][d] == continuations[a][d] for a in agreeing)
            for o in agreeing
        ]
        best = agreeing[int(np.argmax(votes))]  # the first maximum: the latest
        probability = probability * np.float32(max(votes) / len(agreeing))
        if (
            probability < np.float32(draft.min_probability)
            or continuations[best][d] < 0
        ):
            break
        proposed.append(continuations[best][d])
        agreeing = [a for a in agreeing if continuations[a][d] == proposed[-1]]
    return proposed + [0] * (count - len(proposed)), len(proposed)


RANDOM = [int(t) for t in np.random.default_rng(0).integers(0, 3, 48)]


@pytest.mark.parametrize(
    "tokens, settings",
    [
        # (1, 2, 3) twice before: both continue with 4, then 9 against 8.
        ([1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3], dict(min_probability=0.5)),
        ([1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3], dict(min_probability=0.6)),
        ([5, 6, 7, 8, 9, 5, 6, 7, 1, 6, 7], dict(min_match=3)),  # no trigram repeats
        ([3, 4, 5, 6, 7, 8], dict()),  # nothing repeats
        ([1, 1, 1, 1, 1, 1], dict()),  # overlapping occurrences, read periodically
        (RANDOM, dict(occurrences=4, min_probability=0.3)),
        (RANDOM, dict(max_match=3, min_match=1, min_probability=0.9)),
        # Earlier answers: (6, 7) ends the first with 8 and runs into the second's -1.
        ([1, 6, 7, 2, 6, 7], dict(corpus=[3, 6, 7, 8, -1, 6, 7, -1, 6, 7, 9])),
        (RANDOM, dict(corpus=RANDOM[5:30] + [-1] + RANDOM[::-1], occurrences=8)),
    ],
)
def test_the_proposal_and_rows_are_the_reference_s(tokens, settings):
    if "corpus" in settings:
        settings = dict(settings, corpus=jnp.asarray(settings["corpus"], jnp.int32))
    draft = es.models.SuffixDraft(10, **settings)
    buffer = jnp.asarray(tokens + [0] * 8, jnp.int32)  # entries past the context
    propose = eqx.filter_jit(lambda b, n, count: draft.propose(b, n, count))
    for length in range(1, len(tokens) + 1):
        proposed, drafted = propose(buffer, jnp.int32(length), 4)
        want, count = _reference(tokens, length, 4, draft)
        assert int(drafted) == count, length
        np.testing.assert_array_equal(proposed, want)
    # As a model: each row the shares of the tokens that followed the occurrences.
    rows = eqx.filter_jit(draft)(buffer, jnp.arange(len(tokens), dtype=jnp.int32))
    for position in range(len(tokens)):
        seen = [c[0] for c in _continuations(tokens, position + 1, 1, draft)]
        seen = [t for t in seen if t >= 0]
        want = np.bincount(seen, minlength=10) / max(len(seen), 1) if seen else 0.1
        np.testing.assert_allclose(rows[position], np.broadcast_to(want, (10,)))
    # The corpus's latest text proposes 9, and its end stops the chain there.
    if tokens[:3] == [1, 6, 7]:
        proposed, drafted = propose(buffer, jnp.int32(3), 4)
        assert (int(drafted), int(proposed[0])) == (1, 9)
    # The example: 4 agreed on, then 8 (the latest) with probability 1/2, then its own.
    if tokens[:3] == [1, 2, 3]:
        expected = 4 if settings["min_probability"] == 0.5 else 1
        assert int(propose(buffer, jnp.int32(13), 4)[1]) == expected


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match=r"SuffixDraft\(`corpus`"):
        es.models.SuffixDraft(8, corpus=[1, 2, 3])
    with pytest.raises(ValueError, match=r"SuffixDraft\(`min_probability`"):
        es.models.SuffixDraft(8, min_probability=0)
    with pytest.raises(ValueError, match=r"SuffixDraft\(`min_match`"):
        es.models.SuffixDraft(8, max_match=2, min_match=3)


def test_greedy_decoding_s_tokens_exactly():
    """The greedy rule with suffix drafts emits plain greedy decoding's tokens."""
    vocab = 5
    target = _small_transformer(vocab)
    prompt = jnp.asarray([[0, 1, 2, 0, 1, 2], [4, 3, 4, 3, 4, 1]])
    greedy = es.Verifier(es.GreedyRatioTest(), residual_sampler=es.ArgmaxSampler())
    result = es.speculative_decode(
        es.models.SuffixDraft(vocab),
        target,
        prompt,
        None,
        6,
        jax.random.key(0),
        verifier=greedy,
        proposal=es.Chain(3, drafting="propose", trim=True),
        outputs=("probs", "logits"),
    )
    plain = es.autoregressive_decode(target, prompt, None, 6, outputs="logits")
    np.testing.assert_array_equal(result.tokens, plain)
    assert int(jnp.sum(result.accepted_histogram[:, 1:])) > 0  # drafts were accepted


@pytest.mark.parametrize("lossy", [False, True])
def test_the_sampled_loop_follows_the_target(lossy):
    """Every sequence of 3 tokens after the prompt, 12,000 rows (chi-square), the
    standard rule on the proposed chains (one-hot drafts; rows drafting 0 to 2 tokens);
    the lossy control, a sampler that does not fit the rule (row n's argmax rather
    than a draw from the residual), is caught."""
    verifier = es.Verifier()
    if lossy:
        verifier = es.Verifier(residual_sampler=es.ArgmaxSampler(), allow_mismatch=True)
    statistic, threshold, result = _model_free_chi_square(
        es.models.SuffixDraft(3, min_match=1, min_probability=0.4),
        [0, 1, 2, 0, 1],
        verifier,
        es.Chain(2, drafting="propose", trim=True),
    )
    assert (statistic >= threshold) == lossy
    assert np.asarray(result.accepted_histogram)[:, 1:].sum() > 0
